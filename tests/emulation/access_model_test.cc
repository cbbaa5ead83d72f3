// The latency / bandwidth model: delay is injected, and a device's
// bandwidth is shared between the emulated hosts using it. Bounds are
// orders of magnitude or guaranteed minimums, never tight timings: the
// figures belong to `cxlrt bench pool`.
#include "cxlrt/emulation/access_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <vector>

#include "cxlrt/emulation/shm_backend.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::emulation {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::WaitExit;
using runtime::NowNs;
using runtime::Pool;
using runtime::PoolOffset;

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

TEST(AccessModelTest, PresetsAndExplicitValuesCombine) {
  auto uri = runtime::ParsePoolUri("emu://m?model=switch&latency_ns=900");
  CXLRT_ASSERT_OK(uri);
  ModelParams p = ModelFromUri(*uri);
  EXPECT_EQ(p.preset, "switch");
  EXPECT_EQ(p.latency_ns, 900u) << "an explicit value overrides the preset";
  EXPECT_EQ(p.bw_gbps, FindModelPreset("switch")->bw_gbps);
  EXPECT_GE(FindModelPreset("switch")->latency_ns, 650u);
  EXPECT_LE(FindModelPreset("switch")->latency_ns, 800u);
  EXPECT_EQ(FindModelPreset("nonsense"), nullptr);
}

TEST(AccessModelTest, WithoutAModelNothingIsCharged) {
  TempDir dir;
  auto pool = Pool::Create(PoolUri(dir));
  CXLRT_ASSERT_OK(pool);
  EXPECT_EQ((*pool)->coherence().model(), nullptr);
}

TEST(AccessModelTest, EveryLoadWaitsTheConfiguredLatency) {
  TempDir dir;
  auto pool = Pool::Create(PoolUri(dir, "latency_ns=20000"));  // 20 us
  CXLRT_ASSERT_OK(pool);
  ASSERT_NE((*pool)->coherence().model(), nullptr);
  EXPECT_NE((*pool)->coherence().model()->Describe().find("latency 20000 ns"), std::string::npos);
  runtime::Coherence& c = (*pool)->coherence();
  const PoolOffset x = (*pool)->header().heap_offset;
  uint64_t v;
  // Lower bounds hold on every try; upper bounds are checked on the best of
  // a few tries, so a loaded machine's preemptions cannot fail them.
  int64_t best_loads = INT64_MAX, best_stores = INT64_MAX;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int64_t t0 = NowNs();
    for (int i = 0; i < 50; ++i) c.Read(&v, x, sizeof(v));
    const int64_t elapsed = NowNs() - t0;
    // (A back-to-back chain may start up to 200 ns before its first call.)
    EXPECT_GE(elapsed, 50 * 20000 - 200) << "50 loads of 20 us took " << Ms(elapsed) << " ms";
    best_loads = std::min(best_loads, elapsed);
    // Stores are posted: no round trip.
    const int64_t t1 = NowNs();
    for (int i = 0; i < 50; ++i) c.Write(x, &v, sizeof(v));
    best_stores = std::min(best_stores, NowNs() - t1);
  }
  EXPECT_LT(best_loads, 50 * 20000 * 20) << "far more delay than modeled";
  EXPECT_LT(best_stores, 50 * 20000 / 2) << "plain stores waited for the device";
}

TEST(AccessModelTest, BandwidthLimitsAStream) {
  TempDir dir;
  auto pool = Pool::Create(PoolUri(dir, "bw_gbps=0.5", "16M"));  // 0.5 GB/s
  CXLRT_ASSERT_OK(pool);
  std::vector<char> buf(2 << 20, 'x');
  const double modeled = buf.size() / 0.5;  // ns
  int64_t best = INT64_MAX;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t t0 = NowNs();
    (*pool)->coherence().CopyToPool((*pool)->header().heap_offset, buf.data(), buf.size());
    const int64_t elapsed = NowNs() - t0;
    EXPECT_GE(elapsed, modeled * 0.99) << Ms(elapsed) << " ms for 2 MiB at 0.5 GB/s";
    best = std::min(best, elapsed);
  }
  EXPECT_LT(best, modeled * 10);
}

// Host processes each copying `bytes` at `offsets` through their own open
// of `uri`, started together; returns the time from the start until the
// last copy finished (as the hosts clocked it, not their exits).
int64_t ConcurrentCopies(const std::string& uri, const std::vector<PoolOffset>& offsets,
                         size_t bytes) {
  auto* ends = static_cast<int64_t*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  EXPECT_NE(ends, MAP_FAILED);
  std::vector<pid_t> pids;
  // Everyone starts together, once set up (opening pre-faults the pool and
  // a fresh buffer faults in: tens of milliseconds in our VMs).
  const int64_t start = NowNs() + 500'000'000;
  for (size_t i = 0; i < offsets.size(); ++i) {
    pids.push_back(Spawn([&, i] {
      auto p = Pool::Open(uri);
      if (!p.ok()) return 3;
      std::vector<char> buf(bytes, 'y');
      if (NowNs() > start) return 4;  // set-up took too long: timing would be wrong
      WaitUntilNs(start);
      (*p)->coherence().CopyToPool(offsets[i], buf.data(), buf.size());
      ends[i] = NowNs();
      return 0;
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(WaitExit(pid), 0);
  int64_t last = start;
  for (size_t i = 0; i < offsets.size(); ++i) last = std::max(last, ends[i]);
  munmap(ends, 4096);
  return last - start;
}

TEST(AccessModelTest, TwoHostsOnOneDeviceShareItsBandwidth) {
  TempDir dir;
  std::string uri = PoolUri(dir, "bw_gbps=0.5", "32M");
  auto pool = Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  const PoolOffset heap = (*pool)->header().heap_offset;
  const size_t bytes = 4 << 20;
  const int64_t both = ConcurrentCopies(OpenUri(uri) + "&bw_gbps=0.5", {heap, heap + bytes}, bytes);
  const double one_alone = bytes / 0.5;
  // The device's link is reserved atomically, so two streams can never
  // finish faster than the link carries both.
  EXPECT_GE(both, 2 * one_alone * 0.99)
      << "2 x 4 MiB at 0.5 GB/s shared took " << Ms(both) << " ms";
  EXPECT_LT(both, 2 * one_alone * 50);
}

// Each device's link is its own clock in the model's shared file: traffic
// to one device never takes time on another's (checked on the clocks, not
// on wall time, so a loaded machine cannot make it flaky).
TEST(AccessModelTest, EachDeviceHasItsOwnBandwidth) {
  TempDir dir;
  std::string uri = PoolUri(dir, "bw_gbps=1&devices=2", "64M");
  auto pool = Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  ASSERT_EQ((*pool)->devices().count(), 2u);
  const std::string clocks_path = ShmModelPath(*runtime::ParsePoolUri(uri));
  auto clock = [&](int d) {
    int64_t v = 0;
    FILE* f = fopen(clocks_path.c_str(), "rb");
    EXPECT_NE(f, nullptr);
    if (f) {
      fseek(f, d * 128, SEEK_SET);
      EXPECT_EQ(fread(&v, sizeof(v), 1, f), 1u);
      fclose(f);
    }
    return v;
  };
  std::vector<char> buf(1 << 20, 'z');
  const int64_t d0 = clock(0), d1 = clock(1);
  const int64_t start = NowNs();
  (*pool)->coherence().CopyToPool((*pool)->HeapOnDevice(1).first, buf.data(), buf.size());
  EXPECT_EQ(clock(0), d0) << "traffic to device 1 took time on device 0";
  EXPECT_GE(clock(1) - std::max(d1, start), static_cast<int64_t>(buf.size() / 1.0) - 1);
  // A copy across the boundary is charged to both, each its own bytes.
  const PoolOffset boundary = (*pool)->devices().Span(1).first;
  const int64_t before0 = clock(0), before1 = clock(1);
  (*pool)->coherence().CopyToPool(boundary - 4096, buf.data(), 8192);
  EXPECT_GT(clock(0), before0);
  EXPECT_GT(clock(1), before1);
}

}  // namespace
}  // namespace cxlrt::emulation
