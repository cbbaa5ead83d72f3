// The reduction kernels of the collectives' GPU copy engine
// (reduce_kernels.cu), called by gpu_engine.cc. Internal to
// cxlrt/collectives/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cxlrt/collectives/types.h"

namespace cxlrt::collectives::cuda {

// Most sources of one reduction: the ranks of a communicator at most
// (cxlrt/collectives/communicator.cc refuses more than 1024).
inline constexpr int kMaxReduceSources = 1024;

// The arguments of a reduction kernel, passed by value. Calls of up to
// kSmallSources sources launch with a small copy; larger ones with all
// kMaxReduceSources pointers (8 KiB of parameters, which CUDA 12.1 and
// later take).
inline constexpr int kSmallSources = 32;
template <int kCapacity>
struct ReduceArgsOf {
  const void* srcs[kCapacity];  // GPU-addressable (GPU memory or mapped pool)
  int n;
  void* out;
  size_t count;
  int divisor;  // for avg
};
using ReduceArgs = ReduceArgsOf<kMaxReduceSources>;

// out = srcs[0] op ... op srcs[n-1], element by element, in rank order,
// with the CPU kernels' arithmetic (cxlrt/collectives/types.cc): integers wrap,
// 16-bit floats accumulate in fp32 and round once, avg divides the sum, min
// and max are std::min / std::max. So a GPU result is bit-identical to
// the CPU path's.
cudaError_t LaunchReduce(DataType t, RedOp op, const ReduceArgs& a, cudaStream_t stream);

}  // namespace cxlrt::collectives::cuda
