// Counters and inspection: the hit, miss and put counters each host
// publishes of itself, Stats, and reading a store without being a host of
// its pool (tools: stats, list, audit).
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

void Store::Impl::CountHit(uint32_t ns, uint32_t partition, uint32_t index, uint64_t gen) {
  Count(hits_.get(), ns);
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
