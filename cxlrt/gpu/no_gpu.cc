// cxlrt/gpu/ in a build without CUDA: no GPU, every pointer is host
// memory, and every call that needs a GPU says so.
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/gpu/registration.h"

namespace cxlrt::gpu {
namespace {

constexpr char kWhy[] =
    "cxlrt was built without CUDA (no toolkit found at configure time; see docs/gpu.md)";

absl::Status NoGpu() { return absl::UnavailableError(kWhy); }

}  // namespace

bool GpuAvailable() { return false; }
std::string GpuUnavailableReason() { return kWhy; }
runtime::MemoryKind KindOf(const void*) { return runtime::MemoryKind::kHost; }

std::string DescribeGpus(uint8_t*, uint64_t) { return std::string("no device: ") + kWhy; }

absl::StatusOr<std::shared_ptr<PoolRegistration>> PoolRegistration::Get(uint8_t*, uint64_t) {
  return NoGpu();
}
PoolRegistration::~PoolRegistration() = default;

absl::StatusOr<std::unique_ptr<DmaEngine>> MakeDmaEngine(runtime::Coherence&, uint8_t*, uint64_t) {
  return NoGpu();
}

absl::StatusOr<void*> GpuAlloc(size_t) { return NoGpu(); }
void GpuFree(void*) {}
absl::StatusOr<void*> PageLockedAlloc(size_t) { return NoGpu(); }
void PageLockedFree(void*) {}
absl::Status CopySync(void*, const void*, size_t) { return NoGpu(); }
absl::StatusOr<void*> StreamCreate() { return NoGpu(); }
void StreamDestroy(void*) {}
absl::Status StreamSynchronize(void*) { return NoGpu(); }
absl::Status CopyAsync(void*, const void*, size_t, void*) { return NoGpu(); }

}  // namespace cxlrt::gpu
