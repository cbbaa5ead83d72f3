// The public class, forwarding to its Impl; opening a store (finding it,
// or making it, or reclaiming one its creator never finished) and closing
// it. The other steps live in files of their own (internal/store_impl.h
// lists them).
#include "cxlrt/kv/store.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::StoreView;

// --- The public class ---

Store::Store(allocator::Allocator& alloc, const StoreOptions& options)
    : impl_(std::make_unique<Impl>(alloc, options)) {}

Store::~Store() = default;

absl::Status Store::Put(absl::string_view ns, absl::string_view key, const void* data,
                        size_t size) {
  return impl_->Put(ns, key, data, size);
}

std::vector<absl::Status> Store::BatchPut(absl::string_view ns, absl::Span<const PutItem> items,
                                          const BatchOptions& options) {
  return impl_->BatchPut(ns, items, options);
}

absl::StatusOr<size_t> Store::Get(absl::string_view ns, absl::string_view key, void* dst,
                                  size_t capacity) {
  return impl_->Get(ns, key, dst, capacity);
}

std::vector<absl::StatusOr<size_t>> Store::BatchGet(absl::string_view ns,
                                                    absl::Span<const GetItem> items,
                                                    const BatchOptions& options) {
  return impl_->BatchGet(ns, items, options);
}

absl::StatusOr<uint64_t> Store::ValueSize(absl::string_view ns, absl::string_view key) {
  return impl_->ValueSize(ns, key);
}

absl::StatusOr<bool> Store::Contains(absl::string_view ns, absl::string_view key) {
  return impl_->Contains(ns, key);
}

absl::StatusOr<size_t> Store::Lookup(absl::string_view ns, absl::Span<const std::string> chain,
                                     PinSet* pins) {
  return impl_->Lookup(ns, chain, pins);
}

void Store::Release(PinSet& pins) { impl_->Release(pins); }

absl::Status Store::Delete(absl::string_view ns, absl::string_view key) {
  return impl_->Delete(ns, key);
}

absl::Status Store::SetQuota(absl::string_view ns, uint64_t bytes) {
  return impl_->SetQuota(ns, bytes);
}

absl::StatusOr<StoreStats> Store::Stats() { return impl_->Stats(); }

uint32_t Store::slot() const { return impl_->me_; }

// --- Open and close ---

Store::Impl::Impl(allocator::Allocator& alloc, const StoreOptions& options)
    : alloc_(alloc),
      pool_(alloc.pool()),
      c_(alloc.pool().coherence()),
      membership_(alloc.membership()),
      options_(options),
      me_(alloc.slot()),
      workers_(std::make_unique<kv_internal::Workers>(options.copy_threads)) {}

Store::Impl::~Impl() {
  collector_.reset();  // before what it reads
  for (uint32_t id = 0; id < ns_metrics_count_; ++id) delete ns_metrics_[id].load();
  std::lock_guard<std::mutex> lock(mu_);
  if (!view_ || local_.empty()) return;
  // Fenced (or the lease cannot be renewed): the partition may be a
  // survivor's or a new incarnation's by now; write nothing.
  if (!membership_.ConfirmLease().ok()) return;
  for (uint32_t ns = 0; ns < counters_.size(); ++ns) {
    if (counters_[ns].puts || hits_[ns] || misses_[ns]) PublishCounters(ns);
  }
  // This process's pins end with it.
  std::lock_guard<std::mutex> pl(pin_mu_);
  for (uint64_t k = 0; k < pins_high_; ++k) {
    static const PinLayout kZero = {};
    c_.PublishObject(view_->PinOff(me_, static_cast<uint32_t>(k)), kZero);
  }
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(allocator::Allocator& alloc,
                                                   const StoreOptions& options) {
  if (options.pin_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("pin_lease must be positive");
  }
  if (options.copy_threads < 1 || options.copy_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_threads ", options.copy_threads, " is not in [1, 64]"));
  }
  std::unique_ptr<Store> s(new Store(alloc, options));
  CXLRT_RETURN_IF_ERROR(s->impl_->Init());
  return s;
}

namespace {

// True when `v` is a store header that its creator never finished.
bool Unwritten(const absl::StatusOr<std::unique_ptr<StoreView>>& v) {
  return !v.ok() && v.status().code() == absl::StatusCode::kDataLoss &&
         absl::StrContains(v.status().message(), "not written");
}

}  // namespace

absl::Status Store::Impl::ReclaimUnwrittenStore() {
  // A store whose header was never written belongs to its creator while it
  // lives; once its host is dead, fenced or gone, nothing will write it, and
  // the block is freed so that the next open makes the store afresh (it was
  // bricked for every later open before: issue 13, defect 6).
  auto found = alloc_.Find(kStoreRegionName);
  if (!found.ok()) return absl::OkStatus();  // freed meanwhile
  auto host = membership_.Host(found->owner_host);
  const bool creator_gone = host.ok() && (host->liveness == runtime::Liveness::kDead ||
                                          host->liveness == runtime::Liveness::kFenced ||
                                          host->liveness == runtime::Liveness::kFree);
  if (!creator_gone) return absl::OkStatus();
  CXLRT_LOG(kWarning) << "the KV store of " << pool_.name() << " was never written by host slot "
                      << found->owner_host << ", which is " << runtime::LivenessName(host->liveness)
                      << ": freeing it";
  absl::Status s = alloc_.FreeNamed(kStoreRegionName);
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Status Store::Impl::MakeStore() {
  CXLRT_ASSIGN_OR_RETURN(StoreHeaderLayout h, kv_internal::PlanStore(options_, pool_.host_slots()));
  allocator::AllocOptions ao;
  ao.alignment = 4096;
  auto off = alloc_.AllocateNamed(kStoreRegionName, h.store_bytes, ao);
  if (!off.ok()) {
    // Another host made it first: open theirs.
    return off.status().code() == absl::StatusCode::kAlreadyExists ? absl::OkStatus()
                                                                   : off.status();
  }
  // Zero the tables (header line first, so nobody reads an old store's
  // header here), then publish the header: its checksum makes it whole.
  static const uint8_t kZeros[64 << 10] = {};
  c_.CopyToPool(*off, kZeros, sizeof(StoreHeaderLayout));
  for (uint64_t done = 0; done < h.store_bytes; done += sizeof(kZeros)) {
    c_.CopyToPool(*off + done, kZeros, std::min<uint64_t>(sizeof(kZeros), h.store_bytes - done));
  }
  CXLRT_FAULT_POINT("kv.create.zeroed");
  c_.PublishObject(*off, h);
  CXLRT_LOG(kInfo) << "host " << me_ << " made the KV store of " << pool_.name() << " (" << h.hosts
                   << " hosts x " << h.entries_per_host << " entries, " << h.store_bytes
                   << " bytes)";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StoreView>> Store::Impl::OpenView() {
  // One deadline for the whole open, however often a creator dies on us:
  // a store another host is making is waited for; one whose creator died
  // unwritten is freed and made again.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    auto view = StoreView::Open(pool_);
    if (Unwritten(view)) {
      if (absl::Now() >= deadline) return view;
      CXLRT_RETURN_IF_ERROR(ReclaimUnwrittenStore());
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    if (view.ok() || view.status().code() != absl::StatusCode::kNotFound || !options_.create) {
      return view;
    }
    CXLRT_RETURN_IF_ERROR(MakeStore());
  }
}

absl::Status Store::Impl::Init() {
  auto view = OpenView();
  if (!view.ok()) return view.status();
  view_ = std::move(*view);
  const StoreHeaderLayout& h = view_->h();
  if (me_ >= h.hosts) {
    return absl::FailedPreconditionError(
        absl::StrCat("host slot ", me_, " has no partition in the KV store of ", pool_.name(),
                     ", which was made for host slots 0..", h.hosts - 1));
  }
  local_.resize(h.entries_per_host);
  order_ = std::make_unique<kv_internal::EvictionOrder>(options_.policy == EvictionPolicy::kLru
                                                            ? kv_internal::Policy::kLru
                                                            : kv_internal::Policy::kS3Fifo,
                                                        h.entries_per_host);
  counters_.assign(h.max_namespaces, NsCountersLayout{});
  hits_ = std::make_unique<std::atomic<uint64_t>[]>(h.max_namespaces);
  misses_ = std::make_unique<std::atomic<uint64_t>[]>(h.max_namespaces);
  ns_metrics_ = std::make_unique<std::atomic<NsMetrics*>[]>(h.max_namespaces);
  ns_metrics_count_ = h.max_namespaces;
  {
    std::lock_guard<std::mutex> lock(ns_mu_);
    CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
  }
  CXLRT_RETURN_IF_ERROR(RecoverPartition());
  uint32_t seen = 0;
  for (uint32_t p = 0; p < h.hosts; ++p) {
    if (view_->PartitionEpoch(p) != 0) seen = p + 1;
  }
  partitions_seen_.store(seen, std::memory_order_release);
  collector_ = std::make_unique<runtime::MetricsCollector>(
      [this](std::vector<runtime::Sample>* out) { CollectMetrics(out); });
  return absl::OkStatus();
}

}  // namespace cxlrt::kv
