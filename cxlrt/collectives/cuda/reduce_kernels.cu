// The reduction kernels of the collectives' GPU copy engine
// (reduce_kernels.h).
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cxlrt/collectives/cuda/reduce_kernels.h"

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

}  // namespace

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

}  // namespace cxlrt::collectives::cuda
