// AllReduce (one-shot and pipelined two-shot) and Reduce.
#include <algorithm>
#include <deque>
#include <vector>

#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {
namespace {

// One-shot: every rank posts its chunk and reduces every rank's chunk in
// rank order (so every rank gets the same bits). Chunks of the send buffer
// are posted in place when it lies in the pool and is not the receive
// buffer (a rank writes its result over its input while peers still read it
// otherwise).
absl::Status OneShot(Call& c, const uint8_t* in, uint8_t* out, size_t count, RedOp op) {
  const int n = c.nranks();
  const size_t bytes = count * c.es;
  const auto zc = in != out ? c.ZeroCopyAt(in, bytes) : std::nullopt;
  const size_t chunk = ChunkBytes(c, CollKind::kAllReduce, bytes, 1);
  const size_t chunks = Chunks(bytes, chunk);
  const uint64_t base = c.t.staged();
  Sources srcs(n);
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    return PostPieces(c, s, in + at, len, 0, 1, -1, zc ? std::optional(*zc + at) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    CXLRT_RETURN_IF_ERROR(PeerSources(c, s, in + at, 0, len, srcs));
    tickets.push_back(c.e.Reduce(c.type, op, out + at, srcs.data(), n, len / c.es, n));
    CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(chunks, c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

// Two-shot: per chunk, post A carries the chunk (in place when the send
// buffer lies in the pool) and each rank reduces its shard of it from every
// rank; post B carries the reduced shard, and each rank copies the others'.
// A rank's own shard never goes through the pool. Posts run in the order
// A0 A1 B0 A2 B1 ... B(C-1): the copy-in of chunk c+1 and the reads of
// chunk c overlap, as do the all-gather of chunk c-1 and the reduction of
// chunk c. Post B always copies, even from a pool-resident receive buffer:
// a peer reading lines this core has just written pulls them out of its
// cache, which measured slower than reading them from memory after
// non-temporal stores.
//
// The reduction of A(c) is not waited for where it is submitted: the
// pipeline goes on to B(c-1)'s reads (a GPU's copies and kernel run
// meanwhile), B(c) is posted once the reduction has completed, and A(c) is
// marked read only then (a reduction reads the peers' posts until it
// completes), in post order. With a CPU engine, whose reductions complete
// as they are submitted, this is the plain order.
absl::Status TwoShot(Call& c, const uint8_t* in, uint8_t* out, size_t count, RedOp op) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto zc = in != out ? c.ZeroCopyAt(in, count * es) : std::nullopt;
  const size_t chunk_elems = ChunkBytes(c, CollKind::kAllReduce, count * es, 1) / es;
  const size_t chunks = Chunks(count, chunk_elems);
  // Item k of the stream: A(c) or B(c), in posting order.
  struct Item {
    bool b;
    size_t chunk;
  };
  std::vector<Item> items;
  for (size_t k = 0; k < chunks; ++k) {
    items.push_back({false, k});
    if (k > 0) items.push_back({true, k - 1});
  }
  items.push_back({true, chunks - 1});
  const uint64_t base = c.t.staged();
  Sources srcs(n);
  Tickets tickets;
  std::vector<bool> reduced(chunks, false);  // A(c) consumed: its reduction submitted
  std::vector<CopyEngine::Ticket> reduction(chunks, 0);
  size_t consumed = 0;  // items consumed so far
  // Posts consumed but not yet marked read: (post, the ticket still reading it).
  std::deque<std::pair<uint64_t, CopyEngine::Ticket>> unread;
  auto mark_read = [&](bool wait) -> absl::Status {
    for (; !unread.empty(); unread.pop_front()) {
      auto [s, t] = unread.front();
      if (!c.e.Poll(t)) {
        if (!wait) break;
        Tickets one = {t};
        CXLRT_RETURN_IF_ERROR(WaitAll(c, one));
      }
      c.t.Done(s);
    }
    return absl::OkStatus();
  };
  auto shard = [&](size_t k, int j) {  // [lo, hi) of rank j's shard of chunk k
    const size_t first = k * chunk_elems, m = std::min(chunk_elems, count - first);
    return std::pair<size_t, size_t>{first + m * j / n, first + m * (j + 1) / n};
  };
  auto post = [&](size_t i) -> absl::Status {
    const Item it = items[i];
    const size_t first = it.chunk * chunk_elems, m = std::min(chunk_elems, count - first);
    const auto [lo, hi] = shard(it.chunk, r);
    // Stage may wait for the peers to read our post s - depth, and they may
    // be waiting for our read marks: none is held back past here. (A post
    // follows the reduction it could wait for: B(c) is ready once A(c)'s
    // has completed, and every later post comes after B(c).)
    CXLRT_RETURN_IF_ERROR(mark_read(/*wait=*/true));
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    if (it.b) {
      // The reduced shard, once the reduction that writes it has run.
      Tickets one = {reduction[it.chunk]};
      CXLRT_RETURN_IF_ERROR(WaitAll(c, one));
      return PostPieces(c, s, out + lo * es, (hi - lo) * es, 0, 1, -1, std::nullopt);
    }
    if (zc) return c.t.Publish(s, {*zc + first * es, m * es, 0, 1}, /*in_place=*/true, {});
    if (m * es <= kInlineBytes) return PostPieces(c, s, in + first * es, m * es, 0, 1, -1, {});
    // Peers read every shard but ours: ours stays out of the pool.
    const PoolOffset slot = c.t.SlotOf(s);
    std::vector<CopyEngine::Ticket> after;
    for (auto [from, to] : {std::pair{first, lo}, std::pair{hi, first + m}}) {
      if (to > from) {
        if (auto k = c.e.ToPool(slot + (from - first) * es, in + from * es, (to - from) * es)) {
          after.push_back(k);
        }
      }
    }
    return c.t.Publish(s, {slot, m * es, 0, 1}, /*in_place=*/false, std::move(after));
  };
  auto consume = [&](size_t i) -> absl::Status {
    const Item it = items[i];
    const uint64_t s = base + 1 + i;
    const size_t first = it.chunk * chunk_elems;
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    if (!it.b) {
      const auto [lo, hi] = shard(it.chunk, r);
      CXLRT_RETURN_IF_ERROR(
          PeerSources(c, s, in + lo * es, (lo - first) * es, (hi - lo) * es, srcs));
      reduction[it.chunk] = c.e.Reduce(c.type, op, out + lo * es, srcs.data(), n, hi - lo, n);
      reduced[it.chunk] = true;
      unread.emplace_back(s, reduction[it.chunk]);
    } else {
      for (int j = 0; j < n; ++j) {
        const auto [jlo, jhi] = shard(it.chunk, j);
        if (j == r || jhi == jlo) continue;
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, c.t.PeerBytes(j, s, 0, (jhi - jlo) * es));
        tickets.push_back(c.e.FromPool(out + jlo * es, peer, (jhi - jlo) * es));
      }
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
      unread.emplace_back(s, 0);
    }
    consumed = i + 1;
    // B's reads are done; an A still reduces only if it is the newest post.
    return mark_read(/*wait=*/it.b);
  };
  // B(c) is posted once A(c)'s reduction completed, or once every item
  // before it was consumed (its post then waits for the reduction): one
  // chunk runs A0 B0.
  CXLRT_RETURN_IF_ERROR(RunPipeline(items.size(), c.ahead(), post, consume, [&](size_t i) {
    const Item it = items[i];
    return !it.b || (reduced[it.chunk] && (consumed == i || c.e.Poll(reduction[it.chunk])));
  }));
  CXLRT_RETURN_IF_ERROR(mark_read(/*wait=*/true));
  // Every peer posted B(C-1) after its reduction had read our A(C-1): the
  // send buffer is ours again without a further wait.
  return c.t.EndCall(false);
}

}  // namespace

absl::Status AllReduce(Call& c, const void* send, void* recv, size_t count, RedOp op) {
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (count * c.es <= c.oneshot_max || c.nranks() == 1) return OneShot(c, in, out, count, op);
  return TwoShot(c, in, out, count, op);
}

// Non-roots post their chunks (in place when in the pool), the root posts
// nothing and reduces.
absl::Status Reduce(Call& c, const void* send, void* recv, size_t count, RedOp op, int root) {
  const int n = c.nranks(), r = c.rank();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = count * c.es;
  const auto zc = r != root ? c.ZeroCopyAt(in, bytes) : std::nullopt;
  const size_t chunk = ChunkBytes(c, CollKind::kReduce, bytes, 1);
  const uint64_t base = c.t.staged();
  Sources srcs(n);
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    if (r == root) return PostEmpty(c, s);
    return PostPieces(c, s, in + at, len, 0, 1, -1, zc ? std::optional(*zc + at) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    if (r == root) {
      c.SeeOwnStores(in + at, len);
      CXLRT_RETURN_IF_ERROR(PeerSources(c, s, in + at, 0, len, srcs));
      tickets.push_back(c.e.Reduce(c.type, op, out + at, srcs.data(), n, len / c.es, n));
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    }
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(bytes, chunk), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

}  // namespace cxlrt::collectives::algorithms
