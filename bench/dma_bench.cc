#include "bench/dma_bench.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_timing.h"
#include "bench/harness.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {

namespace {

// The pool of a GPU benchmark, made for the run: two buffers of `bytes`
// (pages faulted in) and a page for flags, the mapping registered with
// CUDA by the engine (kept with it).
struct GpuPool {
  std::unique_ptr<ScratchPool> scratch;
  AttachedHost host;
  std::unique_ptr<gpu::DmaEngine> engine;
  uint8_t* a = nullptr;
  uint8_t* b = nullptr;
  uint8_t* flags = nullptr;
};

absl::StatusOr<GpuPool> MakeGpuPool(const std::string& uri, const char* bench, uint64_t bytes) {
  if (!gpu::GpuAvailable()) {
    return absl::UnavailableError("needs a GPU: " + gpu::GpuUnavailableReason());
  }
  GpuPool g;
  CXLRT_ASSIGN_OR_RETURN(
      g.scratch,
      ScratchPool::Create(uri.empty() ? absl::StrCat("emu://bench-", bench, "-", getpid()) : uri,
                          2 * bytes + (256 << 20)));
  CXLRT_ASSIGN_OR_RETURN(g.host, AttachHost(g.scratch->open_uri(), AnySlot()));
  runtime::Pool& pool = *g.host.pool;
  uint8_t* base = pool.backend().base();
  auto a = g.host.alloc->Allocate(bytes, {.alignment = 4096});
  auto b = g.host.alloc->Allocate(bytes, {.alignment = 4096});
  auto flags = g.host.alloc->Allocate(4096, {.alignment = 4096});
  for (const auto* st : {&a, &b, &flags}) {
    if (!st->ok()) return absl::ResourceExhaustedError("pool buffers: " + st->status().ToString());
  }
  g.a = base + *a;
  g.b = base + *b;
  g.flags = base + *flags;
  std::memset(g.a, 1, bytes);  // fault the pages in
  std::memset(g.b, 1, bytes);
  std::memset(g.flags, 0, 4096);
  CXLRT_ASSIGN_OR_RETURN(g.engine, gpu::MakeDmaEngine(pool.coherence(), base, pool.size()));
  return g;
}

}  // namespace

int RunDmaBench(const DmaBenchOptions& o) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "cxlrt bench dma: %s\n", what.c_str());
    return 1;
  };
  const uint64_t bytes = o.max_bytes;
  auto mapped = MakeGpuPool(o.uri, "dma", bytes);
  if (!mapped.ok()) return fail(std::string(mapped.status().message()));
  uint8_t* pool_a = mapped->a;
  uint8_t* pool_b = mapped->b;
  auto dev_a = gpu::GpuAlloc(bytes);
  auto dev_b = gpu::GpuAlloc(bytes);
  auto pin_a = gpu::PageLockedAlloc(bytes);
  auto pin_b = gpu::PageLockedAlloc(bytes);
  if (!dev_a.ok() || !dev_b.ok() || !pin_a.ok() || !pin_b.ok()) return fail("buffers");
  std::memset(*pin_a, 2, bytes);
  std::memset(*pin_b, 3, bytes);

  std::string header = gpu::DescribeGpus(nullptr, 0);
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
  gpu::GpuFree(*dev_a);
  gpu::GpuFree(*dev_b);
  gpu::PageLockedFree(*pin_a);
  gpu::PageLockedFree(*pin_b);
  return 0;
}

int RunDoorbellBench(const DoorbellBenchOptions& o) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "cxlrt bench doorbell: %s\n", what.c_str());
    return 1;
  };
  if (o.min_bytes < 8 || o.min_bytes % 8 != 0 || o.max_bytes < o.min_bytes || o.factor < 2) {
    return fail("sizes must be multiples of 8 bytes, -b <= -e, and -f at least 2");
  }
  const uint64_t bytes = o.max_bytes;
  auto mapped = MakeGpuPool(o.uri, "doorbell", bytes);
  if (!mapped.ok()) return fail(std::string(mapped.status().message()));
  // The flags on lines (and prefetch pairs) of their own.
  auto* flag_a = reinterpret_cast<uint64_t*>(mapped->flags);
  auto* flag_b = reinterpret_cast<uint64_t*>(mapped->flags + 256);
  auto dev = gpu::GpuAlloc(bytes);
  auto pin = gpu::PageLockedAlloc(bytes);
  if (!dev.ok() || !pin.ok()) return fail("buffers");

  if (!o.json) {
    std::printf("# cxlrt bench doorbell: %s", gpu::DescribeGpus(nullptr, 0).c_str());
    std::printf(
        "# us per hop (device -> pool, doorbell, pool -> device), median of %d runs of %d "
        "round trips; copies: the GPU time of the hop's two copies alone\n",
        o.reps, o.rounds);
    std::printf("%10s %9s", "size", "copies");
    for (Doorbell d : kDoorbells) {
      std::printf(" %9s", DoorbellName(d));
    }
    std::printf(" %7s\n", "#wrong");
  }
  for (uint64_t n = o.min_bytes; n <= o.max_bytes; n *= o.factor) {
    auto out = TimeCopies(*pin, *dev, n, 20);
    auto in = TimeCopies(*dev, *pin, n, 20);
    const double copies_us = out.ok() && in.ok() ? (*out + *in) * 1e6 : 0;
    nlohmann::json j = {{"bytes", n}, {"copies_us", copies_us}};
    uint64_t wrong = 0;
    std::string line = absl::StrFormat("%10lu %9.2f", static_cast<unsigned long>(n), copies_us);
    for (Doorbell d : kDoorbells) {
      auto t = TimePingPong(d, mapped->a, mapped->b, flag_a, flag_b, n, o.rounds, o.reps);
      const std::string name = DoorbellName(d);
      if (t.ok()) {
        wrong += t->wrong_bytes;
        j[name + "_us"] = t->hop_seconds * 1e6;
        line += absl::StrFormat(" %9.2f", t->hop_seconds * 1e6);
      } else {
        j[name + "_error"] = t.status().ToString();
        line += absl::StrFormat(" %9s", "n/a");
        std::fprintf(stderr, "# %s at %lu bytes: %s\n", name.c_str(), static_cast<unsigned long>(n),
                     t.status().ToString().c_str());
      }
    }
    j["wrong_bytes"] = wrong;
    if (o.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s %7lu\n", line.c_str(), static_cast<unsigned long>(wrong));
    }
    std::fflush(stdout);
    if (n > o.max_bytes / o.factor) break;  // no overflow past the last size
  }
  gpu::GpuFree(*dev);
  gpu::PageLockedFree(*pin);
  return 0;
}

}  // namespace cxlrt::bench
