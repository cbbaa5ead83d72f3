#include "cxlrt/collectives/types.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "cxlrt/collectives/internal/reduce_kernels.h"
#include "cxlrt/runtime/cpu_features.h"

namespace cxlrt::collectives {
namespace {

// bfloat16: the top half of an fp32; rounded to nearest even, NaN kept NaN.
struct Bf16 {
  uint16_t bits;
};
[[gnu::always_inline]] inline float ToFloat(Bf16 v) {
  const uint32_t u = uint32_t{v.bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
[[gnu::always_inline]] inline Bf16 ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1);
  return {static_cast<uint16_t>(u >> 16)};
}

// How an element type is stored, accumulated and converted.
template <typename T>
struct Traits {
  using Acc = T;
  [[gnu::always_inline]] static Acc Load(T v) { return v; }
  [[gnu::always_inline]] static T Store(Acc a) { return a; }
};
template <>
struct Traits<Half> {
  using Acc = float;
  [[gnu::always_inline]] static Acc Load(Half v) { return static_cast<float>(v); }
  [[gnu::always_inline]] static Half Store(Acc a) { return static_cast<Half>(a); }
};
template <>
struct Traits<Bf16> {
  using Acc = float;
  [[gnu::always_inline]] static Acc Load(Bf16 v) { return ToFloat(v); }
  [[gnu::always_inline]] static Bf16 Store(Acc a) { return ToBf16(a); }
};

template <typename A>
[[gnu::always_inline]] inline A Apply(RedOp op, A x, A y) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;  // wrap, never undefined
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        return static_cast<A>(static_cast<U>(x) + static_cast<U>(y));
      case RedOp::kProd:
        return static_cast<A>(static_cast<U>(x) * static_cast<U>(y));
      case RedOp::kMin:
        return std::min(x, y);
      case RedOp::kMax:
        return std::max(x, y);
    }
  } else {
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        return x + y;
      case RedOp::kProd:
        return x * y;
      case RedOp::kMin:
        return std::min(x, y);
      case RedOp::kMax:
        return std::max(x, y);
    }
  }
  return x;
}

// One op over blocks that stay in L1, in passes the compiler vectorises:
// the first two sources combine into an accumulator block (fp32 for 16-bit
// floats), the others fold in, and the block is stored. Always inlined, so each level's
// kernel (ReduceAt below: AVX-512, AVX2, baseline) gets its own vector code.
template <typename T, RedOp kOp>
[[gnu::always_inline]] inline void ReduceTyped(T* out, const void* const* srcs, int n, size_t count,
                                               int divisor) {
  using Tr = Traits<T>;
  using A = typename Tr::Acc;
  constexpr size_t kBlock = 2048;
  bool direct = true;
  for (int s = 2; s < n; ++s) direct &= srcs[s] != out;
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    const T* s0 = static_cast<const T*>(srcs[0]) + at;
    T* o = out + at;
    if constexpr (std::is_same_v<A, T>) {
      if (direct) {  // straight into `out`: no source after the second is `out`
        if (n == 1) {
          for (size_t i = 0; i < m; ++i) o[i] = s0[i];
        } else {
          const T* s1 = static_cast<const T*>(srcs[1]) + at;
          for (size_t i = 0; i < m; ++i) o[i] = Apply(kOp, s0[i], s1[i]);
        }
        for (int s = 2; s < n; ++s) {
          const T* src = static_cast<const T*>(srcs[s]) + at;
          for (size_t i = 0; i < m; ++i) o[i] = Apply(kOp, o[i], src[i]);
        }
        if constexpr (kOp == RedOp::kAvg) {
          for (size_t i = 0; i < m; ++i) o[i] = static_cast<A>(o[i] / static_cast<A>(divisor));
        }
        continue;
      }
    }
    // Otherwise the block is reduced in `acc` and stored last: `out` may be
    // a later source (in place), which must not change before it is folded.
    A acc[kBlock];
    if (n == 1) {
      for (size_t i = 0; i < m; ++i) acc[i] = Tr::Load(s0[i]);
    } else {
      const T* s1 = static_cast<const T*>(srcs[1]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] = Apply(kOp, Tr::Load(s0[i]), Tr::Load(s1[i]));
    }
    for (int s = 2; s < n; ++s) {
      const T* src = static_cast<const T*>(srcs[s]) + at;
      for (size_t i = 0; i < m; ++i) acc[i] = Apply(kOp, acc[i], Tr::Load(src[i]));
    }
    if constexpr (kOp == RedOp::kAvg) {
      const A d = static_cast<A>(divisor);
      for (size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] / d);
    }
    for (size_t i = 0; i < m; ++i) o[i] = Tr::Store(acc[i]);
  }
}

template <typename T>
[[gnu::always_inline]] inline void ReduceOp(RedOp op, void* out, const void* const* srcs, int n,
                                            size_t count, int divisor) {
  T* o = static_cast<T*>(out);
  switch (op) {
    case RedOp::kSum:
      return ReduceTyped<T, RedOp::kSum>(o, srcs, n, count, divisor);
    case RedOp::kProd:
      return ReduceTyped<T, RedOp::kProd>(o, srcs, n, count, divisor);
    case RedOp::kMin:
      return ReduceTyped<T, RedOp::kMin>(o, srcs, n, count, divisor);
    case RedOp::kMax:
      return ReduceTyped<T, RedOp::kMax>(o, srcs, n, count, divisor);
    case RedOp::kAvg:
      return ReduceTyped<T, RedOp::kAvg>(o, srcs, n, count, divisor);
  }
}

// Every type and op, compiled once per CPU level by the wrappers below (the
// level's target attribute applies to everything inlined here). Function
// attributes, not per-file flags: a per-file -mavx512f would also compile
// the inline functions that file instantiates (std::min, Half), and the
// linker may keep that copy for the whole program.
[[gnu::always_inline]] inline void ReduceAt(DataType t, RedOp op, void* out,
                                            const void* const* srcs, int n, size_t count,
                                            int avg_divisor) {
  switch (t) {
    case DataType::kInt8:
      return ReduceOp<int8_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kUint8:
      return ReduceOp<uint8_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kInt32:
      return ReduceOp<int32_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kUint32:
      return ReduceOp<uint32_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kInt64:
      return ReduceOp<int64_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kUint64:
      return ReduceOp<uint64_t>(op, out, srcs, n, count, avg_divisor);
    case DataType::kFloat16:
      return ReduceOp<Half>(op, out, srcs, n, count, avg_divisor);
    case DataType::kBfloat16:
      return ReduceOp<Bf16>(op, out, srcs, n, count, avg_divisor);
    case DataType::kFloat32:
      return ReduceOp<float>(op, out, srcs, n, count, avg_divisor);
    case DataType::kFloat64:
      return ReduceOp<double>(op, out, srcs, n, count, avg_divisor);
  }
}

void ReduceBaseline(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                    int avg_divisor) {
  ReduceAt(t, op, out, srcs, n, count, avg_divisor);
}

// Reached only when ActiveCpuLevel() is avx2 or more (the CPU has every
// x86-64-v3 instruction set and the OS saves the YMM state).
__attribute__((target("arch=x86-64-v3"))) void ReduceAvx2(DataType t, RedOp op, void* out,
                                                          const void* const* srcs, int n,
                                                          size_t count, int avg_divisor) {
  ReduceAt(t, op, out, srcs, n, count, avg_divisor);
}

// Reached only when ActiveCpuLevel() is avx512.
__attribute__((target("arch=x86-64-v4"))) void ReduceAvx512(DataType t, RedOp op, void* out,
                                                            const void* const* srcs, int n,
                                                            size_t count, int avg_divisor) {
  ReduceAt(t, op, out, srcs, n, count, avg_divisor);
}

constexpr collectives_internal::ReduceKernel kReduceByLevel[runtime::kNumCpuLevels] = {
    ReduceBaseline, ReduceAvx2, ReduceAvx512};

}  // namespace

const char* DataTypeName(DataType t) {
  static const char* const kNames[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                       "uint64", "float16", "bfloat16", "float32", "float64"};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const char* RedOpName(RedOp op) {
  static const char* const kNames[] = {"sum", "prod", "min", "max", "avg"};
  const auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::optional<DataType> ParseDataType(absl::string_view name) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (name == DataTypeName(static_cast<DataType>(i))) return static_cast<DataType>(i);
  }
  if (name == "half" || name == "fp16") return DataType::kFloat16;
  if (name == "bf16") return DataType::kBfloat16;
  if (name == "float" || name == "fp32") return DataType::kFloat32;
  if (name == "double" || name == "fp64") return DataType::kFloat64;
  if (name == "int") return DataType::kInt32;
  return std::nullopt;
}

std::optional<RedOp> ParseRedOp(absl::string_view name) {
  for (int i = 0; i < kNumRedOps; ++i) {
    if (name == RedOpName(static_cast<RedOp>(i))) return static_cast<RedOp>(i);
  }
  return std::nullopt;
}

void Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
            int avg_divisor) {
  static const collectives_internal::ReduceKernel kernel =
      runtime::ForActiveCpuLevel(kReduceByLevel);
  kernel(t, op, out, srcs, n, count, avg_divisor);
}

const char* CollKindName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce:
      return "AllReduce";
    case CollKind::kReduceScatter:
      return "ReduceScatter";
    case CollKind::kAllGather:
      return "AllGather";
    case CollKind::kBroadcast:
      return "Broadcast";
    case CollKind::kReduce:
      return "Reduce";
    case CollKind::kGather:
      return "Gather";
    case CollKind::kScatter:
      return "Scatter";
    case CollKind::kAllToAll:
      return "AllToAll";
    case CollKind::kBarrier:
      return "Barrier";
    case CollKind::kAllToAllV:
      return "AllToAllV";
  }
  return "?";
}

}  // namespace cxlrt::collectives

namespace cxlrt::collectives_internal {

ReduceKernel ReduceKernelAt(runtime::CpuLevel level) {
  return collectives::kReduceByLevel[static_cast<int>(level)];
}

}  // namespace cxlrt::collectives_internal
