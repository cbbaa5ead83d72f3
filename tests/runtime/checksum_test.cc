#include "cxlrt/runtime/checksum.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace cxlrt::runtime {
namespace {

TEST(ChecksumTest, MatchesTheCrc32cCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(ChecksumTest, ContinuesAcrossPieces) {
  std::vector<uint8_t> data(1000);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {0, 1, 7, 8, 63, 500, 999, 1000}) {
    EXPECT_EQ(Crc32c(data.data() + cut, data.size() - cut, Crc32c(data.data(), cut)), whole) << cut;
  }
}

TEST(ChecksumTest, EveryBitFlipChangesTheSum) {
  uint8_t line[64] = {};
  const uint32_t clean = Crc32c(line, sizeof(line));
  for (int bit = 0; bit < 64 * 8; ++bit) {
    line[bit / 8] ^= 1 << (bit % 8);
    EXPECT_NE(Crc32c(line, sizeof(line)), clean) << bit;
    line[bit / 8] ^= 1 << (bit % 8);
  }
}

}  // namespace
}  // namespace cxlrt::runtime
