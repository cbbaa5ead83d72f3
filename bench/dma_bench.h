// `cxlrt bench dma`: the GPU data path's limits. Per size: pool <-> device
// DMA (one direction, and both at once), beside pinned cudaMemcpy host <->
// device (the reference the targets are set against) and the
// device-to-device copy rate, as GB/s and pool/pinned ratios, all in one
// run. Makes its own pool. Needs a GPU (says why not otherwise).
#pragma once

#include <cstdint>
#include <string>

namespace cxlrt::bench {

struct DmaBenchOptions {
  std::string uri;  // a pool that does not exist yet; "": emu://bench-dma-PID
  uint64_t min_bytes = 64 << 10;
  uint64_t max_bytes = 256 << 20;
  int iters = 20;
  bool json = false;
};

int RunDmaBench(const DmaBenchOptions& options);

// `cxlrt bench doorbell`: per size, the one-way latency of a hop through the
// pool (device -> pool copy, the doorbell, pool -> device copy) with each
// way of ringing and hearing a doorbell (bench/gpu_timing.h), beside the
// GPU time of the hop's two copies alone (the floor), and the bytes that
// came back wrong. Makes its own pool. Needs a GPU.
struct DoorbellBenchOptions {
  std::string uri;  // a pool that does not exist yet; "": emu://bench-doorbell-PID
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 1 << 20;
  uint64_t factor = 8;
  int rounds = 200;  // round trips per run
  int reps = 5;      // runs per size and doorbell (median)
  bool json = false;
};

int RunDoorbellBench(const DoorbellBenchOptions& options);

}  // namespace cxlrt::bench
