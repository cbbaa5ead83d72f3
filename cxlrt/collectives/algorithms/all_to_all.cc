// AllToAll: per chunk, every rank posts its n pieces (piece j bound for rank
// j; in place when the send buffer lies in the pool and is not the receive
// buffer, else packed into its slot without its own piece), and takes piece
// r from every peer.
//
// AllToAllV: a first post carries every rank's counts (its send and receive
// counts, 2n words), so every rank checks every pair and every rank cuts
// the same chunks: those of the largest piece any rank sends to another.
// Then, per chunk, every rank posts n pieces of the chunk's length (piece j
// holds its slice of what it sends to rank j, shorter or empty when that is
// shorter) and takes its slice from every peer's piece r.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {

absl::Status AllToAll(Call& c, const void* send, void* recv, size_t count) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // In place (send == recv), piece j of our buffer is overwritten by rank
  // j's piece while rank j may still read ours from it: copy through the slot.
  const auto zc = in != out ? c.ZeroCopyAt(in, count * n * es) : std::nullopt;
  const size_t per = ChunkBytes(c, CollKind::kAllToAll, count * es, n) / es;
  const uint64_t base = c.t.staged();
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t first = i * per, m = std::min(per, count - first);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    return PostPieces(c, s, in + first * es, m * es, count * es, n, r,
                      zc ? std::optional(*zc + first * es) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t first = i * per, m = std::min(per, count - first);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    if (m) {
      // In place, our own piece for us is already where it belongs.
      if (out != in) {
        tickets.push_back(
            c.e.Copy(out + (r * count + first) * es, in + (r * count + first) * es, m * es));
      }
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, c.t.PeerPiece(j, s, r, m * es));
        tickets.push_back(c.e.FromPool(out + (j * count + first) * es, peer, m * es));
      }
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    }
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(count, per), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

namespace {

// Elements of a piece of `count` elements that fall in the chunk [first, first + per).
size_t SliceOf(size_t count, size_t first, size_t per) {
  return count > first ? std::min(per, count - first) : 0;
}

}  // namespace

absl::Status AllToAllV(Call& c, const void* send, const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& send_displs, void* recv,
                       const std::vector<size_t>& recv_counts,
                       const std::vector<size_t>& recv_displs) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);

  // Round 1: the counts. Row i of `counts` is rank i's: send counts, then
  // receive counts.
  const size_t row = 2 * size_t(n), meta = row * sizeof(uint64_t);
  std::vector<uint64_t> counts(row * n);
  uint64_t* mine = &counts[row * r];
  for (int j = 0; j < n; ++j) {
    mine[j] = send_counts[j];
    mine[n + j] = recv_counts[j];
  }
  CXLRT_ASSIGN_OR_RETURN(const uint64_t s0, c.t.Stage());
  if (meta <= kInlineBytes) {
    CXLRT_RETURN_IF_ERROR(c.t.PublishInline(s0, mine, meta, 0));
  } else if (meta > c.t.slot_bytes()) {
    return c.t.Fail(absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " in ", c.t.Describe(c.t.desc()), ": the counts of ", n,
                     " ranks (", meta, " bytes) do not fit a slot of ", c.t.slot_bytes())));
  } else {
    // Written by this thread's stores and written back here: no engine copy.
    c.coherence.Publish(c.t.SlotOf(s0), mine, meta);
    CXLRT_RETURN_IF_ERROR(c.t.Publish(s0, {c.t.SlotOf(s0), meta, meta, 1}, /*in_place=*/false, {}));
  }
  CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s0));
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    CXLRT_ASSIGN_OR_RETURN(const uint8_t* p, c.t.PeerBytes(j, s0, 0, meta));
    std::memcpy(&counts[row * j], p, meta);
  }
  c.t.Done(s0);
  // Every rank checks every pair in the same order, so all report the same
  // first mismatch.
  size_t largest = 0;  // elements of the largest piece between two ranks
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const uint64_t sent = counts[row * i + j], expected = counts[row * j + n + i];
      if (sent != expected) {
        return c.t.Fail(absl::InvalidArgumentError(
            absl::StrCat("rank ", i, " called ", c.t.Describe(c.t.desc()), " sending ", sent,
                         " elements to rank ", j, " but rank ", j, " expects ", expected,
                         " from rank ", i, " (seen by rank ", r, ")")));
      }
      if (i != j) largest = std::max<size_t>(largest, sent);
    }
  }

  Tickets tickets;
  // Our own piece never goes through the pool.
  if (send_counts[r] > 0) {
    tickets.push_back(
        c.e.Copy(out + recv_displs[r] * es, in + send_displs[r] * es, send_counts[r] * es));
  }
  if (largest > 0) {
    const size_t per = ChunkBytes(c, CollKind::kAllToAll, largest * es, n) / es;
    const uint64_t base = c.t.staged();
    auto post = [&](size_t i) -> absl::Status {
      const size_t first = i * per, pl = std::min(per, largest - first) * es;
      CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
      if (pl * n <= kInlineBytes && c.e.host_buffers()) {
        uint8_t bytes[kInlineBytes] = {};
        for (int j = 0; j < n; ++j) {
          const size_t m = j == r ? 0 : SliceOf(send_counts[j], first, per);
          if (m) std::memcpy(bytes + j * pl, in + (send_displs[j] + first) * es, m * es);
        }
        return c.t.PublishInline(s, bytes, pl * n, pl);
      }
      const PoolOffset slot = c.t.SlotOf(s);
      std::vector<CopyEngine::Ticket> after;
      for (int j = 0; j < n; ++j) {
        const size_t m = j == r ? 0 : SliceOf(send_counts[j], first, per);
        if (m == 0) continue;
        if (CopyEngine::Ticket k =
                c.e.ToPool(slot + j * pl, in + (send_displs[j] + first) * es, m * es)) {
          after.push_back(k);
        }
      }
      return c.t.Publish(s, {slot, pl, pl, n}, /*in_place=*/false, std::move(after));
    };
    auto consume = [&](size_t i) -> absl::Status {
      const uint64_t s = base + 1 + i;
      const size_t first = i * per;
      CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
      for (int j = 0; j < n; ++j) {
        const size_t m = j == r ? 0 : SliceOf(recv_counts[j], first, per);
        if (m == 0) continue;
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, c.t.PeerPiece(j, s, r, m * es));
        tickets.push_back(c.e.FromPool(out + (recv_displs[j] + first) * es, peer, m * es));
      }
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
      c.t.Done(s);
      return absl::OkStatus();
    };
    CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(largest, per), c.ahead(), post, consume));
  }
  CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
  return c.t.EndCall(false);
}

}  // namespace cxlrt::collectives::algorithms
