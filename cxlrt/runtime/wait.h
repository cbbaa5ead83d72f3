// The one wait primitive of every layer: spin, then yield, then sleep with
// backoff, always against a deadline (a futex cannot cross hosts, and a
// wait that may never end is a hang). Between sleeps it asks an optional
// WaitWatch whether to give up, which is how a dead or fenced peer ends a
// wait early with kAborted instead of at the deadline.
// Thread-safe: a Waiter belongs to one thread; WaitWatch implementations
// must be callable from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cxlrt::runtime {

// Asked about once a millisecond while a wait sleeps; a non-OK status
// (kAborted naming the peer, say) ends the wait with that status.
class WaitWatch {
 public:
  virtual ~WaitWatch() = default;
  virtual absl::Status Check() = 0;
};

// One wait in progress. Typical use:
//   Waiter w(deadline, "host 2's ticket");
//   while (!Ready()) CXLRT_RETURN_IF_ERROR(w.Pause());
class Waiter {
 public:
  // `what` names the awaited thing in the timeout message; it must outlive
  // the Waiter. `watch` may be null.
  Waiter(absl::Time deadline, absl::string_view what, WaitWatch* watch = nullptr);
  // After spinning, yield the CPU for up to `yield_for` before sleeping
  // (default: about 64 yields). Data paths that expect their peer within
  // microseconds to milliseconds (collectives) yield rather than sleep: a
  // sleep overshoots by tens of microseconds, and yielding still lets ranks
  // that share a core run.
  // `spins` (>= 0) replaces CXLRT_WAIT_SPINS: fewer when more threads wait
  // than there are cores, so a waiter hands its core to the one it waits for.
  Waiter(absl::Time deadline, absl::string_view what, WaitWatch* watch, absl::Duration yield_for,
         int spins = -1);

  // Waits a little (longer each call). Returns OK to try again, or
  // kDeadlineExceeded / the watch's status to give up.
  absl::Status Pause();

  // Calls made so far.
  uint64_t pauses() const { return pauses_; }

 private:
  absl::Time start_;
  absl::Time deadline_;
  absl::Time yield_until_ = absl::InfinitePast();  // set: yield until then, not kYields times
  absl::string_view what_;
  WaitWatch* watch_;
  uint64_t pauses_ = 0;
  uint32_t spins_;
  absl::Duration sleep_;
  absl::Time next_watch_;
};

// Waits until `ready()` is true. Returns OK, kDeadlineExceeded, or the
// status of `watch`.
template <typename Ready>
absl::Status WaitUntil(Ready&& ready, absl::Time deadline, absl::string_view what,
                       WaitWatch* watch = nullptr, absl::Duration yield_for = absl::ZeroDuration(),
                       int spins = -1) {
  if (ready()) return absl::OkStatus();
  Waiter w = yield_for > absl::ZeroDuration() ? Waiter(deadline, what, watch, yield_for, spins)
                                              : Waiter(deadline, what, watch);
  while (!ready()) {
    absl::Status s = w.Pause();
    if (!s.ok()) return ready() ? absl::OkStatus() : s;
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::runtime
