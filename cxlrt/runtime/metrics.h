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
// Cheap to bump: a relaxed add to the calling thread's shard (a cache line
// per shard, so threads bumping one counter do not share a line); up to 15
// threads own a shard each and add without a read-modify-write, the rest
// share one with fetch_add; reading sums the shards. A snapshot is not atomic across
// metrics, nor across the shards of one: each value is exact once the
// bumping threads are quiet, and never counts a bump twice.
//
// Labelled metrics (a KV namespace's, a communicator's) are made at run
// time: a Counter or Histogram may carry labels, and a MetricsCollector
// hands the registry samples whose values live elsewhere (a table a
// communicator keeps, gauges computed when read). CollectMetrics() reads
// all of them; docs/metrics.md lists every metric and its labels.
//
// Latency histograms on hot paths are sampled: TimeThisCall() says which
// calls to time (one in CXLRT_METRICS_SAMPLE per thread), and the sample is
// recorded with that weight, so the histogram's count and sum still
// estimate every call's (docs/metrics.md, "Overhead").
//
// Thread-safe: Add/Record from any thread; registration and snapshots take
// the registry's lock. A metric at namespace scope lives for the process; a
// local one (tests) leaves the registry when destroyed.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cxlrt::runtime {

// A label of a metric: {"namespace", "llama-8b"}.
struct Label {
  std::string name;
  std::string value;
  bool operator==(const Label& o) const { return name == o.name && value == o.value; }
};
using Labels = std::vector<Label>;

// kUnlisted: a metric kept out of the registry, whose owner hands its value
// to a MetricsCollector (and so needs no registry lock to make or drop).
enum class Listing { kListed, kUnlisted };

struct MetricInfo {
  const char* name;  // dotted, layer first: "allocator.segment_claims"
  const char* unit;  // "bytes", "ns", "calls", ...
  const char* help;  // one line
};

namespace metrics_internal {
inline constexpr size_t kShards = 16;
// Shards [0, kShards - 1) are each owned by one thread at a time, which
// adds to its shard with a plain load and store (no read-modify-write: a
// locked add costs a KV get about 1%); threads beyond them share the last
// shard with fetch_add. A thread gives its shard back when it exits (the
// value stays; the next owner adds to it).
struct ThreadShard {
  uint32_t index = 0;
  bool exclusive = false;
};
// The shard of the calling thread (fixed for its life).
const ThreadShard& ThisThreadShard();
struct alignas(64) Shard {
  std::atomic<uint64_t> value{0};
};
inline void AddTo(std::atomic<uint64_t>& v, uint64_t n, bool exclusive) {
  if (exclusive) {
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  } else {
    v.fetch_add(n, std::memory_order_relaxed);
  }
}
}  // namespace metrics_internal

class Counter {
 public:
  explicit Counter(const MetricInfo& info, Labels labels = {}, Listing listing = Listing::kListed);
  ~Counter();
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Add(uint64_t n = 1) {
    const metrics_internal::ThreadShard& t = metrics_internal::ThisThreadShard();
    metrics_internal::AddTo(shards_[t.index].value, n, t.exclusive);
  }
  // The sum over every thread's bumps so far.
  uint64_t Value() const;
  const MetricInfo& info() const { return info_; }
  const Labels& labels() const { return labels_; }

 private:
  const MetricInfo info_;
  const Labels labels_;
  const Listing listing_;
  std::array<metrics_internal::Shard, metrics_internal::kShards> shards_;
};

// A distribution in powers of two: bucket 0 counts the values 0 and 1,
// bucket i (1 <= i <= 64) the values in (2^(i-1), 2^i]: upper bounds
// inclusive, as Prometheus's `le`, so the exposition's bounds are exact.
// Also the sum; the count is the buckets' sum.
class Histogram {
 public:
  static constexpr size_t kBuckets = 65;
  // The largest value bucket `i` counts (1, 2, 4, ..., 2^63, 2^64 - 1).
  static uint64_t BucketMax(size_t i) { return i >= 64 ? ~uint64_t{0} : uint64_t{1} << i; }
  static size_t BucketOf(uint64_t v) {
    return v <= 1 ? 0 : 64 - static_cast<size_t>(__builtin_clzll(v - 1));
  }

  explicit Histogram(const MetricInfo& info, Labels labels = {},
                     Listing listing = Listing::kListed);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records `v`, as `weight` values of v (a sampled call stands for the
  // calls not timed beside it).
  void Record(uint64_t v, uint64_t weight = 1) {
    const metrics_internal::ThreadShard& t = metrics_internal::ThisThreadShard();
    Shard& s = shards_[t.index];
    metrics_internal::AddTo(s.sum, v * weight, t.exclusive);
    metrics_internal::AddTo(s.buckets[BucketOf(v)], weight, t.exclusive);
  }
  const MetricInfo& info() const { return info_; }
  const Labels& labels() const { return labels_; }

  struct Snapshot {
    uint64_t count = 0;  // the buckets' sum: never less than a bucket (Prometheus's +Inf)
    uint64_t sum = 0;
    std::array<uint64_t, kBuckets> buckets{};
  };
  Snapshot Read() const;

 private:
  // About 540 B a shard: a histogram costs 8.6 KiB.
  struct alignas(64) Shard {
    std::atomic<uint64_t> sum{0};
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};
  };
  const MetricInfo info_;
  const Labels labels_;
  const Listing listing_;
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

// Every unlabelled Counter and Histogram this program links, read now.
MetricsSnapshot SnapshotMetrics();

enum class MetricType : uint8_t { kCounter = 1, kGauge = 2, kHistogram = 3 };
const char* MetricTypeName(MetricType t);  // "counter", "gauge", "histogram"

// One metric with its labels and its value: what exporters read.
struct Sample {
  std::string name;  // dotted, as MetricInfo::name
  std::string unit;
  std::string help;
  MetricType type = MetricType::kCounter;
  Labels labels;
  uint64_t count = 0;        // kCounter: the value
  double gauge = 0;          // kGauge: the value
  Histogram::Snapshot hist;  // kHistogram
};

// Hands the registry samples whose values are kept elsewhere, read when a
// snapshot is taken. Registers itself; destroying it unregisters it (and
// waits for a collection that is running it).
class MetricsCollector {
 public:
  using Fn = std::function<void(std::vector<Sample>* out)>;
  explicit MetricsCollector(Fn collect);
  ~MetricsCollector();
  MetricsCollector(const MetricsCollector&) = delete;
  MetricsCollector& operator=(const MetricsCollector&) = delete;
  void Collect(std::vector<Sample>* out) const { collect_(out); }

 private:
  const Fn collect_;
};

// Every metric of this process: Counters and Histograms, labelled or not,
// and each collector's samples; sorted by name, then labels.
std::vector<Sample> CollectMetrics();

// Sample makers for collectors.
Sample CounterSample(const MetricInfo& info, Labels labels, uint64_t value);
Sample GaugeSample(const MetricInfo& info, Labels labels, double value);
Sample HistogramSample(const MetricInfo& info, Labels labels, const Histogram::Snapshot& h);

namespace metrics_internal {
// CXLRT_METRICS_SAMPLE, read once (0: time no call).
extern std::atomic<uint32_t> sample_period;
uint32_t LoadSamplePeriod();
}  // namespace metrics_internal

// CXLRT_METRICS_SAMPLE: one call in this many is timed (0: none).
inline uint32_t MetricsSamplePeriod() {
  const uint32_t p = metrics_internal::sample_period.load(std::memory_order_relaxed);
  return p != ~0u ? p : metrics_internal::LoadSamplePeriod();
}

// Whether the calling thread times this call for a sampled latency
// histogram: 0 when not, else the weight to record the sample with. A
// thread times each of its first P calls (weight 1; P is the period,
// CXLRT_METRICS_SAMPLE), then one in every P with weight P: a histogram is
// exact for the first P calls of each thread and after that its count runs
// ahead of the calls by less than P per thread. A few instructions, no
// atomic read-modify-write.
inline uint32_t TimeThisCall() {
  static thread_local uint32_t left = 0;   // calls to skip before the next timed one
  static thread_local uint32_t exact = 0;  // calls timed one by one so far
  if (left != 0) {
    --left;
    return 0;
  }
  const uint32_t p = MetricsSamplePeriod();
  if (p == 0) return 0;
  if (exact < p) {
    ++exact;
    return 1;
  }
  left = p - 1;
  return p;
}

// Times the calls TimeThisCall() picks: made at the start of a call,
// Record() at its end adds the elapsed steady-clock ns, weighted.
class SampledTimer {
 public:
  SampledTimer() : weight_(TimeThisCall()), start_(weight_ != 0 ? Now() : 0) {}
  bool sampled() const { return weight_ != 0; }
  void Record(Histogram& h) const {
    if (weight_ != 0) h.Record(static_cast<uint64_t>(Now() - start_), weight_);
  }

 private:
  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  const uint32_t weight_;
  const int64_t start_;
};

}  // namespace cxlrt::runtime
