// The device kernels of the CUDA data path (kernels.cu), called by
// cuda_device.cc. Internal to cxlrt/collectives/cuda/.
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
  const void* srcs[kCapacity];  // device-addressable (device memory or mapped pool)
  int n;
  void* out;
  size_t count;
  int divisor;  // for avg
};
using ReduceArgs = ReduceArgsOf<kMaxReduceSources>;

// out = srcs[0] op ... op srcs[n-1], element by element, in rank order,
// with the CPU kernels' arithmetic (cxlrt/collectives/types.cc): integers wrap,
// 16-bit floats accumulate in fp32 and round once, avg divides the sum, min
// and max are std::min / std::max. So a device result is bit-identical to
// the CPU path's.
cudaError_t LaunchReduce(DataType t, RedOp op, const ReduceArgs& a, cudaStream_t stream);

// See FillPatternAsync (cxlrt/collectives/device.h).
cudaError_t LaunchFillPattern(uint32_t* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              cudaStream_t stream);

// Copies n bytes between device-addressable buffers (device memory or the
// mapped pool) with a kernel: 16 bytes per thread when both allow it.
cudaError_t LaunchCopy(void* dst, const void* src, size_t n, cudaStream_t stream);

// Copies of a batch of scattered buffers in one launch, a block per item
// (KV pages): each dst[i] <- src[i] of size[i] bytes, device-addressable
// (device memory or the mapped pool). At most kMaxGatherItems per launch.
inline constexpr int kMaxGatherItems = 512;
struct GatherArgs {
  void* dst[kMaxGatherItems];
  const void* src[kMaxGatherItems];
  uint32_t size[kMaxGatherItems];
  int count;
};
cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream);

// A one-thread kernel that returns once *word >= value (pinned host memory
// or the mapped pool: the proxy's done word of DeviceEngine::WaitDoneOn, a
// doorbell of TimePingPong), sleeping `poll_ns` between loads (0: spins).
cudaError_t LaunchWaitWord(const uint64_t* word, uint64_t value, cudaStream_t stream,
                           unsigned poll_ns = 1000);

// A one-thread kernel that stores `value` to *word (a doorbell in the
// mapped pool) after a system-scope fence, so that a reader that sees the
// value sees the stream's earlier writes (CUDA orders the kernel after
// them).
cudaError_t LaunchRingWord(uint64_t* word, uint64_t value, cudaStream_t stream);

}  // namespace cxlrt::collectives::cuda
