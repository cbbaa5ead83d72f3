// cxlrt/collectives/gpu_engine.h in a build without CUDA: the gpu/ layer
// says why there is no GPU.
#include "cxlrt/collectives/gpu_engine.h"
#include "cxlrt/gpu/dma_engine.h"

namespace cxlrt::collectives {

absl::StatusOr<std::unique_ptr<GpuCopyEngine>> MakeGpuCopyEngine(runtime::Coherence& c,
                                                                 uint8_t* base, uint64_t size) {
  auto dma = gpu::MakeDmaEngine(c, base, size);  // never OK without CUDA
  if (!dma.ok()) return dma.status();
  return absl::InternalError("a DMA engine in a build without CUDA");
}

}  // namespace cxlrt::collectives
