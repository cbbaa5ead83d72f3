#include "bench/dma_bench.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "bench/harness.h"
#include "collectives/device.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {

using collectives::TimeCopies;

int RunDmaBench(const DmaBenchOptions& o) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "cxlrt bench dma: %s\n", what.c_str());
    return 1;
  };
  if (!collectives::DevicesAvailable()) {
    return fail("needs a GPU: " + collectives::DevicesUnavailableReason());
  }
  const uint64_t bytes = o.max_bytes;
  auto scratch = ScratchPool::Create(
      o.uri.empty() ? absl::StrCat("emu://bench-dma-", getpid()) : o.uri, 2 * bytes + (256 << 20));
  if (!scratch.ok()) return fail(scratch.status().ToString());
  auto host = AttachHost((*scratch)->open_uri(), AnySlot());
  if (!host.ok()) return fail(host.status().ToString());
  runtime::Pool& pool = *host->pool;
  uint8_t* base = pool.backend().base();
  auto a = host->alloc->Allocate(bytes, {.alignment = 4096});
  auto b = host->alloc->Allocate(bytes, {.alignment = 4096});
  if (!a.ok() || !b.ok()) return fail("pool buffers: " + (a.ok() ? b : a).status().ToString());
  uint8_t* pool_a = base + *a;
  uint8_t* pool_b = base + *b;
  std::memset(pool_a, 1, bytes);  // fault the pages in
  std::memset(pool_b, 1, bytes);
  auto engine = collectives::MakeDeviceEngine(pool.coherence(), base, pool.size());
  if (!engine.ok()) return fail(engine.status().ToString());
  auto dev_a = collectives::DeviceAlloc(bytes);
  auto dev_b = collectives::DeviceAlloc(bytes);
  auto pin_a = collectives::PinnedAlloc(bytes);
  auto pin_b = collectives::PinnedAlloc(bytes);
  if (!dev_a.ok() || !dev_b.ok() || !pin_a.ok() || !pin_b.ok()) return fail("buffers");
  std::memset(*pin_a, 2, bytes);
  std::memset(*pin_b, 3, bytes);

  std::string header = collectives::DescribeDevices(nullptr, 0);
  if (!o.json) {
    std::printf("# cxlrt bench dma: %s", header.c_str());
    std::printf("# GB/s = bytes / time of one copy (both: the two directions' bytes together)\n");
    std::printf("%10s %9s %9s %9s %9s %9s %9s %9s %7s %7s %7s\n", "size", "pin-h2d", "pin-d2h",
                "pin-both", "pool-h2d", "pool-d2h", "pool-both", "d2d", "h2d", "d2h", "both");
    std::printf("%10s %9s %9s %9s %9s %9s %9s %9s %7s %7s %7s\n", "(B)", "(GB/s)", "(GB/s)",
                "(GB/s)", "(GB/s)", "(GB/s)", "(GB/s)", "(GB/s)", "pool/pin", "pool/pin",
                "pool/pin");
  }
  for (uint64_t n = o.min_bytes; n <= o.max_bytes; n *= 4) {
    auto rate = [&](void* dst, const void* src, void* rdst = nullptr,
                    const void* rsrc = nullptr) -> double {
      auto s = TimeCopies(dst, src, n, o.iters, rdst, rsrc);
      if (!s.ok() || *s <= 0) return 0;
      return (rdst ? 2.0 : 1.0) * static_cast<double>(n) / *s / 1e9;
    };
    const double pin_h2d = rate(*dev_a, *pin_a);
    const double pin_d2h = rate(*pin_b, *dev_b);
    const double pin_both = rate(*dev_a, *pin_a, *pin_b, *dev_b);
    const double pool_h2d = rate(*dev_a, pool_a);
    const double pool_d2h = rate(pool_b, *dev_b);
    const double pool_both = rate(*dev_a, pool_a, pool_b, *dev_b);
    // Device to device: bytes read plus written, as copy rates are quoted.
    const double d2d = 2 * rate(*dev_b, *dev_a);
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0; };
    if (o.json) {
      nlohmann::json j = {{"bytes", n},
                          {"pinned_h2d_gbps", pin_h2d},
                          {"pinned_d2h_gbps", pin_d2h},
                          {"pinned_both_gbps", pin_both},
                          {"pool_h2d_gbps", pool_h2d},
                          {"pool_d2h_gbps", pool_d2h},
                          {"pool_both_gbps", pool_both},
                          {"d2d_gbps", d2d}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%10lu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.1f %7.2f %7.2f %7.2f\n",
                  static_cast<unsigned long>(n), pin_h2d, pin_d2h, pin_both, pool_h2d, pool_d2h,
                  pool_both, d2d, ratio(pool_h2d, pin_h2d), ratio(pool_d2h, pin_d2h),
                  ratio(pool_both, pin_both));
    }
  }
  collectives::DeviceFree(*dev_a);
  collectives::DeviceFree(*dev_b);
  collectives::PinnedFree(*pin_a);
  collectives::PinnedFree(*pin_b);
  return 0;
}

}  // namespace cxlrt::bench
