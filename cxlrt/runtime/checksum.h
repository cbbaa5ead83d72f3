// CRC-32C (Castagnoli), used for every checksummed record in the pool.
// Uses the SSE4.2 crc32 instruction from CPU level avx2 up (cxlrt/runtime/cpu_features.h),
// a table below. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlrt::runtime {

// CRC-32C of `n` bytes at `data`, continuing from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace cxlrt::runtime
