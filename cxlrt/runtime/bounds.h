// Overflow-safe checks of offsets and lengths read from the pool. Every
// offset + length that comes from pool bytes goes through these, never
// through a plain `off + len <= size` (which a hostile value wraps).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace cxlrt::runtime {

// True when [off, off+len) lies inside [lo, hi).
constexpr bool RangeWithin(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi) {
  return lo <= off && off <= hi && len <= hi - off;
}

// `off + count * each` in *end; false (and *end untouched) on overflow.
inline bool TableEnd(uint64_t off, uint64_t count, uint64_t each, uint64_t* end) {
  uint64_t bytes, e;
  if (__builtin_mul_overflow(count, each, &bytes) || __builtin_add_overflow(off, bytes, &e)) {
    return false;
  }
  *end = e;
  return true;
}

}  // namespace cxlrt::runtime
