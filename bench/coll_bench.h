// `cxlrt bench <collective>`: nccl-tests for cxlrt. Sizes from -b to -e
// (times -f each step), -w warm-up and -n timed iterations each, out of
// place and in place; prints nccl-tests' columns (size, count, type,
// redop, root, time, algbw, busbw, #wrong) and busbw as a fraction of this
// machine's memcpy bandwidth, measured at the start of the same run.
// Starts its ranks itself as emulated hosts (forked processes), or runs as
// one rank when a launcher set the rank (mpirun, srun, torchrun, cxlrt run).
#pragma once

#include <cstdint>
#include <string>

namespace cxlrt::bench {

struct CollBenchOptions {
  std::string collective;  // allreduce, reducescatter, allgather, broadcast, reduce,
                           // gather, scatter, alltoall, sendrecv
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64 << 20;
  uint64_t factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int ranks = 2;
  std::string pool;  // "": emu://bench-coll-PID?size=... (made and destroyed)
  std::string type = "float";
  std::string op = "sum";
  int root = 0;
  bool in_pool = false;  // buffers from comm.Allocate: zero-copy
  bool device = false;   // buffers in GPU memory (the CUDA engine)
  bool json = false;
};

// Prints the table (or JSON lines). Returns 0, or 1 with a message on stderr.
int RunCollBench(const CollBenchOptions& options);

}  // namespace cxlrt::bench
