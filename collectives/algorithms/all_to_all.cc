// AllToAll: per chunk, every rank posts its n pieces (piece j bound for rank
// j; in place when the send buffer lies in the pool and is not the receive
// buffer, else packed into its slot without its own piece), and takes piece
// r from every peer.
#include <algorithm>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "runtime/status_macros.h"

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

}  // namespace cxlrt::collectives::algorithms
