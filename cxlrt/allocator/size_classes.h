// Size classes of the pooled allocator: multiples of 64 B from 64 B to
// 256 KiB, two per doubling (c and 1.5c), so internal waste stays under a
// third. Blocks of a class live in slab segments; blocks start 64 KiB into
// the segment, so a power-of-two class is aligned to min(class, 64 KiB).
// Thread-safe (constant tables).
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "cxlrt/allocator/allocator_layout.h"

namespace cxlrt::allocator {

inline constexpr uint32_t kClassSizes[kNumClasses] = {
    64,   128,  192,   256,   384,   512,   768,   1024,  1536,  2048,   3072,   4096,
    6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072, 196608, 262144};
inline constexpr uint64_t kMaxSmallSize = 262144;

// Blocks of class `c` in one slab segment (a table: no division on the
// fast paths).
inline constexpr std::array<uint32_t, kNumClasses> kSlabBlocks = [] {
  std::array<uint32_t, kNumClasses> n{};
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    n[c] = static_cast<uint32_t>((kSegmentSize - kSegmentHeaderSize) / kClassSizes[c]);
  }
  return n;
}();
constexpr uint32_t SlabBlocks(uint32_t c) { return kSlabBlocks[c]; }
static_assert(SlabBlocks(0) <= kMaxBitmapWords * 64);

namespace size_classes_internal {
// Class of every size in 64 B steps (index: (size + 63) / 64).
inline constexpr std::array<uint8_t, kMaxSmallSize / 64 + 1> kClassOf64 = [] {
  std::array<uint8_t, kMaxSmallSize / 64 + 1> t{};
  uint32_t c = 0;
  for (uint64_t i = 0; i < t.size(); ++i) {
    while (kClassSizes[c] < i * 64) ++c;
    t[i] = static_cast<uint8_t>(c);
  }
  return t;
}();
}  // namespace size_classes_internal

// The class of `size` bytes with the default alignment (64 B).
// REQUIRES: 0 < size <= kMaxSmallSize.
inline uint32_t PlainClassFor(uint64_t size) {
  return size_classes_internal::kClassOf64[(size + 63) / 64];
}

// The class of a block of `size` bytes aligned to `alignment` (a power of
// two >= 64), or nullopt when a slab cannot serve it.
// Invariant: kClassSizes[c] >= size, and the class's blocks are aligned to
// `alignment`.
std::optional<uint32_t> ClassFor(uint64_t size, uint64_t alignment);

}  // namespace cxlrt::allocator
