// The CUDA kernels of the gpu/ layer (kernels.h): copies through the
// mapped pool, batches of scattered buffers, and one-thread doorbell waits
// and rings.
#include <algorithm>

#include "cxlrt/gpu/cuda/kernels.h"

namespace cxlrt::gpu::cuda {
namespace {

__global__ void CopyKernel(uint8_t* dst, const uint8_t* src, size_t n, bool vec) {
  const size_t tid = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t units = n / 16;
    for (size_t u = tid; u < units; u += stride) {
      reinterpret_cast<uint4*>(dst)[u] = reinterpret_cast<const uint4*>(src)[u];
    }
    done = units * 16;
  }
  for (size_t i = done + tid; i < n; i += stride) dst[i] = src[i];
}

// Block b copies item b; its threads move 16 bytes each when both ends
// allow it.
__global__ void GatherKernel(GatherArgs a) {
  const int b = blockIdx.x;
  auto* dst = static_cast<uint8_t*>(a.dst[b]);
  const auto* src = static_cast<const uint8_t*>(a.src[b]);
  const size_t n = a.size[b];
  size_t done = 0;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0) {
    for (size_t u = threadIdx.x; u < n / 16; u += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[u] = reinterpret_cast<const uint4*>(src)[u];
    }
    done = n / 16 * 16;
  }
  for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

__global__ void WaitWordKernel(const volatile uint64_t* word, uint64_t value, unsigned poll_ns) {
  while (*word < value) {
    if (poll_ns != 0) __nanosleep(poll_ns);
  }
}

__global__ void RingWordKernel(volatile uint64_t* word, uint64_t value) {
  __threadfence_system();
  *word = value;
  __threadfence_system();
}
}  // namespace

cudaError_t LaunchCopy(void* dst, const void* src, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0;
  const size_t units = vec ? n / 16 + 1 : n;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((units + 255) / 256, 1024));
  CopyKernel<<<blocks, 256, 0, stream>>>(static_cast<uint8_t*>(dst),
                                         static_cast<const uint8_t*>(src), n, vec);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream) {
  if (a.count <= 0) return cudaSuccess;
  GatherKernel<<<a.count, 512, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchWaitWord(const uint64_t* word, uint64_t value, cudaStream_t stream,
                           unsigned poll_ns) {
  WaitWordKernel<<<1, 1, 0, stream>>>(word, value, poll_ns);
  return cudaGetLastError();
}

cudaError_t LaunchRingWord(uint64_t* word, uint64_t value, cudaStream_t stream) {
  RingWordKernel<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

}  // namespace cxlrt::gpu::cuda
