// bench/gpu_timing.h in a build without CUDA: no GPU to time.
#include "bench/gpu_timing.h"
#include "cxlrt/gpu/gpu.h"

namespace cxlrt::bench {
namespace {

absl::Status NoGpu() { return absl::UnavailableError(gpu::GpuUnavailableReason()); }

}  // namespace

absl::StatusOr<double> TimeCopies(void*, const void*, size_t, int, void*, const void*) {
  return NoGpu();
}

absl::StatusOr<PingPongTimes> TimePingPong(Doorbell, uint8_t*, uint8_t*, uint64_t*, uint64_t*,
                                           size_t, int, int) {
  return NoGpu();
}

}  // namespace cxlrt::bench
