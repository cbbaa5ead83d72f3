// The kernels of each CPU vector level behind runtime's CopyBytes and
// Crc32c, one table entry per level (cxlrt/runtime/cpu_features.h). The
// dispatchers take the entry of ActiveCpuLevel() once; tests call every
// level this CPU supports. Not for other layers. Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlrt/runtime/cpu_features.h"

namespace cxlrt::runtime_internal {

// Copies `n` bytes (any n, any alignment). REQUIRES: no overlap.
using CopyKernel = void (*)(void* dst, const void* src, size_t n);

// Folds `n` bytes into a CRC-32C register and returns it; the register is
// the inverted CRC (Crc32c inverts before and after).
using Crc32cKernel = uint32_t (*)(const void* data, size_t n, uint32_t reg);

// The copy for `level`: baseline SSE2, AVX2 at avx2 and avx512 (256-bit
// stores already saturate a core's store bandwidth here).
CopyKernel CopyKernelAt(runtime::CpuLevel level);

// The CRC-32C for `level`: a table at baseline (x86-64 v1 has no crc32
// instruction), SSE4.2's crc32 from avx2 up (x86-64-v3 includes it).
Crc32cKernel Crc32cKernelAt(runtime::CpuLevel level);

}  // namespace cxlrt::runtime_internal
