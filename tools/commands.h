// The subcommands of the `cxlrt` tool. Each returns the process exit code:
// 0 success, 1 the operation failed (message on stderr), 2 bad usage.
#pragma once

#include <cstdint>
#include <functional>
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
// `cxlrt metrics`: every host's published metrics and the pool's gauges in
// the Prometheus text format (watches the host table for two heartbeats
// first). `cxlrt serve-metrics`: the same at http://ADDRESS:PORT/metrics,
// with /health, until a signal (or `seconds`, when positive).
int Metrics(const std::string& uri);
int ServeMetrics(const std::string& uri, const std::string& address, int port, double seconds);
// `cxlrt top`: the live view (ncurses) of the pool's hosts, KV namespaces,
// communicators and allocator, refreshed every `period_s` until q; with
// `iterations` > 0, that many frames printed as text instead. Returns 1
// when the pool cannot be opened, ncurses cannot drive the terminal or the
// live view was not built (no ncurses), 2 on bad options or when the live
// view has no terminal.
struct TopOptions {
  double period_s = 1;
  int iterations = 0;  // 0: the live view
};
int Top(const std::string& uri, const TopOptions& options);
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

// `cxlrt bench WHAT ... --plot PLOT`: runs `bench` (a benchmark told to
// write JSON) with its standard output into PLOT's name with ".json", then
// the plotter (python/cxlrt/plot.py under $CXLRT_PYTHON or /usr/bin/python3)
// draws PLOT from it. The JSON goes to stdout too when `print_json`, else
// the plotted series as text. Returns the benchmark's exit code when it
// failed (no plot), 2 when the plotter or its input is missing or bad, 1
// when it failed otherwise, else 0.
int BenchWithPlot(const std::string& what, const std::string& plot, bool print_json,
                  const std::function<int()>& bench);

}  // namespace cxlrt::tools
