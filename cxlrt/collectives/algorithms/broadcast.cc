// Broadcast and Scatter: the root streams chunks (in place when its send
// buffer lies in the pool), the others post nothing and copy each chunk
// out as it lands.
#include <algorithm>
#include <vector>

#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {

absl::Status Broadcast(Call& c, const void* send, void* recv, size_t count, int root) {
  const int r = c.rank();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = count * c.es;
  const auto zc = r == root ? c.ZeroCopyAt(in, bytes) : std::nullopt;
  const size_t chunk = ChunkBytes(c, CollKind::kBroadcast, bytes, 1);
  const uint64_t base = c.t.staged();
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    if (r != root) return PostEmpty(c, s);
    return PostPieces(c, s, in + at, len, 0, 1, -1, zc ? std::optional(*zc + at) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    if (len && r != root) {
      CXLRT_ASSIGN_OR_RETURN(const uint8_t* src, c.t.PeerBytes(root, s, 0, len));
      tickets.push_back(c.e.FromPool(out + at, src, len));
    } else if (len && out != in) {
      tickets.push_back(c.e.Copy(out + at, in + at, len));
    }
    CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(bytes, chunk), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

absl::Status Scatter(Call& c, const void* send, void* recv, size_t recvcount, int root) {
  const int n = c.nranks(), r = c.rank();
  const size_t es = c.es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const auto zc = r == root ? c.ZeroCopyAt(in, recvcount * n * es) : std::nullopt;
  const size_t per = ChunkBytes(c, CollKind::kScatter, recvcount * es, n) / es;
  const uint64_t base = c.t.staged();
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t first = i * per, m = std::min(per, recvcount - first);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    if (r != root) return PostEmpty(c, s);
    return PostPieces(c, s, in + first * es, m * es, recvcount * es, n, r,
                      zc ? std::optional(*zc + first * es) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t first = i * per, m = std::min(per, recvcount - first);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    uint8_t* dst = out + first * es;
    if (m && r != root) {
      CXLRT_ASSIGN_OR_RETURN(const uint8_t* src, c.t.PeerPiece(root, s, r, m * es));
      tickets.push_back(c.e.FromPool(dst, src, m * es));
    } else if (m && dst != in + (r * recvcount + first) * es) {
      tickets.push_back(c.e.Copy(dst, in + (r * recvcount + first) * es, m * es));
    }
    CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(recvcount, per), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

}  // namespace cxlrt::collectives::algorithms
