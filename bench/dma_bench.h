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

}  // namespace cxlrt::bench
