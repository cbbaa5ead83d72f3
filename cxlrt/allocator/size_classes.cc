#include "cxlrt/allocator/size_classes.h"

#include <array>

namespace cxlrt::allocator {

std::optional<uint32_t> ClassFor(uint64_t size, uint64_t alignment) {
  if (size > kMaxSmallSize) return std::nullopt;
  if (alignment <= 64) return PlainClassFor(size);
  for (uint32_t c = PlainClassFor(size); c < kNumClasses; ++c) {
    const uint64_t s = kClassSizes[c];
    // Blocks sit at segment + 64 KiB + i * s: aligned to `alignment` when s
    // is a power of two at least that large (and alignment <= 64 KiB).
    if ((s & (s - 1)) == 0 && s >= alignment && alignment <= kSegmentHeaderSize) return c;
  }
  return std::nullopt;
}

}  // namespace cxlrt::allocator
