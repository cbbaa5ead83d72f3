#include "cxlrt/runtime/metrics.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

namespace cxlrt::runtime {
namespace {

// Metrics register from static initialisers of other files: the registry
// is made on first use and never destroyed.
struct Registry {
  std::mutex mu;
  std::vector<const Counter*> counters;      // guarded by mu
  std::vector<const Histogram*> histograms;  // guarded by mu
};

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

size_t ThisThreadShard() {
  // Threads take shards round-robin as they first bump a metric, so that up
  // to kShards threads never share one.
  static std::atomic<size_t> next{0};
  thread_local const size_t shard = next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return shard;
}

}  // namespace metrics_internal

Counter::Counter(const MetricInfo& info) : info_(info) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.counters.push_back(this);
}

Counter::~Counter() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  Remove(r.counters, this);
}

uint64_t Counter::Value() const {
  uint64_t sum = 0;
  for (const auto& s : shards_) sum += s.value.load(std::memory_order_relaxed);
  return sum;
}

Histogram::Histogram(const MetricInfo& info) : info_(info) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.histograms.push_back(this);
}

Histogram::~Histogram() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  Remove(r.histograms, this);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot out;
  for (const Shard& s : shards_) {
    out.count += s.count.load(std::memory_order_relaxed);
    out.sum += s.sum.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kBuckets; ++i) {
      out.buckets[i] += s.buckets[i].load(std::memory_order_relaxed);
    }
  }
  return out;
}

MetricsSnapshot SnapshotMetrics() {
  Registry& r = GetRegistry();
  MetricsSnapshot out;
  {
    // Under the lock: a local metric cannot leave while it is read.
    std::lock_guard<std::mutex> lock(r.mu);
    for (const Counter* c : r.counters) out.counters.push_back({c->info(), c->Value()});
    for (const Histogram* h : r.histograms) out.histograms.push_back({h->info(), h->Read()});
  }
  std::sort(out.counters.begin(), out.counters.end(), ByName<CounterValue>);
  std::sort(out.histograms.begin(), out.histograms.end(), ByName<HistogramValue>);
  return out;
}

}  // namespace cxlrt::runtime
