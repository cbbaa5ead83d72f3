#include "allocator/size_classes.h"

namespace cxlrt::allocator {

std::optional<uint32_t> ClassFor(uint64_t size, uint64_t alignment) {
  if (size > kMaxSmallSize) return std::nullopt;
  const bool plain = alignment <= 64;
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    const uint64_t s = kClassSizes[c];
    if (s < size) continue;
    if (plain) return c;
    // Blocks sit at segment + 64 KiB + i * s: aligned to `alignment` when s
    // is a power of two at least that large (and alignment <= 64 KiB).
    if ((s & (s - 1)) == 0 && s >= alignment && alignment <= kSegmentHeaderSize) return c;
  }
  return std::nullopt;
}

}  // namespace cxlrt::allocator
