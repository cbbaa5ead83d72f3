// Reduction and test kernels of the CUDA data path (kernels.h).
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cxlrt/collectives/cuda/kernels.h"

namespace cxlrt::collectives::cuda {
namespace {

// 16-bit floats by their bits, as the CPU kernels store them.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <typename T>
struct Traits {
  using Acc = T;
  __device__ static Acc Load(T v) { return v; }
  __device__ static T Store(Acc a) { return a; }
};
template <>
struct Traits<F16> {
  using Acc = float;
  __device__ static Acc Load(F16 v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static F16 Store(Acc a) { return {__half_as_ushort(__float2half_rn(a))}; }
};
template <>
struct Traits<BF16> {
  using Acc = float;
  __device__ static Acc Load(BF16 v) { return __uint_as_float(uint32_t{v.bits} << 16); }
  // Round to nearest even, NaN kept NaN: the CPU's ToBf16 bit for bit.
  __device__ static BF16 Store(Acc a) {
    uint32_t u = __float_as_uint(a);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1);
    return {static_cast<uint16_t>(u >> 16)};
  }
};

template <RedOp kOp, typename A>
__device__ __forceinline__ A Apply(A x, A y) {
  if constexpr (kOp == RedOp::kMin) {
    return (y < x) ? y : x;  // std::min
  } else if constexpr (kOp == RedOp::kMax) {
    return (x < y) ? y : x;  // std::max
  } else if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;  // wrap, never undefined
    if constexpr (kOp == RedOp::kProd) return static_cast<A>(static_cast<U>(x) * static_cast<U>(y));
    return static_cast<A>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    if constexpr (kOp == RedOp::kProd) return x * y;
    return x + y;
  }
}

template <typename T, RedOp kOp, int V, typename Args>
__device__ __forceinline__ void ReduceElements(const Args& a, size_t at, T* out) {
  using Tr = Traits<T>;
  using A = typename Tr::Acc;
  A acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = Tr::Load(static_cast<const T*>(a.srcs[0])[at + k]);
  for (int s = 1; s < a.n; ++s) {
    const T* src = static_cast<const T*>(a.srcs[s]) + at;
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = Apply<kOp>(acc[k], Tr::Load(src[k]));
  }
  if constexpr (kOp == RedOp::kAvg) {
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = static_cast<A>(acc[k] / static_cast<A>(a.divisor));
  }
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = Tr::Store(acc[k]);
}

// 16-byte loads and stores per thread when every pointer allows, else one
// element at a time. Each thread reads all sources of its elements before
// writing them, so `out` may be one of the sources (in place).
template <typename T, RedOp kOp, typename Args>
__global__ void ReduceKernel(Args a, bool vec) {
  constexpr int V = 16 / sizeof(T);
  const size_t tid = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t units = a.count / V;
    for (size_t u = tid; u < units; u += stride) {
      // Gather V elements of each source with one 16-byte load.
      using Tr = Traits<T>;
      using Acc = typename Tr::Acc;
      Acc acc[V];
      {
        const uint4 w = static_cast<const uint4*>(a.srcs[0])[u];
        const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Tr::Load(e[k]);
      }
      for (int s = 1; s < a.n; ++s) {
        const uint4 w = static_cast<const uint4*>(a.srcs[s])[u];
        const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Apply<kOp>(acc[k], Tr::Load(e[k]));
      }
      uint4 o;
      T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        Acc v = acc[k];
        if constexpr (kOp == RedOp::kAvg) v = static_cast<Acc>(v / static_cast<Acc>(a.divisor));
        oe[k] = Tr::Store(v);
      }
      static_cast<uint4*>(a.out)[u] = o;
    }
    done = units * V;
  }
  for (size_t i = done + tid; i < a.count; i += stride) {
    ReduceElements<T, kOp, 1>(a, i, static_cast<T*>(a.out) + i);
  }
}

template <typename T, RedOp kOp>
cudaError_t Launch(const ReduceArgs& a, cudaStream_t stream) {
  bool vec = (reinterpret_cast<uintptr_t>(a.out) % 16) == 0;
  for (int s = 0; s < a.n; ++s) vec = vec && (reinterpret_cast<uintptr_t>(a.srcs[s]) % 16) == 0;
  const size_t units = vec ? a.count / (16 / sizeof(T)) + 1 : a.count;
  constexpr unsigned kThreads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((units + kThreads - 1) / kThreads, 1024));
  if (a.n <= kSmallSources) {
    ReduceArgsOf<kSmallSources> small{};
    std::copy(a.srcs, a.srcs + a.n, small.srcs);
    small.n = a.n;
    small.out = a.out;
    small.count = a.count;
    small.divisor = a.divisor;
    ReduceKernel<T, kOp><<<blocks, kThreads, 0, stream>>>(small, vec);
  } else {
    ReduceKernel<T, kOp><<<blocks, kThreads, 0, stream>>>(a, vec);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchOp(RedOp op, const ReduceArgs& a, cudaStream_t stream) {
  switch (op) {
    case RedOp::kSum:
      return Launch<T, RedOp::kSum>(a, stream);
    case RedOp::kProd:
      return Launch<T, RedOp::kProd>(a, stream);
    case RedOp::kMin:
      return Launch<T, RedOp::kMin>(a, stream);
    case RedOp::kMax:
      return Launch<T, RedOp::kMax>(a, stream);
    case RedOp::kAvg:
      return Launch<T, RedOp::kAvg>(a, stream);
  }
  return cudaErrorInvalidValue;
}

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

cudaError_t LaunchReduce(DataType t, RedOp op, const ReduceArgs& a, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  switch (t) {
    case DataType::kInt8:
      return LaunchOp<int8_t>(op, a, stream);
    case DataType::kUint8:
      return LaunchOp<uint8_t>(op, a, stream);
    case DataType::kInt32:
      return LaunchOp<int32_t>(op, a, stream);
    case DataType::kUint32:
      return LaunchOp<uint32_t>(op, a, stream);
    case DataType::kInt64:
      return LaunchOp<int64_t>(op, a, stream);
    case DataType::kUint64:
      return LaunchOp<uint64_t>(op, a, stream);
    case DataType::kFloat16:
      return LaunchOp<F16>(op, a, stream);
    case DataType::kBfloat16:
      return LaunchOp<BF16>(op, a, stream);
    case DataType::kFloat32:
      return LaunchOp<float>(op, a, stream);
    case DataType::kFloat64:
      return LaunchOp<double>(op, a, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchFillPattern(uint32_t* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>(std::max<size_t>((n_words + 255) / 256, 1), 1024));
  FillKernel<<<blocks, 256, 0, stream>>>(p, n_words, seed, delay_us);
  return cudaGetLastError();
}

}  // namespace cxlrt::collectives::cuda
