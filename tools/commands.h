// The subcommands of the `cxlrt` tool. Each returns the process exit code:
// 0 success, 1 the operation failed (message on stderr), 2 bad usage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cxlrt::tools {

int PoolCreate(const std::string& uri);
int PoolInfo(const std::string& uri, bool json);
int PoolCheck(const std::string& uri, bool json);
int PoolDestroy(const std::string& uri, bool force);
// Attaches as a host for `seconds`, printing what it sees every
// `interval_ms`; the demo runs two of these side by side.
int PoolAttach(const std::string& uri, int slot, double seconds, int interval_ms);
int PoolFence(const std::string& uri, int slot, bool force);
int Doctor(bool json);
// `cxlrt kv`: statistics and listing read the pool without attaching; put
// and get attach as a host; handoff runs as one rank under `cxlrt run`.
int KvStats(const std::string& uri, bool json);
int KvList(const std::string& uri, const std::string& ns, bool json);
int KvPut(const std::string& uri, const std::string& ns, const std::string& key,
          const std::string& file);
int KvGet(const std::string& uri, const std::string& ns, const std::string& key,
          const std::string& out);
int KvHandoff(uint64_t block_bytes, int blocks, double timeout_s);
// Starts `ranks` processes over `hosts` emulated hosts (0: one per rank) on
// `pool` ("" : a fresh one). Returns 0, the failed rank's exit code, or 2
// when the job could not start.
int Run(int ranks, int hosts, const std::string& pool, double timeout_s,
        const std::vector<std::string>& command);
// `cxlrt run --pods`: `pods` emulated pods (or pods of `pod_sizes`), each
// with its own pool, the ranks under mpirun (emulation::LaunchPods).
// `ranks` 0: the sum of `pod_sizes`. Returns as Run does.
int RunPods(int ranks, int pods, const std::vector<int>& pod_sizes, const std::string& pool,
            double timeout_s, const std::vector<std::string>& command);

}  // namespace cxlrt::tools
