#include "cxlrt/runtime/coherence.h"

#include <sys/mman.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cxlrt/runtime/cpu_features.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::WaitExit;

TEST(CpuFeaturesTest, PicksAFlushInstructionEveryX86CpuHas) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_TRUE(f.clflush);
  EXPECT_NE(f.writeback, FlushInstruction::kNone);
  EXPECT_NE(f.invalidate, FlushInstruction::kNone);
  EXPECT_NE(f.invalidate, FlushInstruction::kClwb) << "clwb does not invalidate";
  if (f.clwb) {
    EXPECT_EQ(f.writeback, FlushInstruction::kClwb);
  }
}

TEST(NonTemporalCopyTest, CopiesEveryAlignmentAndLength) {
  std::vector<uint8_t> src(9000), dst(9100);
  std::iota(src.begin(), src.end(), 0);
  for (size_t dst_off : {0, 1, 7, 15, 16, 33, 63}) {
    for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 1000, 4096, 8191}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      NonTemporalCopy(dst.data() + dst_off, src.data() + 3, n);
      ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + 3, n), 0) << dst_off << "+" << n;
      EXPECT_EQ(dst[dst_off + n], 0xEE) << "wrote past the end";
      if (dst_off > 0) {
        EXPECT_EQ(dst[dst_off - 1], 0xEE) << "wrote before the start";
      }
    }
  }
}

class CoherenceTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  void SetUp() override {
    uri_ = PoolUri(dir_, absl::StrCat("coherence=", CoherenceDomainName(GetParam())));
    auto pool = Pool::Create(uri_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    heap_ = pool_->header().heap_offset;
  }
  TempDir dir_;
  std::string uri_;
  std::unique_ptr<Pool> pool_;
  PoolOffset heap_ = 0;
};

TEST_P(CoherenceTest, PublishedBytesAreFetchedBack) {
  Coherence& c = pool_->coherence();
  EXPECT_EQ(c.domain(), GetParam());
  std::vector<uint8_t> data(5000);
  std::iota(data.begin(), data.end(), 1);
  c.Publish(heap_ + 3, data.data(), data.size());
  std::vector<uint8_t> back(data.size());
  c.Fetch(back.data(), heap_ + 3, back.size());
  EXPECT_EQ(back, data);
}

// Publish copies 1-64 KiB with `rep movsb` where the CPU has ERMS and
// with memcpy around that: every size at both bounds, off the line, lands
// exactly, and the bytes around it stay as they were.
TEST_P(CoherenceTest, PublishWritesExactlyItsBytesAroundTheStringCopyBounds) {
  Coherence& c = pool_->coherence();
  std::vector<uint8_t> data((64 << 10) + 1);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + 5);
  const std::vector<uint8_t> guard(data.size() + 256, 0xee);
  for (size_t n : {1023, 1024, 1025, 3000, 64 << 10, (64 << 10) + 1}) {
    c.Publish(heap_, guard.data(), guard.size());
    c.Publish(heap_ + 67, data.data(), n);
    std::vector<uint8_t> back(guard.size());
    c.Fetch(back.data(), heap_, back.size());
    EXPECT_EQ(std::memcmp(back.data() + 67, data.data(), n), 0) << n;
    for (size_t i = 0; i < back.size(); ++i) {
      if (i < 67 || i >= 67 + n) {
        ASSERT_EQ(back[i], 0xee) << "byte " << i << " of size " << n;
      }
    }
  }
}

TEST_P(CoherenceTest, FetchWordReadsWhatWasPublished) {
  Coherence& c = pool_->coherence();
  for (uint64_t k = 0; k < 16; ++k) {
    const uint64_t v = 0x0123456789abcdefULL * (k + 1);
    c.Publish(heap_ + k * 8, &v, 8);
  }
  for (uint64_t k = 0; k < 16; ++k) {
    EXPECT_EQ(c.FetchWord(heap_ + k * 8), 0x0123456789abcdefULL * (k + 1));
  }
  // Its inline path checks the range like every other access.
  EXPECT_DEATH(c.FetchWord(c.size() - 4), "outside the pool");
}

TEST_P(CoherenceTest, BulkCopiesRoundTripAtEverySize) {
  Coherence& c = pool_->coherence();
  std::vector<uint8_t> data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t n : {1, 64, 100, 4095, 4096, 65536 + 5, 1 << 20}) {
    std::vector<uint8_t> back(n, 0);
    c.CopyToPool(heap_ + 64 + 5, data.data(), n);
    c.CopyFromPool(back.data(), heap_ + 64 + 5, n);
    EXPECT_EQ(std::memcmp(back.data(), data.data(), n), 0) << n;
    std::vector<uint8_t> streamed(n + 3, 0);
    c.CopyFromPoolStreaming(streamed.data() + 3, heap_ + 64 + 5, n);  // unaligned destination
    EXPECT_EQ(std::memcmp(streamed.data() + 3, data.data(), n), 0) << n;
  }
}

TEST_P(CoherenceTest, FlagsOnlyGrowAndWaitSeesThem) {
  Coherence& c = pool_->coherence();
  const PoolOffset flag = heap_ + 4096;
  EXPECT_EQ(c.LoadFlag(flag), 0u);
  c.StoreFlag(flag, 5);
  EXPECT_EQ(c.LoadFlag(flag), 5u);
  CXLRT_EXPECT_OK(c.WaitFlag(flag, 5, absl::Now() + absl::Seconds(1)));
  CXLRT_EXPECT_OK(c.WaitFlag(flag, 3, absl::Now() + absl::Seconds(1)));
}

TEST_P(CoherenceTest, WaitingForAFlagThatNeverComesTimesOut) {
  Coherence& c = pool_->coherence();
  const PoolOffset flag = heap_ + 4096;
  const absl::Time start = absl::Now();
  CXLRT_EXPECT_ERROR(c.WaitFlag(flag, 1, start + absl::Milliseconds(50)),
                     absl::StatusCode::kDeadlineExceeded, "to reach 1");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Producer/consumer across processes: data published before the flag is
// seen by a consumer that waits for the flag and then fetches.
TEST_P(CoherenceTest, DataPublishedBeforeAFlagIsSeenByAnotherProcess) {
  const std::string uri = OpenUri(uri_);
  const PoolOffset flag = heap_;
  const PoolOffset data = heap_ + kWriterSeparation;
  constexpr int kRounds = 200;
  constexpr size_t kBytes = 1000;
  pid_t consumer = Spawn([&] {
    auto pool = Pool::Open(uri);
    if (!pool.ok()) return 2;
    Coherence& c = (*pool)->coherence();
    std::vector<uint8_t> buf(kBytes);
    for (int round = 1; round <= kRounds; ++round) {
      if (!c.WaitFlag(flag, round, absl::Now() + absl::Seconds(20)).ok()) return 3;
      c.Fetch(buf.data(), data, kBytes);
      for (size_t i = 0; i < kBytes; ++i) {
        if (buf[i] != static_cast<uint8_t>(round + i)) return 4;
      }
      c.StoreFlag(flag + kWriterSeparation * 40, round);  // ack, on the consumer's own line
    }
    return 0;
  });
  Coherence& c = pool_->coherence();
  std::vector<uint8_t> buf(kBytes);
  for (int round = 1; round <= kRounds; ++round) {
    for (size_t i = 0; i < kBytes; ++i) buf[i] = static_cast<uint8_t>(round + i);
    c.Publish(data, buf.data(), kBytes);
    c.StoreFlag(flag, round);
    CXLRT_ASSERT_OK(
        c.WaitFlag(flag + kWriterSeparation * 40, round, absl::Now() + absl::Seconds(20)));
  }
  EXPECT_EQ(WaitExit(consumer), 0) << "2 open, 3 timeout, 4 stale or wrong data";
}

TEST_P(CoherenceTest, AnOffsetOutsideThePoolAbortsInsteadOfTouchingOtherMemory) {
  Coherence& c = pool_->coherence();
  uint8_t byte = 0;
  EXPECT_DEATH(c.Read(&byte, pool_->size(), 1), "outside the pool");
  EXPECT_DEATH(c.Write(pool_->size() - 4, &byte, 8), "outside the pool");
  EXPECT_DEATH(c.LoadFlag(UINT64_MAX - 3), "outside the pool");
  // A misaligned flag would not be loaded or stored atomically (found by
  // pool_bytes_fuzz: an allocator header with ring_heads off a line).
  EXPECT_DEATH(c.LoadFlag(pool_->size() / 2 + 1), "not 8-byte aligned");
  EXPECT_DEATH(c.StoreFlag(pool_->size() / 2 + 4, 1), "not 8-byte aligned");
}

INSTANTIATE_TEST_SUITE_P(Domains, CoherenceTest,
                         ::testing::Values(CoherenceDomain::kHardware, CoherenceDomain::kSoftware,
                                           CoherenceDomain::kSimulated),
                         [](const auto& info) {
                           return std::string(CoherenceDomainName(info.param));
                         });

}  // namespace
}  // namespace cxlrt::runtime
