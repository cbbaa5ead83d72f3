// Reading a checksummed record that another host may be rewriting (records
// written without a lock their readers take: host lines, segment-table
// entries, KV namespaces). A torn read is retried at once a few times, then
// with short sleeps until kTornReadPatience has passed: a writer preempted
// halfway through its record finishes well within it, so only a record
// still torn after that is corrupt. (A fixed count of back-to-back retries
// called a namespace record that was being registered corrupt whenever the
// registering thread was preempted mid-write.) KV index entries are not
// read this way: a lookup that meets one being rewritten takes it as a miss
// rather than wait.
//
// Thread-safety: a pure function of `read`.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cxlrt::runtime {

inline constexpr int kTornReadQuickRetries = 16;
inline constexpr absl::Duration kTornReadPatience = absl::Milliseconds(50);

// Calls `read()` until it returns true (a whole record); false when
// `patience` ran out first. A caller on a path that must not stall for a
// corrupt record (the heartbeat reads every host line each beat) passes less.
template <typename Read>
bool RetryTornRead(Read read, absl::Duration patience = kTornReadPatience) {
  for (int i = 0; i < kTornReadQuickRetries; ++i) {
    if (read()) return true;
  }
  const absl::Time end = absl::Now() + patience;
  while (absl::Now() < end) {
    absl::SleepFor(absl::Microseconds(200));
    if (read()) return true;
  }
  return false;
}

}  // namespace cxlrt::runtime
