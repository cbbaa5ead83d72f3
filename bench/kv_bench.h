// `cxlrt bench kv`: put and get throughput of the KV-cache store per block
// size (GB/s and ops/s, one at a time and in batches), with the entries put
// by one emulated host and got by the others, and Lookup latency for one key
// and for a 64-key chain; beside this machine's memcpy bandwidth measured in
// the same run. Makes its own pool (hardware domain) and destroys it after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cxlrt::bench {

struct KvBenchOptions {
  std::string uri;               // a pool that does not exist yet; "": emu://bench-kv-PID
  std::vector<uint64_t> blocks;  // block sizes; empty: 16 KiB, 256 KiB, 2 MiB
  int hosts = 2;                 // 1 writer, hosts-1 readers (1: the writer reads too)
  int reps = 5;
  uint64_t working_set = 256ull << 20;  // bytes put per size and repetition
  int batch = 32;                       // items per BatchPut / BatchGet
  bool device = false;                  // values put from and got into GPU memory
  bool json = false;
};

// Prints the table (or JSON). Returns 0, or 1 with a message on stderr.
int RunKvBench(const KvBenchOptions& options);

}  // namespace cxlrt::bench
