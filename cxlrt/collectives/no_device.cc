// cxlrt/collectives/device.h in a build without CUDA: no device, and every
// function that needs one says so.
#include "cxlrt/collectives/device.h"

namespace cxlrt::collectives {
namespace {

constexpr char kWhy[] =
    "cxlrt was built without CUDA (no toolkit found at configure time; see docs/gpu.md)";

absl::Status NoDevice() { return absl::UnavailableError(kWhy); }

}  // namespace

bool DevicesAvailable() { return false; }
std::string DevicesUnavailableReason() { return kWhy; }
MemoryKind KindOf(const void*) { return MemoryKind::kHost; }

absl::StatusOr<std::unique_ptr<DeviceEngine>> MakeDeviceEngine(runtime::Coherence&, uint8_t*,
                                                               uint64_t) {
  return NoDevice();
}

std::string DescribeDevices(uint8_t*, uint64_t) { return std::string("no device: ") + kWhy; }

absl::StatusOr<void*> DeviceAlloc(size_t) { return NoDevice(); }
void DeviceFree(void*) {}
absl::StatusOr<void*> PinnedAlloc(size_t) { return NoDevice(); }
void PinnedFree(void*) {}
absl::Status DeviceCopy(void*, const void*, size_t) { return NoDevice(); }
absl::StatusOr<void*> StreamCreate() { return NoDevice(); }
void StreamDestroy(void*) {}
absl::Status StreamSynchronize(void*) { return NoDevice(); }
absl::Status CopyAsync(void*, const void*, size_t, void*) { return NoDevice(); }
absl::Status FillPatternAsync(void*, size_t, uint32_t, uint32_t, void*) { return NoDevice(); }
absl::StatusOr<double> TimeCopies(void*, const void*, size_t, int, void*, const void*) {
  return NoDevice();
}

absl::StatusOr<PingPongTimes> TimePingPong(Doorbell, uint8_t*, uint8_t*, uint64_t*, uint64_t*,
                                           size_t, int, int) {
  return NoDevice();
}

}  // namespace cxlrt::collectives
