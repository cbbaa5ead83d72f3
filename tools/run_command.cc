// `cxlrt run`: the local multi-host launcher (cxlrt/emulation/launcher.h),
// and with --pods several emulated pods under mpirun.
#include <cstdio>

#include "cxlrt/emulation/launcher.h"
#include "tools/commands.h"

namespace cxlrt::tools {

int Run(int ranks, int hosts, const std::string& pool, double timeout_s,
        const std::vector<std::string>& command) {
  emulation::LaunchOptions o;
  o.ranks = ranks;
  if (hosts > 0) o.hosts = hosts;
  if (!pool.empty()) o.pool = pool;
  o.argv = command;
  o.timeout = absl::Seconds(timeout_s);
  auto result = emulation::Launch(o);
  if (!result.ok()) {
    std::fprintf(stderr, "cxlrt run: %s\n", std::string(result.status().message()).c_str());
    return 2;
  }
  if (result->exit_code != 0) {
    std::fprintf(stderr, "cxlrt run: %s\n", result->message.c_str());
  }
  return result->exit_code;
}

int RunPods(int ranks, int pods, const std::vector<int>& pod_sizes, const std::string& pool,
            double timeout_s, const std::vector<std::string>& command) {
  emulation::PodLaunchOptions o;
  o.ranks = ranks;
  o.pods = pods;
  o.pod_sizes = pod_sizes;
  if (!pool.empty()) o.pool = pool;
  o.argv = command;
  o.timeout = absl::Seconds(timeout_s);
  auto result = emulation::LaunchPods(o);
  if (!result.ok()) {
    std::fprintf(stderr, "cxlrt run: %s\n", std::string(result.status().message()).c_str());
    return 2;
  }
  if (result->exit_code != 0) {
    std::fprintf(stderr, "cxlrt run: %s\n", result->message.c_str());
  }
  return result->exit_code;
}

}  // namespace cxlrt::tools
