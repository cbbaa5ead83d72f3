// Core pinning of the ranks a launcher starts on one machine (`cxlrt run`,
// `cxlrt bench`): rank r on core plan[r % plan.size()], round-robin over
// the cores this process may run on. Pinning keeps a rank's cache and its
// slot lines on one core, and keeps two ranks off one core while another
// idles. It is off when ranks outnumber the cores: ranks then share cores
// and their waits yield, and a pinned rank could not move to an idle core.
// CXLRT_PIN: auto (default), off, or a comma-separated list of cores.
// Thread-safe: pure functions and one sched_setaffinity call.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cxlrt::runtime {

struct PinPlan {
  std::vector<int> cores;  // rank r -> cores[r]; empty: not pinned
  std::string why;         // "ranks 0-1 on cores 0,1", "off: 8 ranks > 2 cores", ...
};

// CXLRT_PIN's value: "" (auto), "off" or a list of cores.
const std::string& PinSetting();

// The plan for `ranks` ranks under `setting` (CXLRT_PIN's value; "" is
// auto) and the cores this process may use. kInvalidArgument for a list
// naming a core this process may not use.
absl::StatusOr<PinPlan> PlanPinning(int ranks, const std::string& setting);

// Pins the calling process (all its future threads) to `core`.
absl::Status PinToCore(int core);

}  // namespace cxlrt::runtime
