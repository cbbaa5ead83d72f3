// The reduction kernels at every CPU level this machine has (levels above it
// are skipped, saying what the CPU lacks): every type and op, odd lengths
// across the kernels' blocks, 1 to 5 sources, out of place and in place,
// against a scalar reference, bit for bit.
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cxlrt/collectives/internal/reduce_kernels.h"
#include "gtest/gtest.h"
#include "tests/testing/cpu_levels.h"

namespace cxlrt::collectives_internal {
namespace {

using collectives::DataType;
using collectives::Half;
using collectives::RedOp;
using runtime::CpuLevel;

// bfloat16 of a float, round to nearest even (no NaN is ever made here).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One element type: its storage, how the reference accumulates it, and
// random values that keep products and sums finite.
template <typename T>
struct Elem {
  using Acc = T;
  static T Random(std::mt19937& rng) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(rng());
    } else {
      return static_cast<T>(std::uniform_real_distribution<double>(-4, 4)(rng));
    }
  }
  static Acc Load(T v) { return v; }
  static T Store(Acc a) { return a; }
};
struct Bf16Bits {
  uint16_t bits;
};
template <>
struct Elem<Half> {
  using Acc = float;
  static Half Random(std::mt19937& rng) {
    return Half(std::uniform_real_distribution<float>(-4, 4)(rng));
  }
  static Acc Load(Half v) { return static_cast<float>(v); }
  static Half Store(Acc a) { return Half(a); }
};
template <>
struct Elem<Bf16Bits> {
  using Acc = float;
  static Bf16Bits Random(std::mt19937& rng) {
    return {ToBf16(std::uniform_real_distribution<float>(-4, 4)(rng))};
  }
  static Acc Load(Bf16Bits v) { return FromBf16(v.bits); }
  static Bf16Bits Store(Acc a) { return {ToBf16(a)}; }
};

template <typename A>
A Combine(RedOp op, A x, A y) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        return static_cast<A>(static_cast<U>(x) + static_cast<U>(y));
      case RedOp::kProd:
        return static_cast<A>(static_cast<U>(x) * static_cast<U>(y));
      case RedOp::kMin:
        return y < x ? y : x;
      case RedOp::kMax:
        return x < y ? y : x;
    }
  } else {
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        return x + y;
      case RedOp::kProd:
        return x * y;
      case RedOp::kMin:
        return y < x ? y : x;
      case RedOp::kMax:
        return x < y ? y : x;
    }
  }
  return x;
}

// Where `out` is: its own buffer, the first source, or the last one.
enum class Place { kApart, kFirst, kLast };

// Reduces with the kernel of `level` and compares with the reference, one
// element at a time (in source order; 16-bit floats in fp32, rounded once;
// integers wrap; avg divides the sum). Also checks the element after `count`.
template <typename T>
void Check(ReduceKernel kernel, DataType type, RedOp op, int n, size_t count, Place place) {
  using E = Elem<T>;
  using A = typename E::Acc;
  std::mt19937 rng(static_cast<unsigned>(count * 131 + n * 7 + static_cast<int>(op)));
  std::vector<std::vector<T>> src(n, std::vector<T>(count + 1));
  for (auto& s : src) {
    for (auto& v : s) v = E::Random(rng);
  }
  std::vector<T> want(count);
  for (size_t i = 0; i < count; ++i) {
    A acc = E::Load(src[0][i]);
    for (int s = 1; s < n; ++s) acc = Combine(op, acc, E::Load(src[s][i]));
    if (op == RedOp::kAvg) acc = static_cast<A>(acc / static_cast<A>(n));
    want[i] = E::Store(acc);
  }
  std::vector<T> apart(count + 1);
  std::memset(apart.data(), 0xAB, apart.size() * sizeof(T));
  T* out = place == Place::kApart   ? apart.data()
           : place == Place::kFirst ? src[0].data()
                                    : src[n - 1].data();
  T guard;
  std::memcpy(&guard, &out[count], sizeof(T));
  std::vector<const void*> ptrs;
  for (auto& s : src) ptrs.push_back(s.data());
  kernel(type, op, out, ptrs.data(), n, count, n);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(&out[i], &want[i], sizeof(T)) != 0) {
      FAIL() << collectives::DataTypeName(type) << " " << collectives::RedOpName(op) << " of " << n
             << " sources, count " << count << ", out " << static_cast<int>(place) << ": element "
             << i << " differs from the scalar reference";
    }
  }
  EXPECT_EQ(std::memcmp(&out[count], &guard, sizeof(T)), 0) << "wrote past `count`";
}

template <typename T>
void CheckType(ReduceKernel kernel, DataType type) {
  for (int o = 0; o < collectives::kNumRedOps; ++o) {
    const auto op = static_cast<RedOp>(o);
    for (int n : {1, 2, 3, 5}) {
      // Odd lengths around the vector widths and the kernels' 2048-element
      // blocks.
      for (size_t count :
           {1, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129, 255, 1001, 2047, 2049, 4099}) {
        for (Place place : {Place::kApart, Place::kFirst, Place::kLast}) {
          Check<T>(kernel, type, op, n, count, place);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

class ReduceKernelTest : public ::testing::TestWithParam<CpuLevel> {
 protected:
  void SetUp() override { CXLRT_SKIP_ABOVE_THIS_CPU(GetParam()); }
  ReduceKernel kernel() const { return ReduceKernelAt(GetParam()); }
};

TEST_P(ReduceKernelTest, Int8) { CheckType<int8_t>(kernel(), DataType::kInt8); }
TEST_P(ReduceKernelTest, Uint8) { CheckType<uint8_t>(kernel(), DataType::kUint8); }
TEST_P(ReduceKernelTest, Int32) { CheckType<int32_t>(kernel(), DataType::kInt32); }
TEST_P(ReduceKernelTest, Uint32) { CheckType<uint32_t>(kernel(), DataType::kUint32); }
TEST_P(ReduceKernelTest, Int64) { CheckType<int64_t>(kernel(), DataType::kInt64); }
TEST_P(ReduceKernelTest, Uint64) { CheckType<uint64_t>(kernel(), DataType::kUint64); }
TEST_P(ReduceKernelTest, Float16) { CheckType<Half>(kernel(), DataType::kFloat16); }
TEST_P(ReduceKernelTest, Bfloat16) { CheckType<Bf16Bits>(kernel(), DataType::kBfloat16); }
TEST_P(ReduceKernelTest, Float32) { CheckType<float>(kernel(), DataType::kFloat32); }
TEST_P(ReduceKernelTest, Float64) { CheckType<double>(kernel(), DataType::kFloat64); }

INSTANTIATE_TEST_SUITE_P(Levels, ReduceKernelTest, testing::AllCpuLevels(),
                         testing::CpuLevelTestName);

// collectives::Reduce runs the active level's kernel: the same bits.
TEST(ReduceDispatchTest, ReduceAgreesWithTheActiveLevelsKernel) {
  std::vector<float> a(3001), b(3001), via_reduce(3001), via_kernel(3001);
  std::mt19937 rng(5);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    b[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  const void* srcs[] = {a.data(), b.data()};
  collectives::Reduce(DataType::kFloat32, RedOp::kAvg, via_reduce.data(), srcs, 2, a.size(), 2);
  ReduceKernelAt(runtime::ActiveCpuLevel())(DataType::kFloat32, RedOp::kAvg, via_kernel.data(),
                                            srcs, 2, a.size(), 2);
  EXPECT_EQ(std::memcmp(via_reduce.data(), via_kernel.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace cxlrt::collectives_internal
