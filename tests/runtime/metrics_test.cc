#include "cxlrt/runtime/metrics.h"

#include <string_view>
#include <thread>
#include <vector>

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

TEST(MetricsTest, HistogramBucketsArePowersOfTwo) {
  EXPECT_EQ(Histogram::BucketOf(0), 0u);
  EXPECT_EQ(Histogram::BucketOf(1), 1u);
  EXPECT_EQ(Histogram::BucketOf(2), 2u);
  EXPECT_EQ(Histogram::BucketOf(3), 2u);
  EXPECT_EQ(Histogram::BucketOf(4), 3u);
  EXPECT_EQ(Histogram::BucketOf(~uint64_t{0}), 64u);
  for (size_t i = 1; i < Histogram::kBuckets; ++i) {
    EXPECT_EQ(Histogram::BucketOf(Histogram::BucketMax(i)), i);
    EXPECT_EQ(Histogram::BucketOf(Histogram::BucketMax(i - 1) + 1), i);
  }
  Histogram h({"test.buckets", "bytes", "sizes"});
  for (uint64_t v : {0, 1, 5, 6, 7, 8, 1000}) h.Record(v);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.buckets[0], 1u);   // 0
  EXPECT_EQ(s.buckets[1], 1u);   // 1
  EXPECT_EQ(s.buckets[3], 3u);   // 5, 6, 7 in [4, 8)
  EXPECT_EQ(s.buckets[4], 1u);   // 8 in [8, 16)
  EXPECT_EQ(s.buckets[10], 1u);  // 1000 in [512, 1024)
  EXPECT_EQ(s.count, 7u);
  EXPECT_EQ(s.sum, 1027u);
}

}  // namespace
}  // namespace cxlrt::runtime
