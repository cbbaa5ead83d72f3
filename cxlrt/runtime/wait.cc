#include "cxlrt/runtime/wait.h"

#include <immintrin.h>
#include <sched.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/knobs.h"

namespace cxlrt::runtime {
namespace {

const Knob<uint32_t> kWaitSpins({"CXLRT_WAIT_SPINS", "2000",
                                 "Spin iterations of a wait before it yields and then sleeps."},
                                2000, UintIn(0, 100000000));

// After spinning: this many yields (about 1 us each), then sleeps.
constexpr uint64_t kYields = 64;
constexpr absl::Duration kFirstSleep = absl::Microseconds(2);
constexpr absl::Duration kMaxSleep = absl::Milliseconds(1);
constexpr absl::Duration kWatchPeriod = absl::Milliseconds(1);

}  // namespace

Waiter::Waiter(absl::Time deadline, absl::string_view what, WaitWatch* watch)
    : start_(absl::Now()),
      deadline_(deadline),
      what_(what),
      watch_(watch),
      spins_(kWaitSpins.Get()),
      sleep_(kFirstSleep),
      next_watch_(start_ + kWatchPeriod) {}

Waiter::Waiter(absl::Time deadline, absl::string_view what, WaitWatch* watch,
               absl::Duration yield_for, int spins)
    : Waiter(deadline, what, watch) {
  yield_until_ = start_ + yield_for;
  if (spins >= 0) spins_ = static_cast<uint32_t>(spins);
}

absl::Status Waiter::Pause() {
  ++pauses_;
  if (pauses_ <= spins_) {
    _mm_pause();
    // Reading the clock costs ~20 ns: check the deadline every 64 spins.
    if ((pauses_ & 63) != 0) return absl::OkStatus();
  } else if (yield_until_ != absl::InfinitePast() ? absl::Now() < yield_until_
                                                  : pauses_ <= spins_ + kYields) {
    sched_yield();
  } else {
    absl::Time now = absl::Now();
    absl::Duration left = deadline_ - now;
    absl::SleepFor(std::min(sleep_, std::max(left, absl::ZeroDuration())));
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }
  absl::Time now = absl::Now();
  if (watch_ != nullptr && now >= next_watch_) {
    next_watch_ = now + kWatchPeriod;
    if (absl::Status s = watch_->Check(); !s.ok()) return s;
  }
  if (now >= deadline_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "timed out after ", absl::FormatDuration(now - start_), " waiting for ", what_));
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::runtime
