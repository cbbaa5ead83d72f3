// `cxlrt bench alltoallv`: the all-to-all-v of an MoE layer over the pool.
// Every rank routes its tokens (bf16 hidden states) to experts with a
// skewed distribution and a fixed seed (bench/moe_routing.h), so the pieces
// between ranks are uneven, zeros possible; then times the dispatch (each
// token to the ranks of its experts) and the combine (the same pieces
// back, the reverse splits), each call on its own, and prints the median
// of the slowest rank's time per call, beside this machine's memcpy
// bandwidth measured in the same run. bench/compare/alltoallv.sh runs Open
// MPI's MPI_Alltoallv on the same splits. Starts its ranks itself as
// emulated hosts (forked processes).
#pragma once

#include <cstdint>
#include <string>

namespace cxlrt::bench {

struct AllToAllVBenchOptions {
  int tokens = 4096;  // per rank
  int hidden = 2048;  // bf16 elements per token
  int experts_per_rank = 8;
  int topk = 1;
  std::string skew = "zipf:1.2";  // uniform, zipf:S, hot:K:F (bench/moe_routing.h)
  uint64_t seed = 1;
  int ranks = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool in_pool = false;  // buffers from comm.Allocate: sends posted in place
  std::string pool;      // "": emu://bench-a2av-PID (made and destroyed)
  bool json = false;
};

// Prints the table (or JSON lines). Returns 0, or 1 with a message on stderr
// (also when an element arrived wrong).
int RunAllToAllVBench(const AllToAllVBenchOptions& options);

}  // namespace cxlrt::bench
