#include "allocator/size_classes.h"

#include <array>

namespace cxlrt::allocator {
namespace {

// Class of every size in 64 B steps (index: (size + 63) / 64).
constexpr std::array<uint8_t, kMaxSmallSize / 64 + 1> kClassOf64 = [] {
  std::array<uint8_t, kMaxSmallSize / 64 + 1> t{};
  uint32_t c = 0;
  for (uint64_t i = 0; i < t.size(); ++i) {
    while (kClassSizes[c] < i * 64) ++c;
    t[i] = static_cast<uint8_t>(c);
  }
  return t;
}();

}  // namespace

std::optional<uint32_t> ClassFor(uint64_t size, uint64_t alignment) {
  if (size > kMaxSmallSize) return std::nullopt;
  if (alignment <= 64) return kClassOf64[(size + 63) / 64];
  for (uint32_t c = kClassOf64[(size + 63) / 64]; c < kNumClasses; ++c) {
    const uint64_t s = kClassSizes[c];
    // Blocks sit at segment + 64 KiB + i * s: aligned to `alignment` when s
    // is a power of two at least that large (and alignment <= 64 KiB).
    if ((s & (s - 1)) == 0 && s >= alignment && alignment <= kSegmentHeaderSize) return c;
  }
  return std::nullopt;
}

}  // namespace cxlrt::allocator
