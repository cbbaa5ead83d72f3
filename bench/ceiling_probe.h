// `cxlrt bench ceiling`: the limit the 2-rank all-reduce is held against.
// Two forked processes share a memfd and run a two-shot float sum with the
// same kernels as cxlrt (non-temporal copies into shared slots, the
// vectorised reduction, vector copies out) and the least protocol that can
// work: one atomic flag per phase and chunk, spinning, no call
// descriptors, no membership, no deadlines, no allocator. What cxlrt loses
// against it is the price of its protocol; what it gains is a better
// algorithm. Prints nccl-tests' busbw per size (JSON with --json).
#pragma once

#include <cstdint>

namespace cxlrt::bench {

struct CeilingOptions {
  uint64_t min_bytes = 64 << 10;
  uint64_t max_bytes = 64 << 20;
  uint64_t factor = 2;
  uint64_t chunk_bytes = 1 << 20;
  int iters = 20;
  int warmup = 5;
  bool json = false;
};

// Returns 0, or 1 with a message on stderr (a wrong sum included).
int RunCeilingProbe(const CeilingOptions& options);

}  // namespace cxlrt::bench
