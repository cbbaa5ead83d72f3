#include "cxlrt/runtime/affinity.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cxlrt/runtime/knobs.h"

namespace cxlrt::runtime {
namespace {

const Knob<std::string> kAffinity(
    {"CXLRT_AFFINITY", "auto",
     "Core affinity of the ranks `cxlrt run` and `cxlrt bench` start: auto (round-robin over the "
     "allowed cores when ranks do not outnumber them), off, or a comma-separated core list."},
    "", [](const char* name, const std::string& text) -> absl::StatusOr<std::string> {
      bool list = !text.empty();
      for (char ch : text)
        list = list && (std::isdigit(static_cast<unsigned char>(ch)) || ch == ',');
      if (text != "auto" && text != "off" && !list) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, "='", text, "' is not auto, off or a comma-separated list of core numbers"));
      }
      return text == "auto" ? "" : text;
    });

// The variable's name before issue 26 gave "pin" one meaning (a KV pin):
// set, it is an error at open rather than a setting silently ignored.
const KnobRule kRenamedPin([](const Getenv& getenv) -> absl::Status {
  const char* old = getenv("CXLRT_PIN");
  if (old == nullptr || *old == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("CXLRT_PIN='", old, "': the variable is now CXLRT_AFFINITY (same values)"));
});

std::vector<int> AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  return cores;
}

}  // namespace

const std::string& AffinitySetting() { return kAffinity.Get(); }

absl::StatusOr<AffinityPlan> PlanAffinity(int ranks, const std::string& setting) {
  AffinityPlan plan;
  if (setting == "off") {
    plan.why = "off (CXLRT_AFFINITY=off)";
    return plan;
  }
  const std::vector<int> allowed = AllowedCores();
  if (setting.empty() || setting == "auto") {
    if (allowed.empty()) {
      plan.why = "off: the allowed cores are unknown";
      return plan;
    }
    if (ranks > static_cast<int>(allowed.size())) {
      plan.why = absl::StrCat("off: ", ranks, " ranks > ", allowed.size(), " cores");
      return plan;
    }
    plan.cores.assign(allowed.begin(), allowed.begin() + ranks);
  } else {
    for (absl::string_view part : absl::StrSplit(setting, ',')) {
      int core = -1;
      if (!absl::SimpleAtoi(part, &core) ||
          std::find(allowed.begin(), allowed.end(), core) == allowed.end()) {
        return absl::InvalidArgumentError(absl::StrCat("CXLRT_AFFINITY='", setting, "': core '",
                                                       part, "' is not one this process may use (",
                                                       absl::StrJoin(allowed, ","), ")"));
      }
      plan.cores.push_back(core);
    }
    std::vector<int> listed = plan.cores;
    while (static_cast<int>(plan.cores.size()) < ranks) {
      plan.cores.push_back(listed[plan.cores.size() % listed.size()]);
    }
    plan.cores.resize(ranks);
  }
  plan.why = absl::StrCat("rank r on core ", absl::StrJoin(plan.cores, ","), "[r]");
  return plan;
}

absl::Status BindToCore(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("binding to core ", core, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::runtime
