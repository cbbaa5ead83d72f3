// Fault injection: named points compiled into the runtime (and the layers
// above) where a test can crash, stall, stop, or corrupt the line just written,
// switched on by CXLRT_FAULT=point:action[:count][,point:action[:count]...].
//
//   actions  crash       _exit(kFaultExitCode) at once (no destructors, no flush)
//            stall=MS    sleep MS milliseconds
//            corrupt     flip every bit of the last byte of the range just
//                        written at this point, and publish it
//            stop        raise(SIGSTOP): the whole process stops until someone
//                        sends SIGCONT (a stress driver, after a delay it picks)
//   count    fire at the count-th time the point is reached (default 1), once
//
// docs/faults.md lists every point (kFaultPoints in fault.cc is the list;
// a test keeps the two in step). When no fault is armed a point costs one
// relaxed load. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlrt::runtime {

class Coherence;

// Exit code of a process killed by a crash fault: tests tell it from a real crash.
inline constexpr int kFaultExitCode = 86;

struct FaultPointInfo {
  const char* name;
  const char* where;  // what has and has not happened when it fires
};

// Every fault point of the code base.
std::span<const FaultPointInfo> FaultPoints();

enum class FaultAction { kCrash, kStall, kCorrupt, kStop };

struct FaultRule {
  std::string point;
  FaultAction action = FaultAction::kCrash;
  uint32_t stall_ms = 0;
  uint64_t count = 1;
};

// Parses a CXLRT_FAULT value. kInvalidArgument names an unknown point, a
// bad action or a bad count.
absl::StatusOr<std::vector<FaultRule>> ParseFaultSpec(absl::string_view spec);

// Replaces the armed rules (tests arm faults in forked children this way;
// programs get CXLRT_FAULT). "" disarms.
absl::Status ArmFaults(absl::string_view spec);

namespace fault_internal {
extern std::atomic<bool> armed;
void Hit(const char* point, Coherence* coherence, uint64_t offset, size_t n);
}  // namespace fault_internal

}  // namespace cxlrt::runtime

// A fault point. REQUIRES: `point` is listed in kFaultPoints.
#define CXLRT_FAULT_POINT(point)                                                   \
  do {                                                                             \
    if (::cxlrt::runtime::fault_internal::armed.load(std::memory_order_relaxed)) { \
      ::cxlrt::runtime::fault_internal::Hit(point, nullptr, 0, 0);                 \
    }                                                                              \
  } while (0)

// A fault point right after [offset, offset+n) was written through `coherence`
// (which `corrupt` then damages).
#define CXLRT_FAULT_POINT_AFTER_WRITE(point, coherence, offset, n)                 \
  do {                                                                             \
    if (::cxlrt::runtime::fault_internal::armed.load(std::memory_order_relaxed)) { \
      ::cxlrt::runtime::fault_internal::Hit(point, (coherence), (offset), (n));    \
    }                                                                              \
  } while (0)
