// tests/testing/mem_buffer.h in a build without CUDA: no GPU buffer to fill.
#include "cxlrt/gpu/gpu.h"
#include "tests/testing/mem_buffer.h"

namespace cxlrt::testing {

absl::Status FillPatternAsync(void*, size_t, uint32_t, uint32_t, void*) {
  return absl::UnavailableError(gpu::GpuUnavailableReason());
}

}  // namespace cxlrt::testing
