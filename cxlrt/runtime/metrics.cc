#include "cxlrt/runtime/metrics.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

#include "cxlrt/runtime/knobs.h"

namespace cxlrt::runtime {
namespace {

// Metrics register from static initialisers of other files: the registry
// is made on first use and never destroyed.
struct Registry {
  std::mutex mu;
  std::vector<const Counter*> counters;             // guarded by mu
  std::vector<const Histogram*> histograms;         // guarded by mu
  std::vector<const MetricsCollector*> collectors;  // guarded by mu
};

const Knob<uint32_t> kMetricsSample(
    {"CXLRT_METRICS_SAMPLE", "64",
     "KV latency histograms and collective times are measured on one call in this many (per "
     "thread; per collective and size for a communicator), 1: every call, 0: none. Counters "
     "count every call."},
    64, UintIn(0, 1u << 20));

Registry& GetRegistry() {
  static Registry* r = new Registry;
  return *r;
}

template <typename T>
void Remove(std::vector<const T*>& v, const T* m) {
  v.erase(std::remove(v.begin(), v.end(), m), v.end());
}

template <typename T>
bool ByName(const T& a, const T& b) {
  return std::string_view(a.info.name) < std::string_view(b.info.name);
}

}  // namespace

namespace metrics_internal {

namespace {

// Bit i set: shard i is owned by a live thread.
std::atomic<uint32_t> owned{0};

// A thread's claim on a shard, given back when the thread exits.
struct Claim {
  ThreadShard shard;
  Claim() {
    uint32_t m = owned.load(std::memory_order_relaxed);
    for (;;) {
      uint32_t i = 0;
      while (i < kShards - 1 && (m >> i & 1) != 0) ++i;
      if (i == kShards - 1) {
        shard = {static_cast<uint32_t>(kShards - 1), false};  // all taken: the shared one
        return;
      }
      // Acquire: the previous owner's last adds happen before ours.
      if (owned.compare_exchange_weak(m, m | (1u << i), std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
        shard = {i, true};
        return;
      }
    }
  }
  ~Claim() {
    if (!shard.exclusive) return;
    owned.fetch_and(~(1u << shard.index), std::memory_order_release);
    // A static destructor that runs after this (the main thread's) still
    // adds: to the shared shard, with fetch_add.
    shard = {static_cast<uint32_t>(kShards - 1), false};
  }
};

}  // namespace

const ThreadShard& ThisThreadShard() {
  static thread_local const Claim claim;
  return claim.shard;
}

std::atomic<uint32_t> sample_period{~0u};

uint32_t LoadSamplePeriod() {
  const uint32_t p = kMetricsSample.Get();
  sample_period.store(p, std::memory_order_relaxed);
  return p;
}

}  // namespace metrics_internal

Counter::Counter(const MetricInfo& info, Labels labels, Listing listing)
    : info_(info), labels_(std::move(labels)), listing_(listing) {
  if (listing_ == Listing::kUnlisted) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.counters.push_back(this);
}

Counter::~Counter() {
  if (listing_ == Listing::kUnlisted) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  Remove(r.counters, this);
}

uint64_t Counter::Value() const {
  uint64_t sum = 0;
  for (const auto& s : shards_) sum += s.value.load(std::memory_order_relaxed);
  return sum;
}

Histogram::Histogram(const MetricInfo& info, Labels labels, Listing listing)
    : info_(info), labels_(std::move(labels)), listing_(listing) {
  if (listing_ == Listing::kUnlisted) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.histograms.push_back(this);
}

Histogram::~Histogram() {
  if (listing_ == Listing::kUnlisted) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  Remove(r.histograms, this);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot out;
  for (const Shard& s : shards_) {
    out.sum += s.sum.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kBuckets; ++i) {
      out.buckets[i] += s.buckets[i].load(std::memory_order_relaxed);
    }
  }
  // The count from the very loads of the buckets: a Record racing this
  // read is in both or in neither.
  for (uint64_t b : out.buckets) out.count += b;
  return out;
}

MetricsSnapshot SnapshotMetrics() {
  Registry& r = GetRegistry();
  MetricsSnapshot out;
  {
    // Under the lock: a local metric cannot leave while it is read.
    std::lock_guard<std::mutex> lock(r.mu);
    for (const Counter* c : r.counters) {
      if (c->labels().empty()) out.counters.push_back({c->info(), c->Value()});
    }
    for (const Histogram* h : r.histograms) {
      if (h->labels().empty()) out.histograms.push_back({h->info(), h->Read()});
    }
  }
  std::sort(out.counters.begin(), out.counters.end(), ByName<CounterValue>);
  std::sort(out.histograms.begin(), out.histograms.end(), ByName<HistogramValue>);
  return out;
}

const char* MetricTypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

MetricsCollector::MetricsCollector(Fn collect) : collect_(std::move(collect)) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.collectors.push_back(this);
}

MetricsCollector::~MetricsCollector() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  Remove(r.collectors, this);
}

namespace {
// A sample of `info` and `type` with `labels`, its value still to set.
Sample SampleOf(const MetricInfo& info, MetricType type, Labels labels) {
  Sample s;
  s.name = info.name;
  s.unit = info.unit;
  s.help = info.help;
  s.type = type;
  s.labels = std::move(labels);
  return s;
}
}  // namespace

Sample CounterSample(const MetricInfo& info, Labels labels, uint64_t value) {
  Sample s = SampleOf(info, MetricType::kCounter, std::move(labels));
  s.count = value;
  return s;
}

Sample GaugeSample(const MetricInfo& info, Labels labels, double value) {
  Sample s = SampleOf(info, MetricType::kGauge, std::move(labels));
  s.gauge = value;
  return s;
}

Sample HistogramSample(const MetricInfo& info, Labels labels, const Histogram::Snapshot& h) {
  Sample s = SampleOf(info, MetricType::kHistogram, std::move(labels));
  s.hist = h;
  return s;
}

std::vector<Sample> CollectMetrics() {
  Registry& r = GetRegistry();
  std::vector<Sample> out;
  {
    // Under the lock: nothing registered can leave while it is read. A
    // collector must not register or unregister metrics itself.
    std::lock_guard<std::mutex> lock(r.mu);
    for (const Counter* c : r.counters) {
      out.push_back(CounterSample(c->info(), c->labels(), c->Value()));
    }
    for (const Histogram* h : r.histograms) {
      out.push_back(HistogramSample(h->info(), h->labels(), h->Read()));
    }
    for (const MetricsCollector* c : r.collectors) c->Collect(&out);
  }
  std::stable_sort(out.begin(), out.end(), [](const Sample& a, const Sample& b) {
    if (a.name != b.name) return a.name < b.name;
    return std::lexicographical_compare(a.labels.begin(), a.labels.end(), b.labels.begin(),
                                        b.labels.end(), [](const Label& x, const Label& y) {
                                          return x.name != y.name ? x.name < y.name
                                                                  : x.value < y.value;
                                        });
  });
  return out;
}

}  // namespace cxlrt::runtime
