// Core affinity of the ranks a launcher starts on one machine (`cxlrt run`,
// `cxlrt bench`): rank r bound to core plan[r % plan.size()], round-robin
// over the cores this process may run on. Binding keeps a rank's cache and
// its slot lines on one core, and keeps two ranks off one core while
// another idles. It is off when ranks outnumber the cores: ranks then share
// cores and their waits yield, and a bound rank could not move to an idle
// core. CXLRT_AFFINITY: auto (default), off, or a comma-separated list of
// cores. ("Pin" means a KV lookup's pin only; page-locked memory is
// page-locked, see cxlrt/gpu/memory.h.)
// Thread-safe: pure functions and one sched_setaffinity call.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cxlrt::runtime {

struct AffinityPlan {
  std::vector<int> cores;  // rank r -> cores[r]; empty: not bound
  std::string why;         // "ranks 0-1 on cores 0,1", "off: 8 ranks > 2 cores", ...
};

// CXLRT_AFFINITY's value: "" (auto), "off" or a list of cores.
const std::string& AffinitySetting();

// The plan for `ranks` ranks under `setting` (CXLRT_AFFINITY's value; "" is
// auto) and the cores this process may use. kInvalidArgument for a list
// naming a core this process may not use.
absl::StatusOr<AffinityPlan> PlanAffinity(int ranks, const std::string& setting);

// Binds the calling process (all its future threads) to `core`.
absl::Status BindToCore(int core);

}  // namespace cxlrt::runtime
