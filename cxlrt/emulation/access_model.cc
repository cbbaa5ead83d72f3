#include "cxlrt/emulation/access_model.h"

#include <fcntl.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlrt/emulation/shm_backend.h"
#include "cxlrt/runtime/memory_backend.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/pool_layout.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::emulation {
namespace {

using runtime::PoolOffset;

// Reservations are cut into chunks so that two streams on one device
// interleave instead of one taking the link for a whole large copy.
constexpr uint64_t kChunk = 64 * 1024;
// Device clocks sit 128 B apart (one line each, no shared prefetch pair).
constexpr size_t kClockStride = 128;
constexpr size_t kClockFileSize = runtime::kMaxDevices * kClockStride;
// An access that starts this soon after the same thread's previous one
// ended is back-to-back (see Complete).
constexpr int64_t kBackToBackNs = 200;

constexpr ModelPreset kPresets[] = {
    {"switch", 750, 25.0, "a pool behind a CXL switch: 650-800 ns loads, 20-36 GB/s per x8 device"},
    {"direct", 250, 30.0, "a directly attached CXL expander: 2-3x local DRAM latency"},
};

class DeviceModel final : public runtime::AccessModel {
 public:
  DeviceModel(const ModelParams& p, const runtime::DeviceMap& devices, uint8_t* clocks)
      : params_(p),
        ns_per_byte_(p.bw_gbps > 0 ? 1.0 / p.bw_gbps : 0.0),
        single_device_(devices.count() == 1),
        devices_(devices),
        clocks_(clocks) {}
  ~DeviceModel() override {
    if (clocks_) munmap(clocks_, kClockFileSize);
  }

  void Complete(PoolOffset off, size_t bytes, bool round_trip, int64_t start_ns) override {
    // Back-to-back accesses of one thread (a pointer chase, a poll loop) are
    // timed from the end of the previous one: the few tens of nanoseconds
    // the emulator itself spends between them are not the device's.
    thread_local const DeviceModel* last_model = nullptr;
    thread_local int64_t last_end = 0;
    int64_t t = start_ns;
    if (last_model == this && start_ns - last_end < kBackToBackNs) t = std::min(t, last_end);
    if (ns_per_byte_ > 0 && bytes > 0) {
      // Walk the range device by device, chunk by chunk (no allocation:
      // this runs on every access).
      const PoolOffset end = off + bytes;
      while (off < end) {
        const uint32_t device = single_device_ ? 0 : devices_.DeviceOf(off);
        const uint64_t len =
            single_device_ ? std::min(kChunk, end - off)
                           : std::min({kChunk, end - off, devices_.Span(device).second - off});
        const int64_t cost = std::llround(static_cast<double>(len) * ns_per_byte_);
        std::atomic_ref<int64_t> clock(
            *reinterpret_cast<int64_t*>(clocks_ + device * kClockStride));
        // The link is busy until `clock`; take the next `cost` of it.
        int64_t busy = clock.load(std::memory_order_relaxed);
        int64_t done;
        do {
          done = std::max(busy, t) + cost;
        } while (!clock.compare_exchange_weak(busy, done, std::memory_order_relaxed));
        t = done;
        off += len;
        if (off < end) WaitUntilNs(t);  // let other hosts' chunks in
      }
    }
    if (round_trip) t += params_.latency_ns;
    WaitUntilNs(t);
    last_model = this;
    last_end = t;
  }

  std::string Describe() const override {
    std::string out = absl::StrCat("latency ", params_.latency_ns, " ns, ");
    if (params_.bw_gbps > 0) {
      absl::StrAppend(&out, absl::StrFormat("%.3g GB/s", params_.bw_gbps), " per device");
    } else {
      absl::StrAppend(&out, "unlimited bandwidth");
    }
    if (devices_.count() > 1) absl::StrAppend(&out, " x ", devices_.count(), " devices");
    if (!params_.preset.empty()) absl::StrAppend(&out, " (preset ", params_.preset, ")");
    return out;
  }

 private:
  const ModelParams params_;
  const double ns_per_byte_;
  const bool single_device_;
  const runtime::DeviceMap devices_;
  uint8_t* const clocks_;  // shared file of device clocks, null without bandwidth
};

absl::StatusOr<std::unique_ptr<runtime::AccessModel>> FromUri(const runtime::PoolUri& uri,
                                                              const runtime::DeviceMap& devices) {
  if (uri.scheme != runtime::PoolScheme::kEmu) {
    return absl::InvalidArgumentError(
        absl::StrCat("the latency/bandwidth model is for emulated pools, not ", uri.Identity()));
  }
  return MakeAccessModel(ModelFromUri(uri), devices, ShmModelPath(uri));
}

[[maybe_unused]] const bool kRegistered = [] {
  RegisterAccessModel();
  return true;
}();

}  // namespace

const ModelPreset* FindModelPreset(const std::string& name) {
  for (const ModelPreset& p : kPresets) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

ModelParams ModelFromUri(const runtime::PoolUri& uri) {
  ModelParams p;
  if (uri.model) {
    if (const ModelPreset* preset = FindModelPreset(*uri.model)) {
      p.preset = preset->name;
      p.latency_ns = preset->latency_ns;
      p.bw_gbps = preset->bw_gbps;
    }
  }
  if (uri.latency_ns) p.latency_ns = *uri.latency_ns;
  if (uri.bw_gbps) p.bw_gbps = *uri.bw_gbps;
  return p;
}

absl::StatusOr<std::unique_ptr<runtime::AccessModel>> MakeAccessModel(
    const ModelParams& params, const runtime::DeviceMap& devices, const std::string& clock_path) {
  uint8_t* clocks = nullptr;
  if (params.bw_gbps > 0) {
    int fd = open(clock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return runtime::ErrnoStatus(errno,
                                  absl::StrCat("cannot open the model's clock file ", clock_path));
    }
    // Every opener sizes it the same; a fresh file reads as idle clocks (0).
    struct stat st;
    if (fstat(fd, &st) != 0 ||
        (static_cast<size_t>(st.st_size) < kClockFileSize && ftruncate(fd, kClockFileSize) != 0)) {
      int err = errno;
      close(fd);
      return runtime::ErrnoStatus(err, absl::StrCat("cannot size ", clock_path));
    }
    void* p = mmap(nullptr, kClockFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
      return runtime::ErrnoStatus(err, absl::StrCat("cannot map ", clock_path));
    }
    clocks = static_cast<uint8_t*>(p);
  }
  return std::unique_ptr<runtime::AccessModel>(new DeviceModel(params, devices, clocks));
}

void WaitUntilNs(int64_t deadline_ns) {
  for (int64_t now = runtime::NowNs(); now < deadline_ns; now = runtime::NowNs()) {
    // Long waits sleep most of the way; the last stretch spins for accuracy.
    if (deadline_ns - now > 200000) {
      const int64_t sleep_ns = deadline_ns - now - 100000;
      timespec ts{static_cast<time_t>(sleep_ns / 1000000000),
                  static_cast<long>(sleep_ns % 1000000000)};
      nanosleep(&ts, nullptr);
    } else if (deadline_ns - now > 2000) {
      _mm_pause();  // ~140 cycles on recent Intel cores: too coarse near the end
    }
  }
}

void RegisterAccessModel() { runtime::RegisterAccessModelFactory(&FromUri); }

}  // namespace cxlrt::emulation
