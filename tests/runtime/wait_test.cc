#include "cxlrt/runtime/wait.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

TEST(WaitTest, ReturnsAtOnceWhenReady) {
  int calls = 0;
  CXLRT_EXPECT_OK(WaitUntil([&] { return ++calls > 0; }, absl::Now(), "nothing"));
  EXPECT_EQ(calls, 1);
}

TEST(WaitTest, TimesOutNamingWhatItWaitedFor) {
  const absl::Time start = absl::Now();
  auto s = WaitUntil([] { return false; }, start + absl::Milliseconds(30), "the answer");
  CXLRT_EXPECT_ERROR(s, absl::StatusCode::kDeadlineExceeded, "waiting for the answer");
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(30));
  EXPECT_LT(took, absl::Seconds(1)) << "overslept the deadline";
}

TEST(WaitTest, SeesAConditionSetByAnotherThread) {
  std::atomic<bool> flag{false};
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(20));
    flag = true;
  });
  CXLRT_EXPECT_OK(WaitUntil([&] { return flag.load(); }, absl::Now() + absl::Seconds(10), "flag"));
  t.join();
}

class AbortAfter : public WaitWatch {
 public:
  explicit AbortAfter(int n) : left_(n) {}
  absl::Status Check() override {
    ++checks_;
    return --left_ > 0 ? absl::OkStatus() : absl::AbortedError("host slot 2 is dead");
  }
  int checks_ = 0;

 private:
  int left_;
};

TEST(WaitTest, AWatchEndsTheWaitLongBeforeTheDeadline) {
  AbortAfter watch(3);
  const absl::Time start = absl::Now();
  auto s = WaitUntil([] { return false; }, start + absl::Seconds(60), "peer", &watch);
  CXLRT_EXPECT_ERROR(s, absl::StatusCode::kAborted, "host slot 2 is dead");
  EXPECT_EQ(watch.checks_, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(WaitTest, BacksOffToSleepingInsteadOfBurningTheCpu) {
  // 200 ms of waiting must cost far less CPU than 200 ms.
  timespec cpu0, cpu1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
  auto s = WaitUntil([] { return false; }, absl::Now() + absl::Milliseconds(200), "nothing");
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  const double cpu_ms = (cpu1.tv_sec - cpu0.tv_sec) * 1e3 + (cpu1.tv_nsec - cpu0.tv_nsec) / 1e6;
  EXPECT_LT(cpu_ms, 100.0);
}

}  // namespace
}  // namespace cxlrt::runtime
