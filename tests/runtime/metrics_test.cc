#include "cxlrt/runtime/metrics.h"

#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "cxlrt/runtime/prometheus.h"
#include "gtest/gtest.h"

namespace cxlrt::runtime {
namespace {

const CounterValue* FindCounter(const MetricsSnapshot& s, std::string_view name) {
  for (const CounterValue& c : s.counters) {
    if (name == c.info.name) return &c;
  }
  return nullptr;
}

TEST(MetricsTest, TheRegistryListsEveryLiveMetricByName) {
  {
    Counter b({"test.b", "calls", "a counter of this test"});
    Counter a({"test.a", "calls", "another"});
    Histogram h({"test.h", "ns", "a histogram of this test"});
    a.Add(2);
    const MetricsSnapshot s = SnapshotMetrics();
    ASSERT_NE(FindCounter(s, "test.a"), nullptr);
    ASSERT_NE(FindCounter(s, "test.b"), nullptr);
    EXPECT_EQ(FindCounter(s, "test.a")->value, 2u);
    EXPECT_EQ(std::string_view(FindCounter(s, "test.a")->info.unit), "calls");
    EXPECT_LT(FindCounter(s, "test.a"), FindCounter(s, "test.b")) << "sorted by name";
    bool found = false;
    for (const HistogramValue& v : s.histograms) found |= std::string_view(v.info.name) == "test.h";
    EXPECT_TRUE(found);
  }
  const MetricsSnapshot s = SnapshotMetrics();
  EXPECT_EQ(FindCounter(s, "test.a"), nullptr) << "a destroyed metric leaves the registry";
}

TEST(MetricsTest, CountsAddUpAcrossThreads) {
  Counter c({"test.threads", "calls", "bumped by many threads"});
  Histogram h({"test.threads_hist", "ns", "recorded by many threads"});
  constexpr int kThreads = 24;  // more than the shards: some threads share one
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c.Add();
        h.Record(static_cast<uint64_t>(t));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Value(), uint64_t{kThreads} * kPerThread);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s.sum, uint64_t{kPerThread} * (kThreads * (kThreads - 1) / 2));
  uint64_t in_buckets = 0;
  for (uint64_t b : s.buckets) in_buckets += b;
  EXPECT_EQ(in_buckets, s.count);
}

TEST(MetricsTest, HistogramBucketsArePowersOfTwoWithInclusiveUpperBounds) {
  EXPECT_EQ(Histogram::BucketOf(0), 0u);
  EXPECT_EQ(Histogram::BucketOf(1), 0u);
  EXPECT_EQ(Histogram::BucketOf(2), 1u);
  EXPECT_EQ(Histogram::BucketOf(3), 2u);
  EXPECT_EQ(Histogram::BucketOf(4), 2u);
  EXPECT_EQ(Histogram::BucketOf(5), 3u);
  EXPECT_EQ(Histogram::BucketOf(~uint64_t{0}), 64u);
  EXPECT_EQ(Histogram::BucketMax(0), 1u);
  EXPECT_EQ(Histogram::BucketMax(10), 1024u);
  for (size_t i = 1; i < Histogram::kBuckets; ++i) {
    EXPECT_EQ(Histogram::BucketOf(Histogram::BucketMax(i)), i);
    EXPECT_EQ(Histogram::BucketOf(Histogram::BucketMax(i - 1) + 1), i);
  }
  Histogram h({"test.buckets", "bytes", "sizes"});
  for (uint64_t v : {0, 1, 5, 6, 7, 8, 1000, 1024, 1025}) h.Record(v);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.buckets[0], 2u);   // 0, 1
  EXPECT_EQ(s.buckets[3], 4u);   // 5, 6, 7, 8 in (4, 8]
  EXPECT_EQ(s.buckets[10], 2u);  // 1000, 1024 in (512, 1024]: le="1024" holds 1024
  EXPECT_EQ(s.buckets[11], 1u);  // 1025
  EXPECT_EQ(s.count, 9u);
  EXPECT_EQ(s.sum, 3076u);
}

const Sample* FindSample(const std::vector<Sample>& all, std::string_view name,
                         const Labels& labels) {
  for (const Sample& s : all) {
    if (s.name == name && s.labels == labels) return &s;
  }
  return nullptr;
}

TEST(MetricsTest, LabelledMetricsAndCollectorsAreCollectedNotSnapshot) {
  Counter a({"test.lab", "calls", "labelled"}, {{"namespace", "x"}});
  Counter b({"test.lab", "calls", "labelled"}, {{"namespace", "y"}});
  Counter hidden({"test.lab", "calls", "unlisted"}, {{"namespace", "z"}}, Listing::kUnlisted);
  a.Add(2);
  b.Add(5);
  hidden.Add(1);
  int runs = 0;
  {
    MetricsCollector c([&](std::vector<Sample>* out) {
      ++runs;
      out->push_back(GaugeSample({"test.gauge", "bytes", "a gauge"}, {{"k", "v"}}, 1.5));
    });
    const std::vector<Sample> all = CollectMetrics();
    EXPECT_EQ(runs, 1);
    ASSERT_NE(FindSample(all, "test.lab", {{"namespace", "x"}}), nullptr);
    EXPECT_EQ(FindSample(all, "test.lab", {{"namespace", "x"}})->count, 2u);
    EXPECT_EQ(FindSample(all, "test.lab", {{"namespace", "y"}})->count, 5u);
    EXPECT_EQ(FindSample(all, "test.lab", {{"namespace", "z"}}), nullptr) << "unlisted";
    ASSERT_NE(FindSample(all, "test.gauge", {{"k", "v"}}), nullptr);
    EXPECT_EQ(FindSample(all, "test.gauge", {{"k", "v"}})->gauge, 1.5);
    EXPECT_EQ(FindCounter(SnapshotMetrics(), "test.lab"), nullptr) << "snapshots list unlabelled";
  }
  const std::vector<Sample> all = CollectMetrics();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(FindSample(all, "test.gauge", {{"k", "v"}}), nullptr) << "a gone collector";
}

TEST(MetricsTest, AWeightedRecordCountsForTheCallsNotTimed) {
  Histogram h({"test.weighted", "ns", "weighted"});
  h.Record(100, 16);
  h.Record(3);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 17u);
  EXPECT_EQ(s.sum, 1603u);
  EXPECT_EQ(s.buckets[Histogram::BucketOf(100)], 16u);
}

TEST(MetricsTest, AThreadTimesItsFirstCallsThenOneInAPeriodWithItsWeight) {
  const uint32_t p = MetricsSamplePeriod();  // CXLRT_METRICS_SAMPLE, 64 unless set
  ASSERT_GT(p, 0u);
  std::vector<uint32_t> weights;
  std::thread([&] {
    for (uint32_t i = 0; i < 4 * p; ++i) weights.push_back(TimeThisCall());
  }).join();
  uint64_t timed = 0, total = 0;
  for (uint32_t i = 0; i < weights.size(); ++i) {
    if (i < p) {
      EXPECT_EQ(weights[i], 1u) << "call " << i << " of the first " << p;
    } else {
      EXPECT_EQ(weights[i], (i - p) % p == 0 ? p : 0u) << "call " << i;
    }
    timed += weights[i] != 0;
    total += weights[i];
  }
  EXPECT_EQ(timed, p + 3);
  EXPECT_EQ(total, uint64_t{4} * p) << "the weights add up to the calls";
}

TEST(MetricsTest, PrometheusTextNamesUnitsBucketsAndEscapes) {
  std::vector<Sample> in;
  in.push_back(CounterSample({"kv.hits", "calls", "Hits."}, {{"namespace", "a\"b\nc"}}, 4));
  in.push_back(CounterSample({"kv.hits", "calls", "Hits."}, {{"namespace", "d"}}, 6));
  in.push_back(CounterSample({"collective.time", "ns", "Time."}, {}, 2500000000));
  in.push_back(GaugeSample({"kv.stored_bytes", "bytes", "Bytes."}, {}, 12));
  Histogram::Snapshot h;
  h.buckets[Histogram::BucketOf(100)] = 2;    // 100 ns: at most 256 ns
  h.buckets[Histogram::BucketOf(3000)] = 1;   // 3 us: at most 4096 ns
  h.buckets[Histogram::BucketOf(16384)] = 1;  // exactly 16384 ns: in le="1.6384e-05"
  h.count = 4;
  h.sum = 19584;
  in.push_back(HistogramSample({"kv.get_latency", "ns", "Get."}, {{"namespace", "d"}}, h));
  const std::string t = PrometheusText(in);
  EXPECT_TRUE(absl::StrContains(t, "# TYPE cxlrt_kv_hits_total counter\n")) << t;
  EXPECT_TRUE(absl::StrContains(t, "cxlrt_kv_hits_total{namespace=\"a\\\"b\\nc\"} 4\n")) << t;
  EXPECT_TRUE(absl::StrContains(t, "cxlrt_kv_hits_total{namespace=\"d\"} 6\n")) << t;
  EXPECT_EQ(t.find("# TYPE cxlrt_kv_hits_total"), t.rfind("# TYPE cxlrt_kv_hits_total"))
      << "one TYPE per family";
  EXPECT_TRUE(absl::StrContains(t, "cxlrt_collective_time_seconds_total 2.5\n")) << t;
  EXPECT_TRUE(absl::StrContains(t, "# TYPE cxlrt_kv_stored_bytes gauge\ncxlrt_kv_stored_bytes"))
      << t;
  EXPECT_TRUE(absl::StrContains(t, "# TYPE cxlrt_kv_get_latency_seconds histogram")) << t;
  EXPECT_TRUE(absl::StrContains(
      t, "cxlrt_kv_get_latency_seconds_bucket{namespace=\"d\",le=\"2.56e-07\"} 2\n"))
      << t;
  EXPECT_TRUE(absl::StrContains(
      t, "cxlrt_kv_get_latency_seconds_bucket{namespace=\"d\",le=\"1.024e-06\"} 2\n"))
      << t;
  EXPECT_TRUE(absl::StrContains(
      t, "cxlrt_kv_get_latency_seconds_bucket{namespace=\"d\",le=\"4.096e-06\"} 3\n"))
      << t;
  // le is inclusive: 16384 ns is in le="1.6384e-05", not only in the next.
  EXPECT_TRUE(absl::StrContains(
      t, "cxlrt_kv_get_latency_seconds_bucket{namespace=\"d\",le=\"1.6384e-05\"} 4\n"))
      << t;
  EXPECT_TRUE(
      absl::StrContains(t, "cxlrt_kv_get_latency_seconds_bucket{namespace=\"d\",le=\"+Inf\"} 4\n"))
      << t;
  EXPECT_TRUE(
      absl::StrContains(t, "cxlrt_kv_get_latency_seconds_sum{namespace=\"d\"} 1.9584e-05\n"))
      << t;
  EXPECT_TRUE(absl::StrContains(t, "cxlrt_kv_get_latency_seconds_count{namespace=\"d\"} 4\n")) << t;
}

// Label values are any bytes (a namespace named by a caller, another host's
// area): the text stays valid UTF-8 without control characters, or a
// scraper rejects the whole target.
TEST(MetricsTest, LabelValuesThatAreNotPrintableUtf8AreReplaced) {
  EXPECT_EQ(PrintableUtf8("plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");  // é, €, an emoji pass
  EXPECT_EQ(PrintableUtf8("bad\xFF\xFEns"), "bad\xEF\xBF\xBD\xEF\xBF\xBDns");
  EXPECT_EQ(PrintableUtf8("\x1B[2J"), "\xEF\xBF\xBD[2J");            // escape sequences
  EXPECT_EQ(PrintableUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(PrintableUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(PrintableUtf8("cut \xE2\x82"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");          // truncated
  EXPECT_EQ(PrintableUtf8("a\nb"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(PrintableUtf8("a\nb", /*keep_newline=*/true), "a\nb");
  std::vector<Sample> in;
  in.push_back(CounterSample({"kv.hits", "calls", "Hits."}, {{"namespace", "bad\xFF\x1B"}}, 1));
  EXPECT_TRUE(absl::StrContains(
      PrometheusText(in), "cxlrt_kv_hits_total{namespace=\"bad\xEF\xBF\xBD\xEF\xBF\xBD\"} 1\n"));
}

}  // namespace
}  // namespace cxlrt::runtime
