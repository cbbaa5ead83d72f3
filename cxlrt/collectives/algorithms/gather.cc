// AllGather and Gather: every rank (every non-root) posts its chunk, in
// place when its send buffer lies in the pool; every rank (the root) copies
// each peer's chunk out as it lands.
#include <algorithm>
#include <vector>

#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {
namespace {

// root < 0: AllGather.
absl::Status Run(Call& c, CollKind kind, const void* send, void* recv, size_t sendcount, int root) {
  const int n = c.nranks(), r = c.rank();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = sendcount * c.es;
  const bool reads = root < 0 || r == root;  // this rank copies the others' chunks
  const bool posts = root < 0 || r != root;  // the others read this rank's chunk
  const auto zc = posts ? c.ZeroCopyAt(in, bytes) : std::nullopt;
  const size_t chunk = ChunkBytes(c, kind, bytes, 1);
  const uint64_t base = c.t.staged();
  Tickets tickets;
  auto post = [&](size_t i) -> absl::Status {
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
    if (!posts) return PostEmpty(c, s);
    return PostPieces(c, s, in + at, len, 0, 1, -1, zc ? std::optional(*zc + at) : std::nullopt);
  };
  auto consume = [&](size_t i) -> absl::Status {
    const uint64_t s = base + 1 + i;
    const size_t at = i * chunk, len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
    if (reads && len) {
      for (int j = 0; j < n; ++j) {
        uint8_t* dst = out + j * bytes + at;
        if (j == r) {
          // In place (send == recv + r * sendcount) needs no copy.
          if (!posts) c.SeeOwnStores(in + at, len);
          if (dst != in + at) tickets.push_back(c.e.Copy(dst, in + at, len));
          continue;
        }
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* src, c.t.PeerBytes(j, s, 0, len));
        tickets.push_back(c.e.FromPool(dst, src, len));
      }
      CXLRT_RETURN_IF_ERROR(WaitAll(c, tickets));
    }
    c.t.Done(s);
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(RunPipeline(Chunks(bytes, chunk), c.ahead(), post, consume));
  return c.t.EndCall(zc.has_value());
}

}  // namespace

absl::Status AllGather(Call& c, const void* send, void* recv, size_t sendcount) {
  return Run(c, CollKind::kAllGather, send, recv, sendcount, -1);
}

absl::Status Gather(Call& c, const void* send, void* recv, size_t sendcount, int root) {
  return Run(c, CollKind::kGather, send, recv, sendcount, root);
}

}  // namespace cxlrt::collectives::algorithms
