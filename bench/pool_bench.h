// `cxlrt bench pool`: what the coherence layer delivers on a pool (its
// latency model included): pointer-chase latency, streaming read / write /
// copy bandwidth, and flag ping-pong between two emulated hosts, beside the
// configured model and this machine's memcpy bandwidth measured in the same
// run. The benchmark makes its own pool from the URI and destroys it after,
// so it never writes into a pool that is in use.
#pragma once

#include <string>

namespace cxlrt::bench {

struct PoolBenchOptions {
  // A pool that does not exist yet; size= defaults to 256M.
  std::string uri;
  int reps = 7;
  bool json = false;
};

// Runs the benchmark and prints its table (or JSON). Returns the process
// exit code: 0, or 1 with a message on stderr.
int RunPoolBench(const PoolBenchOptions& options);

}  // namespace cxlrt::bench
