// tests/testing/mem_buffer.h with CUDA: the pattern fill kernel.
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cxlrt/gpu/gpu.h"
#include "tests/testing/mem_buffer.h"

namespace cxlrt::testing {
namespace {

__device__ uint32_t PatternWordDevice(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32 | seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x >> 32);
}

__global__ void FillKernel(uint32_t* p, size_t n, uint32_t seed, uint32_t delay_us) {
  if (delay_us) {
    // Every block waits, so no word is written before the delay ends.
    const uint64_t until = clock64() + uint64_t{delay_us} * 2000;  // >= 2 GHz cycles per us
    while (clock64() < until) {
    }
  }
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = PatternWordDevice(seed, i);
  }
}

cudaError_t LaunchFillPattern(uint32_t* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>(std::max<size_t>((n_words + 255) / 256, 1), 1024));
  FillKernel<<<blocks, 256, 0, stream>>>(p, n_words, seed, delay_us);
  return cudaGetLastError();
}

}  // namespace

absl::Status FillPatternAsync(void* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              void* stream) {
  if (!gpu::GpuAvailable()) {
    return absl::UnavailableError(absl::StrCat("no GPU: ", gpu::GpuUnavailableReason()));
  }
  if (cudaError_t e = LaunchFillPattern(static_cast<uint32_t*>(p), n_words, seed, delay_us,
                                        static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("fill kernel: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::testing
