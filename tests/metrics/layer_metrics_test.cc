// Each metric of the layers moves when its event happens (docs/metrics.md):
// KV per namespace, collectives per communicator, allocator, coherence.
// Emulated hosts in one process (each its own open of the pool); latency
// histograms time every call here (CXLRT_METRICS_SAMPLE=1, set before the
// first metric is timed).
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/sample_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt {
namespace {

using ::cxlrt::testing::Creating;
using ::cxlrt::testing::FindSample;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::Sample;

uint64_t CounterOf(const std::string& name, const runtime::Labels& want) {
  const std::vector<Sample> all = runtime::CollectMetrics();
  const Sample* s = FindSample(all, name, want);
  return s ? s->count : 0;
}
double GaugeOf(const std::string& name, const runtime::Labels& want) {
  const std::vector<Sample> all = runtime::CollectMetrics();
  const Sample* s = FindSample(all, name, want);
  return s ? s->gauge : -1;
}
uint64_t HistCountOf(const std::string& name, const runtime::Labels& want) {
  const std::vector<Sample> all = runtime::CollectMetrics();
  const Sample* s = FindSample(all, name, want);
  return s ? s->hist.count : 0;
}

class LayerMetricsTest : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() { setenv("CXLRT_METRICS_SAMPLE", "1", 1); }
  std::string Uri() { return PoolUri(dir_, absl::StrCat("coherence=", GetParam()), "64M"); }
  TempDir dir_;
};

TEST_P(LayerMetricsTest, KvCountersMoveWithPutsGetsLookupsAndEvictions) {
  const std::string uri = Uri();
  auto h = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h.ok()) << h.status();
  kv::StoreOptions so;
  so.create = true;
  so.hosts = 4;
  so.entries_per_host = 64;
  so.max_namespaces = 4;
  auto store = kv::Store::Open(*h->alloc, so);
  ASSERT_TRUE(store.ok()) << store.status();
  const runtime::Labels ns = {{"slot", absl::StrCat(h->alloc->slot())}, {"namespace", "m"}};
  std::vector<char> v(4096, 'x'), out(4096);
  ASSERT_TRUE((*store)->Put("m", "a", v.data(), 4096).ok());
  ASSERT_TRUE((*store)->Put("m", "b", v.data(), 100).ok());
  EXPECT_EQ(CounterOf("kv.puts", ns), 2u);
  EXPECT_EQ(CounterOf("kv.put_bytes", ns), 4196u);
  EXPECT_EQ(HistCountOf("kv.put_latency", ns), 2u);
  EXPECT_EQ(GaugeOf("kv.entries", ns), 2);
  EXPECT_EQ(GaugeOf("kv.stored_bytes", ns), 4196);

  ASSERT_TRUE((*store)->Get("m", "a", out.data(), out.size()).ok());
  ASSERT_TRUE((*store)->Get("m", "b", out.data(), out.size()).ok());
  EXPECT_FALSE((*store)->Get("m", "nope", out.data(), out.size()).ok());
  EXPECT_EQ(CounterOf("kv.hits", ns), 2u);
  EXPECT_EQ(CounterOf("kv.misses", ns), 1u);
  EXPECT_EQ(CounterOf("kv.get_bytes", ns), 4196u);
  EXPECT_EQ(HistCountOf("kv.get_latency", ns), 3u);
  EXPECT_DOUBLE_EQ(GaugeOf("kv.hit_rate", ns), 2.0 / 3.0);

  kv::PinSet pins;
  auto n = (*store)->Lookup("m", {"a", "b", "c"}, &pins);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(CounterOf("kv.lookups", ns), 1u);
  EXPECT_EQ(HistCountOf("kv.lookup_latency", ns), 1u);
  EXPECT_EQ(CounterOf("kv.hits", ns), 4u) << "a lookup counts the keys it found";
  EXPECT_EQ(CounterOf("kv.misses", ns), 2u) << "and a miss when it stopped short";
  EXPECT_EQ(GaugeOf("kv.pins_held", {{"slot", absl::StrCat(h->alloc->slot())}}), 2);
  (*store)->Release(pins);
  EXPECT_EQ(GaugeOf("kv.pins_held", {{"slot", absl::StrCat(h->alloc->slot())}}), 0);

  // A quota of 3 values: the fourth put evicts the oldest.
  ASSERT_TRUE((*store)->SetQuota("m", 3 * 4096).ok());
  EXPECT_EQ(GaugeOf("kv.quota_bytes", ns), 3 * 4096);
  EXPECT_DOUBLE_EQ(GaugeOf("kv.quota_use", ns), 4196.0 / (3 * 4096));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*store)->Put("m", absl::StrCat("q", i), v.data(), 4096).ok());
  }
  EXPECT_GE(CounterOf("kv.evictions", ns), 1u);
}

TEST_P(LayerMetricsTest, CollectiveCountersMoveWithCallsPerSizeBucket) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  auto h1 = ::cxlrt::testing::AttachTestHost(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(h1.ok()) << h1.status();
  ::cxlrt::testing::TestHost* hosts[2] = {&*h0, &*h1};
  std::vector<absl::Status> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      auto comm = collectives::Communicator::Create(*hosts[r]->alloc, "mc", 2, r);
      if (!comm.ok()) {
        errors[r] = comm.status();
        return;
      }
      std::vector<float> a(256, 1.0f), b(256);
      for (int i = 0; i < 5 && errors[r].ok(); ++i) {
        errors[r] = (*comm)->AllReduce(a.data(), b.data(), 2, collectives::DataType::kFloat32,
                                       collectives::RedOp::kSum);
      }
      if (errors[r].ok()) {
        errors[r] = (*comm)->AllReduce(a.data(), b.data(), 256, collectives::DataType::kFloat32,
                                       collectives::RedOp::kSum);
      }
      if (errors[r].ok()) {
        errors[r] = (*comm)->AllGather(a.data(), b.data(), 16, collectives::DataType::kFloat32);
      }
      if (errors[r].ok()) errors[r] = (*comm)->Barrier();
      // A send from rank 0 to rank 1 of 100 floats, counted on each side.
      if (errors[r].ok()) {
        errors[r] = r == 0 ? (*comm)->Send(a.data(), 100, collectives::DataType::kFloat32, 1)
                           : (*comm)->Recv(b.data(), 100, collectives::DataType::kFloat32, 0);
      }
      const runtime::Labels small = {{"slot", absl::StrCat(hosts[r]->alloc->slot())},
                                     {"communicator", "mc"},
                                     {"rank", absl::StrCat(r)},
                                     {"collective", "allreduce"},
                                     {"size_bucket", "64B"}};
      // Read before the communicator (and its metrics) goes.
      if (errors[r].ok() && CounterOf("collective.calls", small) != 5) {
        errors[r] = absl::InternalError(absl::StrCat(
            "rank ", r, " counted ", CounterOf("collective.calls", small), " small all-reduces"));
      }
      if (errors[r].ok() && CounterOf("collective.bytes", small) != 40) {
        errors[r] = absl::InternalError("small all-reduce bytes");
      }
      runtime::Labels kib = small;
      kib[4].value = "1KiB";
      if (errors[r].ok() &&
          (CounterOf("collective.calls", kib) != 1 || CounterOf("collective.bytes", kib) != 1024 ||
           CounterOf("collective.time", kib) == 0 ||
           CounterOf("collective.bus_bytes", kib) != 1024)) {
        errors[r] = absl::InternalError("the 1 KiB all-reduce's calls, bytes, time or bus bytes");
      }
      runtime::Labels ag = small;
      ag[3].value = "allgather";
      ag[4].value = "1KiB";
      if (errors[r].ok() && CounterOf("collective.bytes", ag) != 16 * 4 * 2) {
        errors[r] = absl::InternalError("all-gather bytes are nccl-tests' (count x ranks)");
      }
      runtime::Labels bar = small;
      bar[3].value = "barrier";
      if (errors[r].ok() && CounterOf("collective.calls", bar) < 1) {
        errors[r] = absl::InternalError("barrier calls");
      }
      runtime::Labels p2p = small;
      p2p[3].value = r == 0 ? "send" : "recv";
      p2p[4].value = "1KiB";
      if (errors[r].ok() &&
          (CounterOf("collective.calls", p2p) != 1 || CounterOf("collective.bytes", p2p) != 400)) {
        errors[r] =
            absl::InternalError(absl::StrCat("rank ", r, "'s ", p2p[3].value, " calls or bytes"));
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_TRUE(errors[0].ok()) << errors[0];
  EXPECT_TRUE(errors[1].ok()) << errors[1];
  // Gone with the communicators.
  EXPECT_EQ(CounterOf("collective.calls", {{"communicator", "mc"}}), 0u);
}

TEST_P(LayerMetricsTest, AllocatorCountsRemoteFreesAndBytesInUse) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  auto h1 = ::cxlrt::testing::AttachTestHost(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(h1.ok()) << h1.status();
  const runtime::Labels slot0 = {{"slot", absl::StrCat(h0->alloc->slot())}};
  const double before = GaugeOf("allocator.bytes_in_use", slot0);
  auto block = h0->alloc->Allocate(1 << 20);
  ASSERT_TRUE(block.ok());
  EXPECT_GE(GaugeOf("allocator.bytes_in_use", slot0), before + (1 << 20));
  const uint64_t remote = CounterOf("allocator.remote_frees", {});
  ASSERT_TRUE(h1->alloc->Free(*block).ok());
  EXPECT_EQ(CounterOf("allocator.remote_frees", {}), remote + 1);
}

TEST_P(LayerMetricsTest, CoherenceCountsFlushesWhereTheDomainKeepsThem) {
  const std::string uri = Uri();
  auto h = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h.ok()) << h.status();
  auto block = h->alloc->Allocate(4096);
  ASSERT_TRUE(block.ok());
  const uint64_t flushes = CounterOf("coherence.flushes", {});
  const uint64_t lines = CounterOf("coherence.flushed_lines", {});
  const uint64_t invalidates = CounterOf("coherence.invalidates", {});
  char buf[256] = {};
  h->pool->coherence().Publish(*block, buf, sizeof(buf));
  h->pool->coherence().Fetch(buf, *block, sizeof(buf));
  if (std::string(GetParam()) == "hardware") {
    // A fence each: not counted (docs/metrics.md). Background threads of
    // the hardware domain count nothing either.
    EXPECT_EQ(CounterOf("coherence.flushes", {}), flushes);
  } else {
    EXPECT_GE(CounterOf("coherence.flushes", {}), flushes + 1);
    EXPECT_GE(CounterOf("coherence.flushed_lines", {}), lines + 4);
    EXPECT_GE(CounterOf("coherence.invalidates", {}), invalidates + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Domains, LayerMetricsTest, ::testing::Values("hardware", "simulated"));

}  // namespace
}  // namespace cxlrt
