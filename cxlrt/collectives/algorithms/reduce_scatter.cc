// ReduceScatter: per chunk, every rank posts its n pieces (piece j is rank
// j's part of the chunk; in place when the send buffer lies in the pool,
// else packed into its slot without its own piece) and reduces piece r from
// every rank.
#include <algorithm>
#include <vector>

#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {

absl::Status ReduceScatter(Call& c, const void* send, void* recv, size_t recvcount, RedOp op) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // In place (recv == send + r * recvcount) is safe too: this rank writes
  // only its own piece, which no peer reads.
  const auto zc = c.ZeroCopyAt(in, recvcount * n * es);
  const size_t per = ChunkBytes(c, CollKind::kReduceScatter, recvcount * es, n) / es;
  const uint64_t base = c.t.staged();
  Sources srcs(n);
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t first = i * per, m = std::min(per, recvcount - first);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    return PostPieces(c, s, in + first * es, m * es, recvcount * es, n, r,
                      zc ? std::optional(*zc + first * es) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t first = i * per, m = std::min(per, recvcount - first);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    for (int j = 0; j < n; ++j) {
      if (j == r) {
        srcs[j] = in + (r * recvcount + first) * es;
      } else {
        CXLRT_ASSIGN_OR_RETURN(srcs[j], c.t.PeerPiece(j, s, r, m * es));
      }
    }
    tickets.push_back(c.e.Reduce(c.type, op, out + first * es, srcs.data(), n, m, n));
    CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(recvcount, per), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

}  // namespace cxlrt::collectives::algorithms
