// AllToAll: per chunk, every rank posts its n pieces (piece j bound for rank
// j; in place when the send buffer lies in the pool and is not the receive
// buffer, else packed into its slot without its own piece), and takes piece
// r from every peer.
//
// AllToAllV: a first post carries every rank's counts (its send and receive
// counts, and where its pieces lie when it posts in place: 3n words), so
// every rank checks every pair and every rank cuts the same posts. A rank
// whose pieces lie in the pool posts them in place, all in the first data
// post (empty posts after it). A rank that sends through its slots streams
// its pieces back to back and posts a slot's worth of the stream per post;
// the call has the posts of the longest stream. Each rank takes its piece
// from every peer: whole from a post in place, else the slice of it that
// falls in each post of the peer's stream.
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

// Counts-row entry of a rank that sends through its slots (not in place).
constexpr uint64_t kThroughSlots = ~uint64_t{0};

}  // namespace

absl::Status AllToAllV(Call& c, const void* send, const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& send_displs, void* recv,
                       const std::vector<size_t>& recv_counts,
                       const std::vector<size_t>& recv_displs) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);

  // [lo, hi): the elements of `send` that hold our pieces for the peers.
  // When they lie in the pool they are posted in place, once: the
  // communicator refused a receive buffer that overlaps them.
  size_t lo = SIZE_MAX, hi = 0;
  for (int j = 0; j < n; ++j) {
    if (j == r || send_counts[j] == 0) continue;
    lo = std::min(lo, send_displs[j]);
    hi = std::max(hi, send_displs[j] + send_counts[j]);
  }
  const auto zc = lo < hi ? c.ZeroCopyAt(in + lo * es, (hi - lo) * es) : std::nullopt;

  // Round 1: the counts. Row i of `counts` is rank i's: send counts,
  // receive counts, then where each piece lies in its post in place
  // (elements from its start), or kThroughSlots in every entry.
  const size_t row = 3 * size_t(n), meta = row * sizeof(uint64_t);
  std::vector<uint64_t> counts(row * n);
  uint64_t* mine = &counts[row * r];
  for (int j = 0; j < n; ++j) {
    mine[j] = send_counts[j];
    mine[n + j] = recv_counts[j];
    mine[2 * n + j] = !zc ? kThroughSlots : send_counts[j] && j != r ? send_displs[j] - lo : 0;
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
  auto count = [&](int i, int j) -> uint64_t { return counts[row * i + j]; };
  auto in_place = [&](int i) { return counts[row * i + 2 * n] != kThroughSlots; };
  // Every rank checks every pair in the same order, so all report the same
  // first mismatch.
  size_t largest = 0;  // elements of the largest piece between two ranks
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const uint64_t sent = count(i, j), expected = counts[row * j + n + i];
      if (sent != expected) {
        return c.t.Fail(absl::InvalidArgumentError(
            absl::StrCat("rank ", i, " called ", c.t.Describe(c.t.desc()), " sending ", sent,
                         " elements to rank ", j, " but rank ", j, " expects ", expected,
                         " from rank ", i, " (seen by rank ", r, ")")));
      }
      if (i != j) largest = std::max<size_t>(largest, sent);
    }
  }

  // A rank that sends through its slots streams its pieces for the peers
  // back to back, in rank order, and posts `chunk` bytes of that stream
  // per post: the slot is filled whatever the skew, so the posts of a call
  // are those of the longest stream, not n x its largest piece (docs/
  // collectives.md, "All-to-all-v"). stream_at[i]: where rank i's piece for
  // us starts in its stream (bytes); ours[j]: where ours for rank j starts.
  std::vector<size_t> stream_at(n, 0), ours(n, 0);
  size_t longest = 0, mine_bytes = 0;  // the longest stream of any rank; ours
  for (int i = 0; i < n; ++i) {
    size_t at = 0;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      if (j == r) stream_at[i] = at;
      if (i == r) ours[j] = at;
      at += count(i, j) * es;
    }
    if (i == r) mine_bytes = at;
    if (!in_place(i)) longest = std::max(longest, at);
  }

  Tickets tickets;
  // Our own piece never goes through the pool. The simulated domain holds
  // stores to a pool-resident buffer in this host's cache until written back.
  if (send_counts[r] > 0) {
    c.SeeOwnStores(in + send_displs[r] * es, send_counts[r] * es);
    tickets.push_back(
        c.e.Copy(out + recv_displs[r] * es, in + send_displs[r] * es, send_counts[r] * es));
  }
  if (!zc && lo < hi) c.SeeOwnStores(in + lo * es, (hi - lo) * es);
  if (largest > 0) {
    // At least what the even all-to-all carries per post (n - 1 pieces of
    // its chunk), at most a slot; the same on every rank (the counts).
    size_t chunk = es, posts = 1;
    if (longest > 0) {
      chunk = std::max(ChunkBytes(c, CollKind::kAllToAll, longest, 1),
                       (n - 1) * ChunkBytes(c, CollKind::kAllToAll, largest * es, n));
      chunk = std::max<size_t>(std::min<size_t>(chunk, c.t.slot_bytes()) / es * es, es);
      posts = (longest + chunk - 1) / chunk;
    }
    const uint64_t base = c.t.staged();
    auto post = [&](size_t i) -> absl::Status {
      CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
      if (zc) {
        // Every piece in the first post; the buffer is the caller's again
        // once every peer has read it (EndCall).
        if (i > 0) return PostEmpty(c, s);
        const size_t len = (hi - lo) * es;
        return c.t.Publish(s, {*zc, len, len, 1}, /*in_place=*/true, {});
      }
      const size_t from = i * chunk, to = std::min(from + chunk, mine_bytes);
      if (from >= to) return PostEmpty(c, s);
      const size_t len = to - from;
      // Calls `f(at, src, m)` for the `m` bytes at `src` that go to byte `at` of the post.
      auto each = [&](auto&& f) {
        for (int j = 0; j < n; ++j) {
          if (j == r || send_counts[j] == 0) continue;
          const size_t a = std::max(from, ours[j]);
          const size_t b = std::min(to, ours[j] + send_counts[j] * es);
          if (a < b) f(a - from, in + send_displs[j] * es + (a - ours[j]), b - a);
        }
      };
      if (len <= kInlineBytes && c.e.host_buffers()) {
        uint8_t bytes[kInlineBytes];
        each([&](size_t at, const uint8_t* src, size_t m) { std::memcpy(bytes + at, src, m); });
        return c.t.PublishInline(s, bytes, len, 0);
      }
      const PoolOffset slot = c.t.SlotOf(s);
      std::vector<CopyEngine::Ticket> after;
      each([&](size_t at, const uint8_t* src, size_t m) {
        if (CopyEngine::Ticket k = c.e.ToPool(slot + at, src, m)) after.push_back(k);
      });
      return c.t.Publish(s, {slot, len, len, 1}, /*in_place=*/false, std::move(after));
    };
    auto consume = [&](size_t i) -> absl::Status {
      const uint64_t s = base + 1 + i;
      const size_t from = i * chunk, to = from + chunk;
      CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
      for (int j = 0; j < n; ++j) {
        const size_t bytes = recv_counts[j] * es;
        if (j == r || bytes == 0) continue;
        uint8_t* dst = out + recv_displs[j] * es;
        if (in_place(j)) {
          if (i > 0) continue;
          const size_t at = counts[row * j + 2 * n + r] * es;
          if (at / es != counts[row * j + 2 * n + r]) {
            return c.t.Fail(absl::DataLossError(absl::StrCat(
                "rank ", j, " in ", c.t.Describe(c.t.desc()), " posted its piece for rank ", r,
                " at element ", counts[row * j + 2 * n + r], ": outside the pool")));
          }
          CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, c.t.PeerBytes(j, s, at, bytes));
          tickets.push_back(c.e.FromPool(dst, peer, bytes));
          continue;
        }
        const size_t a = std::max(from, stream_at[j]), b = std::min(to, stream_at[j] + bytes);
        if (a >= b) continue;
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, c.t.PeerBytes(j, s, a - from, b - a));
        tickets.push_back(c.e.FromPool(dst + (a - stream_at[j]), peer, b - a));
      }
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
      c.t.Done(s);
      return absl::OkStatus();
    };
    CXLRT_RETURN_IF_ERROR(RunPipeline(posts, c.ahead(), post, consume));
  }
  CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
  return c.t.EndCall(zc.has_value());
}

}  // namespace cxlrt::collectives::algorithms
