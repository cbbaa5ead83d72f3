// `cxlrt bench alloc`: allocate+free pairs per second of the pooled
// allocator for sizes 64 B to 1 MiB, on one host and on two hosts at once,
// and cross-host frees per second (one host allocates, another frees),
// beside glibc malloc (and mimalloc when installed) measured in the same
// process. Makes its own pool (hardware domain) and destroys it after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cxlrt::bench {

struct AllocBenchOptions {
  std::string uri;  // a pool that does not exist yet; "" : emu://bench-alloc-PID?size=1G
  int reps = 5;
  bool json = false;
  std::vector<uint64_t> sizes;  // empty: 64 B .. 1 MiB
};

// Prints the table (or JSON). Returns 0, or 1 with a message on stderr.
int RunAllocBench(const AllocBenchOptions& options);

}  // namespace cxlrt::bench
