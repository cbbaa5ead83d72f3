// runtime's copy and CRC-32C kernels at every CPU level this machine has
// (levels above it are skipped, saying what the CPU lacks).
#include "cxlrt/runtime/internal/cpu_kernels.h"

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cxlrt/runtime/checksum.h"
#include "gtest/gtest.h"
#include "tests/testing/cpu_levels.h"

namespace cxlrt::runtime_internal {
namespace {

using runtime::CpuLevel;

class CpuKernelsTest : public ::testing::TestWithParam<CpuLevel> {
 protected:
  void SetUp() override { CXLRT_SKIP_ABOVE_THIS_CPU(GetParam()); }
};

TEST_P(CpuKernelsTest, CopyCopiesEveryAlignmentAndLengthAndNothingElse) {
  const CopyKernel copy = CopyKernelAt(GetParam());
  std::vector<uint8_t> src(20000), dst(20200);
  std::iota(src.begin(), src.end(), 0);
  for (size_t src_off : {0, 3, 32}) {
    for (size_t dst_off : {0, 1, 31, 64}) {
      for (size_t n : {0, 1, 63, 127, 128, 129, 2047, 2048, 2049, 4096 + 77, 16384 + 5}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        copy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << src_off << "/" << dst_off << "+" << n;
        EXPECT_EQ(dst[dst_off + n], 0xEE) << "wrote past the end";
        if (dst_off > 0) {
          EXPECT_EQ(dst[dst_off - 1], 0xEE) << "wrote before the start";
        }
      }
    }
  }
}

// The CRC of the bitwise definition, one bit at a time.
uint32_t BitwiseCrc32c(const uint8_t* p, size_t n) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST_P(CpuKernelsTest, Crc32cMatchesTheDefinitionAtEveryLength) {
  const Crc32cKernel crc = Crc32cKernelAt(GetParam());
  EXPECT_EQ(~crc("123456789", 9, ~0u), 0xE3069283u);  // the CRC-32C check value
  std::vector<uint8_t> data(3000);
  std::mt19937 rng(11);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t off : {0, 1, 5}) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 1000, 2990}) {
      EXPECT_EQ(~crc(data.data() + off, n, ~0u), BitwiseCrc32c(data.data() + off, n))
          << off << "+" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuKernelsTest, testing::AllCpuLevels(),
                         testing::CpuLevelTestName);

// The dispatched entry points run the active level's kernel: the same bytes.
TEST(CpuKernelsDispatchTest, CopyBytesAndCrc32cAgreeWithTheActiveLevel) {
  std::vector<uint8_t> data(5000);
  std::iota(data.begin(), data.end(), 1);
  EXPECT_EQ(runtime::Crc32c(data.data(), data.size()),
            ~Crc32cKernelAt(runtime::ActiveCpuLevel())(data.data(), data.size(), ~0u));
  EXPECT_EQ(runtime::Crc32c(data.data(), data.size()), BitwiseCrc32c(data.data(), data.size()));
}

}  // namespace
}  // namespace cxlrt::runtime_internal
