#include "cxlrt/runtime/placement.h"

#include <algorithm>

namespace cxlrt::runtime {

std::pair<PoolOffset, PoolOffset> DeviceMap::Clip(uint32_t d, PoolOffset lo, PoolOffset hi) const {
  auto [begin, end] = Span(d);
  const PoolOffset a = std::max(lo, begin);
  const PoolOffset b = std::min(hi, end);
  if (a >= b) return {a, a};
  return {a, b};
}

std::vector<DeviceMap::Piece> DeviceMap::Split(PoolOffset off, uint64_t n) const {
  std::vector<Piece> pieces;
  while (n > 0) {
    const uint32_t d = DeviceOf(off);
    const uint64_t len = std::min(n, Span(d).second - off);
    pieces.push_back({d, off, len});
    off += len;
    n -= len;
  }
  return pieces;
}

}  // namespace cxlrt::runtime
