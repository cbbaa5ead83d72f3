// The pool lock (Lamport's bakery over single-writer tickets) under the
// tightest contention: two processes, a critical section of a few
// instructions, hundreds of thousands of acquisitions. A lock whose
// "write my ticket, then read the others'" is reordered by x86's store
// buffer lets both in at once, and the plain counter below loses
// increments (issue 13, defect 1: 246-1270 lost of 2,000,000 before the
// fence). tests/models/bakery_tso.pml is the same question asked of a model.
#include "cxlrt/runtime/bakery_lock.h"

#include <unistd.h>

#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::TestScale;
using ::cxlrt::testing::WaitExit;

class BakeryLockTest : public ::testing::TestWithParam<CoherenceDomain> {};

TEST_P(BakeryLockTest, ATinyCriticalSectionIsNeverEnteredTwiceAtOnce) {
  TempDir dir;
  const std::string uri =
      PoolUri(dir, absl::StrCat("hosts=2&coherence=", CoherenceDomainName(GetParam())));
  {
    auto pool = Pool::Create(uri);
    CXLRT_ASSERT_OK(pool);
  }
  // Simulated hosts serialise on a mutex per process and run far slower:
  // fewer rounds find the same window there.
  const int kIters = (GetParam() == CoherenceDomain::kSimulated ? 20000 : 1000000) * TestScale();
  std::vector<pid_t> kids;
  for (uint32_t self = 0; self < 2; ++self) {
    kids.push_back(Spawn([&, self] {
      auto pool = Pool::Open(OpenUri(uri));
      if (!pool.ok()) return 2;
      auto held = (*pool)->backend().TryLockLocalIndex(self);
      if (!held.ok() || !*held) return 3;
      Coherence& c = (*pool)->coherence();
      const PoolOffset counter = (*pool)->header().heap_offset;
      BakeryLock lock(**pool, self, nullptr);
      // Start together: a child that runs alone finds no contention.
      const PoolOffset ready = counter + kWriterSeparation * (1 + self);
      const PoolOffset other = counter + kWriterSeparation * (2 - self);
      c.StoreFlag(ready, 1);
      if (!c.WaitFlag(other, 1, absl::Now() + absl::Seconds(30)).ok()) return 5;
      for (int i = 0; i < kIters; ++i) {
        if (!lock.Lock(absl::Now() + absl::Seconds(30)).ok()) return 4;
        // A non-atomic increment: exact only under mutual exclusion.
        const uint64_t next = c.FetchWord(counter) + 1;
        c.Publish(counter, &next, 8);
        lock.Unlock();
      }
      return 0;
    }));
  }
  for (pid_t p : kids) EXPECT_EQ(WaitExit(p, absl::Seconds(240)), 0);
  auto pool = Pool::Open(OpenUri(uri));
  CXLRT_ASSERT_OK(pool);
  EXPECT_EQ((*pool)->coherence().FetchWord((*pool)->header().heap_offset),
            static_cast<uint64_t>(2 * kIters))
      << "increments lost: two hosts held the pool lock at once";
}

INSTANTIATE_TEST_SUITE_P(Domains, BakeryLockTest,
                         ::testing::Values(CoherenceDomain::kHardware, CoherenceDomain::kSoftware,
                                           CoherenceDomain::kSimulated),
                         [](const auto& info) {
                           return std::string(CoherenceDomainName(info.param));
                         });

}  // namespace
}  // namespace cxlrt::runtime
