// Counters and inspection: the hit, miss and put counters each host
// publishes of itself, Stats, and reading a store without being a host of
// its pool (tools: stats, list, audit).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::kPublishEvery;
using kv_internal::StoreView;

void Store::Impl::Count(std::atomic<uint64_t>* counter, uint32_t ns) {
  counter[ns].fetch_add(1, std::memory_order_relaxed);
  if (reads_.fetch_add(1, std::memory_order_relaxed) % kPublishEvery == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    PublishCounters(ns);
  }
}

void Store::Impl::CountHit(uint32_t ns, uint32_t partition, uint32_t index, uint64_t gen,
                           uint64_t bytes) {
  Count(hits_.get(), ns);
  if (NsMetrics* m = MetricsOf(ns)) m->get_bytes.Add(bytes);
  if (partition == me_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (local_[index].gen == gen) order_->Touch(index);
  }
}

void Store::Impl::PublishCounters(uint32_t ns) {
  // A write to this host's partition: only with the lease (reads call this).
  if (!membership_.LeaseHeld()) return;
  NsCountersLayout& k = counters_[ns];
  k.hits = hits_[ns].load(std::memory_order_relaxed);
  k.misses = misses_[ns].load(std::memory_order_relaxed);
  c_.PublishObject(view_->CounterOff(me_, ns), k);
}

namespace {

const runtime::MetricInfo kLookups{"kv.lookups", "calls", "KV Lookup calls of this process."};
const runtime::MetricInfo kHits{
    "kv.hits", "calls",
    "KV gets that found their key, and keys found by Lookup, on this process (LMCache's "
    "num_lookup_hits)."};
const runtime::MetricInfo kMisses{
    "kv.misses", "calls", "KV gets that did not find their key, and Lookups that stopped short."};
const runtime::MetricInfo kHitRate{"kv.hit_rate", "ratio",
                                   "hits / (hits + misses) of this process since it opened the "
                                   "store (LMCache's lookup_hit_rate)."};
const runtime::MetricInfo kGetBytes{"kv.get_bytes", "bytes", "Value bytes got (hits)."};
const runtime::MetricInfo kPutBytes{"kv.put_bytes", "bytes", "Value bytes put (sealed puts)."};
const runtime::MetricInfo kPuts{"kv.puts", "calls", "KV puts that sealed an entry."};
const runtime::MetricInfo kEvictions{"kv.evictions", "entries",
                                     "Entries this host evicted (its own partition)."};
const runtime::MetricInfo kEntries{"kv.entries", "entries",
                                   "Entries in this host's partition now."};
const runtime::MetricInfo kBytes{"kv.stored_bytes", "bytes",
                                 "Value bytes of the entries in this host's partition now."};
const runtime::MetricInfo kQuota{"kv.quota_bytes", "bytes",
                                 "The namespace's quota over every host (0: none)."};
const runtime::MetricInfo kQuotaUse{
    "kv.quota_use", "ratio",
    "Value bytes of the namespace over every host / its quota (0 without a quota)."};
const runtime::MetricInfo kPins{"kv.pins_held", "pins",
                                "Pins this process holds now (every namespace)."};
const runtime::MetricInfo kLookupNs{"kv.lookup_latency", "ns",
                                    "Time of one Lookup call (sampled, CXLRT_METRICS_SAMPLE)."};
const runtime::MetricInfo kPutNs{"kv.put_latency", "ns",
                                 "Time of one Put or BatchPut call (sampled)."};
const runtime::MetricInfo kGetNs{"kv.get_latency", "ns",
                                 "Time of one Get or BatchGet call (sampled)."};

}  // namespace

NsMetrics::NsMetrics(std::string ns_name)
    : name(std::move(ns_name)),
      lookups(kLookups, {}, runtime::Listing::kUnlisted),
      get_bytes(kGetBytes, {}, runtime::Listing::kUnlisted),
      put_bytes(kPutBytes, {}, runtime::Listing::kUnlisted),
      lookup_ns(kLookupNs, {{"namespace", name}}, runtime::Listing::kUnlisted),
      put_ns(kPutNs, {{"namespace", name}}, runtime::Listing::kUnlisted),
      get_ns(kGetNs, {{"namespace", name}}, runtime::Listing::kUnlisted) {}

void Store::Impl::NoteNamespace(uint32_t id) {
  if (id >= ns_metrics_count_ || ns_metrics_[id].load(std::memory_order_relaxed) != nullptr) return;
  ns_metrics_[id].store(new NsMetrics(ns_names_[id]), std::memory_order_release);
}

void Store::Impl::CollectMetrics(std::vector<runtime::Sample>* out) {
  // Lock order: the registry's lock (held by the caller), then mu_ or
  // pin_mu_; the store makes and drops no listed metric under its locks.
  std::vector<std::pair<uint32_t, NsMetrics*>> known;
  for (uint32_t id = 0; id < ns_metrics_count_; ++id) {
    if (NsMetrics* m = MetricsOf(id)) known.emplace_back(id, m);
  }
  std::vector<NsCountersLayout> counters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters = counters_;
  }
  for (const auto& [id, m] : known) {
    runtime::Labels l = {{"slot", absl::StrCat(me_)}, {"namespace", m->name}};
    const uint64_t hits = hits_[id].load(std::memory_order_relaxed);
    const uint64_t misses = misses_[id].load(std::memory_order_relaxed);
    const NsCountersLayout& k = counters[id];
    out->push_back(runtime::CounterSample(kLookups, l, m->lookups.Value()));
    out->push_back(runtime::CounterSample(kHits, l, hits));
    out->push_back(runtime::CounterSample(kMisses, l, misses));
    out->push_back(runtime::GaugeSample(
        kHitRate, l, hits + misses == 0 ? 0.0 : static_cast<double>(hits) / (hits + misses)));
    out->push_back(runtime::CounterSample(kGetBytes, l, m->get_bytes.Value()));
    out->push_back(runtime::CounterSample(kPutBytes, l, m->put_bytes.Value()));
    out->push_back(runtime::CounterSample(kPuts, l, k.puts));
    out->push_back(runtime::CounterSample(kEvictions, l, k.evictions));
    out->push_back(runtime::GaugeSample(kEntries, l, static_cast<double>(k.entries)));
    out->push_back(runtime::GaugeSample(kBytes, l, static_cast<double>(k.bytes)));
    const uint64_t quota = QuotaOf(id);
    out->push_back(runtime::GaugeSample(kQuota, l, static_cast<double>(quota)));
    out->push_back(runtime::GaugeSample(
        kQuotaUse, l,
        quota == 0 ? 0.0 : static_cast<double>(k.bytes + NsBytesElsewhere(id)) / quota));
    out->push_back(runtime::HistogramSample(kLookupNs, l, m->lookup_ns.Read()));
    out->push_back(runtime::HistogramSample(kPutNs, l, m->put_ns.Read()));
    out->push_back(runtime::HistogramSample(kGetNs, l, m->get_ns.Read()));
  }
  size_t pins = 0;
  {
    // Every record is free but those held (store_recovery.cc fills it).
    std::lock_guard<std::mutex> lock(pin_mu_);
    pins = view_->h().pins_per_host - free_pins_.size();
  }
  out->push_back(
      runtime::GaugeSample(kPins, {{"slot", absl::StrCat(me_)}}, static_cast<double>(pins)));
}

absl::StatusOr<StoreStats> Store::Impl::Stats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t ns = 0; ns < counters_.size(); ++ns) PublishCounters(ns);
  }
  return view_->Stats();
}

// --- Tools ---

bool HasStore(const runtime::Pool& pool) { return pool.FindRegion(kStoreRegionName).ok(); }

absl::StatusOr<StoreStats> ReadStats(const runtime::Pool& pool) {
  CXLRT_ASSIGN_OR_RETURN(auto view, StoreView::Open(pool));
  return view->Stats();
}

absl::StatusOr<std::vector<EntryInfo>> ListEntries(const runtime::Pool& pool,
                                                   std::optional<std::string> ns) {
  CXLRT_ASSIGN_OR_RETURN(auto view, StoreView::Open(pool));
  return view->List(ns);
}

absl::Status Audit(const runtime::Pool& pool, std::vector<std::string>* problems) {
  auto view = StoreView::Open(pool);
  if (!view.ok()) {
    // A store that cannot be opened is a problem of the pool like any other:
    // listed, so that a failed check never reads "0 problems".
    if (problems) problems->emplace_back(view.status().message());
    return view.status();
  }
  std::vector<std::string> found;
  (*view)->Audit(&found);
  if (problems) problems->insert(problems->end(), found.begin(), found.end());
  if (found.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("KV store of ", pool.name(), ": ", found.size(),
                                          " problems; first: ", found.front()));
}

}  // namespace cxlrt::kv
