// Metrics: named counters and histograms, each declared once beside the code
// that bumps it (name, unit, one line of help), on the pattern of the knob
// registry (cxlrt/runtime/knobs.h). Every declaration registers itself in
// one process-wide registry; SnapshotMetrics() reads them all, for `cxlrt
// doctor`, tests, and the exporter that publishes them into the pool.
//
//   // beside its user, at namespace scope in a .cc:
//   runtime::Counter g_claims({"allocator.segment_claims", "segments",
//                              "Segments this process claimed from the pool."});
//   ... g_claims.Add(); ...
//
// Cheap to bump: one relaxed fetch_add on a shard picked by the calling
// thread (a cache line per shard, so threads bumping one counter do not
// share a line); reading sums the shards. A snapshot is not atomic across
// metrics, nor across the shards of one: each value is exact once the
// bumping threads are quiet, and never counts a bump twice.
//
// Thread-safe: Add/Record from any thread; registration and snapshots take
// the registry's lock. A metric at namespace scope lives for the process; a
// local one (tests) leaves the registry when destroyed.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cxlrt::runtime {

struct MetricInfo {
  const char* name;  // dotted, layer first: "allocator.segment_claims"
  const char* unit;  // "bytes", "ns", "calls", ...
  const char* help;  // one line
};

namespace metrics_internal {
inline constexpr size_t kShards = 16;
// The shard of the calling thread (fixed for its life).
size_t ThisThreadShard();
struct alignas(64) Shard {
  std::atomic<uint64_t> value{0};
};
}  // namespace metrics_internal

class Counter {
 public:
  explicit Counter(const MetricInfo& info);
  ~Counter();
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Add(uint64_t n = 1) {
    shards_[metrics_internal::ThisThreadShard()].value.fetch_add(n, std::memory_order_relaxed);
  }
  // The sum over every thread's bumps so far.
  uint64_t Value() const;
  const MetricInfo& info() const { return info_; }

 private:
  const MetricInfo info_;
  std::array<metrics_internal::Shard, metrics_internal::kShards> shards_;
};

// A distribution in powers of two: bucket 0 counts the value 0, bucket i
// (1 <= i <= 64) the values in [2^(i-1), 2^i). Also the count and the sum.
class Histogram {
 public:
  static constexpr size_t kBuckets = 65;
  // The largest value bucket `i` counts (0, 1, 3, 7, ..., 2^64 - 1).
  static uint64_t BucketMax(size_t i) { return i == 0 ? 0 : ~uint64_t{0} >> (64 - i); }
  static size_t BucketOf(uint64_t v) {
    return v == 0 ? 0 : 64 - static_cast<size_t>(__builtin_clzll(v));
  }

  explicit Histogram(const MetricInfo& info);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Record(uint64_t v) {
    Shard& s = shards_[metrics_internal::ThisThreadShard()];
    s.count.fetch_add(1, std::memory_order_relaxed);
    s.sum.fetch_add(v, std::memory_order_relaxed);
    s.buckets[BucketOf(v)].fetch_add(1, std::memory_order_relaxed);
  }
  const MetricInfo& info() const { return info_; }

  struct Snapshot {
    uint64_t count = 0;
    uint64_t sum = 0;
    std::array<uint64_t, kBuckets> buckets{};
  };
  Snapshot Read() const;

 private:
  // About 540 B a shard: a histogram costs 8.6 KiB.
  struct alignas(64) Shard {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum{0};
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};
  };
  const MetricInfo info_;
  std::array<Shard, metrics_internal::kShards> shards_;
};

struct CounterValue {
  MetricInfo info;
  uint64_t value = 0;
};
struct HistogramValue {
  MetricInfo info;
  Histogram::Snapshot value;
};
struct MetricsSnapshot {
  std::vector<CounterValue> counters;      // by name
  std::vector<HistogramValue> histograms;  // by name
};

// Every metric this program links, read now.
MetricsSnapshot SnapshotMetrics();

}  // namespace cxlrt::runtime
