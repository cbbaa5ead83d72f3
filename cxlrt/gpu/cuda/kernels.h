// The CUDA kernels of the gpu/ layer (kernels.cu): copies between
// GPU-addressable buffers, batches of scattered buffers, and one-thread
// doorbell waits and rings. Internal to cxlrt's CUDA sources; not installed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cxlrt::gpu::cuda {

// Copies n bytes between GPU-addressable buffers (GPU memory or the
// mapped pool) with a kernel: 16 bytes per thread when both allow it.
cudaError_t LaunchCopy(void* dst, const void* src, size_t n, cudaStream_t stream);

// Copies of a batch of scattered buffers in one launch, a block per item
// (KV pages): each dst[i] <- src[i] of size[i] bytes, GPU-addressable
// (GPU memory or the mapped pool). At most kMaxGatherItems per launch.
inline constexpr int kMaxGatherItems = 512;
struct GatherArgs {
  void* dst[kMaxGatherItems];
  const void* src[kMaxGatherItems];
  uint32_t size[kMaxGatherItems];
  int count;
};
cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream);

// A one-thread kernel that returns once *word >= value (page-locked host
// memory or the mapped pool: the proxy's done word of
// DmaEngine::WaitDoneOn, a doorbell of `cxlrt bench doorbell`), sleeping
// `poll_ns` between loads (0: spins).
cudaError_t LaunchWaitWord(const uint64_t* word, uint64_t value, cudaStream_t stream,
                           unsigned poll_ns = 1000);

// A one-thread kernel that stores `value` to *word (a doorbell in the
// mapped pool) after a system-scope fence, so that a reader that sees the
// value sees the stream's earlier writes (CUDA orders the kernel after
// them).
cudaError_t LaunchRingWord(uint64_t* word, uint64_t value, cudaStream_t stream);

}  // namespace cxlrt::gpu::cuda
