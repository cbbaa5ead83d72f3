// The reduction kernels of each CPU vector level behind collectives::Reduce
// (cxlrt/collectives/types.h), one table entry per level (cxlrt/runtime/cpu_features.h):
// Reduce takes the entry of ActiveCpuLevel() once; tests call every level
// this CPU supports. Not for other layers. Thread-safe: pure functions.
#pragma once

#include <cstddef>

#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/cpu_features.h"

namespace cxlrt::collectives_internal {

// Reduce's contract (cxlrt/collectives/types.h), compiled for one level.
using ReduceKernel = void (*)(collectives::DataType t, collectives::RedOp op, void* out,
                              const void* const* srcs, int n, size_t count, int avg_divisor);

// baseline: x86-64 (SSE2); avx2: x86-64-v3; avx512: x86-64-v4.
ReduceKernel ReduceKernelAt(runtime::CpuLevel level);

}  // namespace cxlrt::collectives_internal
