// Pool-wide metrics (cxlrt/metrics/pool_metrics.h): hosts publish into
// their areas of the pool and a reader that is not attached sees every
// host's, labelled with its slot; snapshots are consistent while a host
// rewrites its area; corrupt areas and encodings are reported, never read
// out of bounds. In the hardware and simulated coherence domains.
#include "cxlrt/metrics/pool_metrics.h"

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/prometheus.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/sample_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::metrics {
namespace {

using ::cxlrt::testing::Creating;
using ::cxlrt::testing::FindSample;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::Sample;

TEST(EncodingTest, SamplesRoundTrip) {
  std::vector<Sample> in;
  in.push_back(runtime::CounterSample({"a.b", "calls", "help a"}, {{"k", "v\"1"}}, 7));
  in.push_back(runtime::CounterSample({"a.b", "calls", "help a"}, {{"k", "w"}}, 9));
  in.push_back(runtime::GaugeSample({"g", "bytes", "help g"}, {}, -2.5));
  runtime::Histogram::Snapshot h;
  h.count = 3;
  h.sum = 1000;
  h.buckets[5] = 1;
  h.buckets[10] = 2;
  in.push_back(runtime::HistogramSample({"h", "ns", "help h"}, {{"x", "y"}}, h));
  auto out = DecodeSamples(EncodeSamples(in));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].name, in[i].name);
    EXPECT_EQ((*out)[i].help, in[i].help);
    EXPECT_EQ((*out)[i].unit, in[i].unit);
    EXPECT_EQ((*out)[i].type, in[i].type);
    EXPECT_EQ((*out)[i].labels, in[i].labels);
    EXPECT_EQ((*out)[i].count, in[i].count);
    EXPECT_EQ((*out)[i].gauge, in[i].gauge);
    EXPECT_EQ((*out)[i].hist.buckets, in[i].hist.buckets);
    EXPECT_EQ((*out)[i].hist.sum, in[i].hist.sum);
  }
}

TEST(EncodingTest, EveryTruncationAndABadCountAreDataLoss) {
  std::vector<Sample> in;
  in.push_back(runtime::CounterSample({"a.b", "calls", "help"}, {{"k", "v"}}, 7));
  runtime::Histogram::Snapshot h;
  h.buckets[3] = 1;
  h.count = 1;
  in.push_back(runtime::HistogramSample({"h", "ns", "help"}, {}, h));
  const std::string blob = EncodeSamples(in);
  ASSERT_TRUE(DecodeSamples(blob).ok());
  for (size_t n = 0; n < blob.size(); ++n) {
    auto out = DecodeSamples(blob.substr(0, n));
    ASSERT_FALSE(out.ok()) << n;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  }
  std::string bad = blob;
  bad[8] = '\x7f';  // sample count
  EXPECT_EQ(DecodeSamples(bad).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSamples(blob + "x").status().code(), absl::StatusCode::kDataLoss);
  // A histogram counting fewer observations than its buckets hold, a
  // sample without a name, a label without one.
  in.back().hist.count = 0;
  EXPECT_EQ(DecodeSamples(EncodeSamples(in)).status().code(), absl::StatusCode::kDataLoss);
  in.back().hist.count = 1;
  in.back().name.clear();
  EXPECT_EQ(DecodeSamples(EncodeSamples(in)).status().code(), absl::StatusCode::kDataLoss);
  in.back().name = "h";
  in.front().labels[0].name.clear();
  EXPECT_EQ(DecodeSamples(EncodeSamples(in)).status().code(), absl::StatusCode::kDataLoss);
}

class PoolMetricsTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string Uri() { return PoolUri(dir_, absl::StrCat("coherence=", GetParam()), "64M"); }
  // A publisher without its thread: it publishes when PublishNow is called.
  static PublisherOptions PublishNowOnly() {
    PublisherOptions o;
    o.period = absl::ZeroDuration();
    return o;
  }
  TempDir dir_;
};

TEST_P(PoolMetricsTest, AReaderSeesEveryHostsPublishedMetricsLabelledWithItsSlot) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  auto h1 = ::cxlrt::testing::AttachTestHost(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(h1.ok()) << h1.status();
  // Metrics of each emulated host, told apart by their slot label.
  runtime::Counter c0({"test.pool_counter", "calls", "a counter"},
                      {{"slot", absl::StrCat(h0->alloc->slot())}});
  runtime::Counter c1({"test.pool_counter", "calls", "a counter"},
                      {{"slot", absl::StrCat(h1->alloc->slot())}});
  c0.Add(3);
  c1.Add(11);
  MetricsPublisher p0(*h0->pool, *h0->membership, *h0->alloc, PublishNowOnly());
  MetricsPublisher p1(*h1->pool, *h1->membership, *h1->alloc, PublishNowOnly());
  ASSERT_TRUE(p0.PublishNow().ok());
  ASSERT_TRUE(p1.PublishNow().ok());

  // A reader of its own, not attached.
  auto pool = runtime::Pool::Open(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(pool.ok());
  PoolMetricsReader reader(**pool);
  auto m = reader.Read(absl::Seconds(1));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->hosts.size(), 2u);
  for (const HostMetrics& h : m->hosts) {
    EXPECT_TRUE(h.published) << h.slot << ": " << h.problem;
    EXPECT_TRUE(h.alive) << h.slot;
    EXPECT_GT(h.lease_margin, absl::ZeroDuration());
  }
  const std::string s0 = absl::StrCat(h0->alloc->slot()), s1 = absl::StrCat(h1->alloc->slot());
  const Sample* a = FindSample(m->samples, "test.pool_counter", {{"host", s0}});
  const Sample* b = FindSample(m->samples, "test.pool_counter", {{"host", s1}});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->count, 3u);
  EXPECT_EQ(b->count, 11u);
  for (const runtime::Label& l : a->labels) EXPECT_NE(l.name, "slot") << "the host label stands";
  const Sample* hosts = FindSample(m->samples, "pool.hosts", {{"state", "attached"}});
  ASSERT_NE(hosts, nullptr);
  EXPECT_EQ(hosts->gauge, 2);
  const Sample* alive = FindSample(m->samples, "pool.hosts_alive", {});
  ASSERT_NE(alive, nullptr);
  EXPECT_EQ(alive->gauge, 2);

  // A later publish replaces the earlier values; a host that leaves goes.
  c1.Add(1);
  ASSERT_TRUE(p1.PublishNow().ok());
  m = reader.Read();
  ASSERT_TRUE(m.ok());
  b = FindSample(m->samples, "test.pool_counter", {{"host", s1}});
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->count, 12u);
  const std::string text = PoolPrometheusText(*m);
  EXPECT_TRUE(
      absl::StrContains(text, absl::StrCat("cxlrt_test_pool_counter_total{host=\"", s1, "\"} 12")))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "# TYPE cxlrt_pool_host_heartbeat_age_seconds gauge"));
}

TEST_P(PoolMetricsTest, SnapshotsAreConsistentWhileAHostRepublishes) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  const std::string s0 = absl::StrCat(h0->alloc->slot());
  // Two counters always bumped together, and a metric that comes and goes
  // (so the area's size changes and it moves to a bigger block).
  runtime::Counter a({"test.pair_a", "calls", "a"}, {{"slot", s0}});
  runtime::Counter b({"test.pair_b", "calls", "b"}, {{"slot", s0}});
  MetricsPublisher p(*h0->pool, *h0->membership, *h0->alloc, PublishNowOnly());
  ASSERT_TRUE(p.PublishNow().ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::vector<std::unique_ptr<runtime::Counter>> extra;
    for (int i = 0; !stop.load(); ++i) {
      a.Add();
      b.Add();
      if (i % 50 == 0 && extra.size() < 400) {
        extra.push_back(std::make_unique<runtime::Counter>(
            runtime::MetricInfo{"test.pad", "calls", "grows the area"},
            runtime::Labels{{"slot", s0}, {"i", absl::StrCat(i)}}));
      }
      (void)p.PublishNow();
    }
  });
  auto pool = runtime::Pool::Open(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(pool.ok());
  PoolMetricsReader reader(**pool);
  int seen = 0;
  for (int i = 0; i < 300; ++i) {
    auto m = reader.Read();
    ASSERT_TRUE(m.ok()) << m.status();
    const Sample* x = FindSample(m->samples, "test.pair_a", {});
    const Sample* y = FindSample(m->samples, "test.pair_b", {});
    if (x == nullptr || y == nullptr) continue;  // the record stayed busy
    // Collected a then b: b may trail a by the bump in between, never lead.
    EXPECT_LE(y->count, x->count);
    EXPECT_LE(x->count - y->count, 1u);
    ++seen;
  }
  stop.store(true);
  writer.join();
  EXPECT_GT(seen, 0);
}

// Review stress: a host that republishes as fast as it can while other
// threads record into a histogram and the area moves to bigger blocks; a
// reader that reads all along never reports a corrupt area or a blob that
// does not decode (a busy record is the only problem it may meet).
TEST_P(PoolMetricsTest, ALiveWriterNeverReadsAsCorrupt) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  const std::string s0 = absl::StrCat(h0->alloc->slot());
  runtime::Histogram hist({"test.stress_ns", "ns", "recorded while publishing"}, {{"slot", s0}});
  MetricsPublisher p(*h0->pool, *h0->membership, *h0->alloc, PublishNowOnly());
  ASSERT_TRUE(p.PublishNow().ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> recorders;
  for (int t = 0; t < 2; ++t) {
    recorders.emplace_back([&, t] {
      for (uint64_t v = t; !stop.load(std::memory_order_relaxed); v += 7) {
        hist.Record(v % 5000, 1 + v % 3);
      }
    });
  }
  std::thread writer([&] {
    std::vector<std::unique_ptr<runtime::Counter>> extra;
    for (int i = 0; !stop.load(); ++i) {
      if (i % 20 == 0 && extra.size() < 600) {
        extra.push_back(std::make_unique<runtime::Counter>(
            runtime::MetricInfo{"test.pad", "calls", "grows the area"},
            runtime::Labels{{"slot", s0}, {"i", absl::StrCat(i)}}));
      }
      (void)p.PublishNow();
    }
  });
  auto pool = runtime::Pool::Open(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(pool.ok());
  PoolMetricsReader reader(**pool);
  int seen = 0, busy = 0;
  std::vector<std::string> bad;
  const absl::Time end = absl::Now() + absl::Milliseconds(1500);
  while (absl::Now() < end) {
    auto m = reader.Read();
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->hosts.size(), 1u);
    const HostMetrics& h = m->hosts[0];
    if (h.published) {
      ++seen;
      const Sample* x = FindSample(m->samples, "test.stress_ns", {});
      if (x != nullptr) {
        uint64_t in = 0;
        for (uint64_t b : x->hist.buckets) in += b;
        EXPECT_EQ(in, x->hist.count);
      }
    } else if (absl::StrContains(h.problem, "stayed busy")) {
      ++busy;
    } else if (bad.size() < 5) {
      bad.push_back(h.problem);
    }
  }
  stop.store(true);
  writer.join();
  for (auto& t : recorders) t.join();
  EXPECT_GT(seen, 0);
  EXPECT_TRUE(bad.empty()) << bad.size() << " reads reported a problem, first: " << bad[0] << " ("
                           << seen << " read, " << busy << " busy)";
}

TEST_P(PoolMetricsTest, ACorruptRecordIsReportedAndItsAreaNotRead) {
  const std::string uri = Uri();
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, Creating());
  ASSERT_TRUE(h0.ok()) << h0.status();
  MetricsPublisher p(*h0->pool, *h0->membership, *h0->alloc, PublishNowOnly());
  ASSERT_TRUE(p.PublishNow().ok());
  auto block = h0->alloc->Find(kMetricsBlockName);
  ASSERT_TRUE(block.ok());
  const runtime::PoolOffset rec = block->offset + h0->alloc->slot() * kMetricsSlotStride;
  auto pool = runtime::Pool::Open(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(pool.ok());
  PoolMetricsReader reader(**pool);
  MetricsSlotLayout r;
  h0->pool->coherence().Fetch(&r, rec, sizeof(r));
  // A wrong checksum.
  r.area ^= 64;
  h0->pool->coherence().Publish(rec, &r, sizeof(r));
  auto m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->hosts.size(), 1u);
  EXPECT_FALSE(m->hosts[0].published);
  EXPECT_TRUE(absl::StrContains(m->hosts[0].problem, "checksum")) << m->hosts[0].problem;
  // An area far outside the pool, with a checksum that matches: bounds
  // are checked before the area is read.
  r.area = uint64_t{1} << 60;
  r.checksum = MetricsSlotChecksum(r);
  h0->pool->coherence().Publish(rec, &r, sizeof(r));
  m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->hosts[0].published);
  EXPECT_TRUE(absl::StrContains(m->hosts[0].problem, "outside")) << m->hosts[0].problem;
  // An area inside the pool but larger than any host publishes: refused
  // before the reader allocates for it.
  MetricsSlotLayout big = r;
  big.area = h0->pool->header().heap_offset;
  big.area_size = kMaxMetricsArea + 4096;
  big.blob_size = big.area_size;
  big.checksum = MetricsSlotChecksum(big);
  h0->pool->coherence().Publish(rec, &big, sizeof(big));
  m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->hosts[0].published);
  EXPECT_TRUE(absl::StrContains(m->hosts[0].problem, "larger than")) << m->hosts[0].problem;
  // A record that is right over an area whose bytes are not: one read, the
  // corruption reported (not retried as if a writer were busy).
  ASSERT_TRUE(p.PublishNow().ok());
  h0->pool->coherence().Fetch(&r, rec, sizeof(r));
  uint8_t byte;
  h0->pool->coherence().Fetch(&byte, r.area, 1);
  byte ^= 0xff;
  h0->pool->coherence().Publish(r.area, &byte, 1);
  m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->hosts[0].published);
  EXPECT_TRUE(absl::StrContains(m->hosts[0].problem, "area's checksum")) << m->hosts[0].problem;
  // The next publish repairs it.
  ASSERT_TRUE(p.PublishNow().ok());
  m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->hosts[0].published) << m->hosts[0].problem;
}

INSTANTIATE_TEST_SUITE_P(Domains, PoolMetricsTest, ::testing::Values("hardware", "simulated"));

}  // namespace
}  // namespace cxlrt::metrics
