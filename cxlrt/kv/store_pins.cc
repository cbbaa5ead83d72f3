// Lookup and pins: the longest cached prefix of a key chain, each entry
// pinned in the same step (a pin is a record in this host's pin table,
// with a lease in its heartbeats); and, for eviction, which of this host's
// entries live hosts have pinned.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::CheckName;
using kv_internal::kPublishEvery;

absl::StatusOr<size_t> Store::Impl::Lookup(absl::string_view ns,
                                           absl::Span<const std::string> chain, PinSet* pins) {
  const runtime::SampledTimer timer;
  for (const std::string& key : chain) CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  auto id = NamespaceId(ns, false);
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kNotFound) return 0;
    return id.status();
  }
  // The lease in this host's own heartbeats, counted from its heartbeat
  // word as others read it (the first word of its owner line).
  const uint64_t beat_ms =
      std::max<int64_t>(absl::ToInt64Milliseconds(membership_.heartbeat_period()), 1);
  // Pins are this host's writes: under a held lease.
  CXLRT_RETURN_IF_ERROR(membership_.ConfirmLease());
  PinLayout pin = {};
  pin.epoch = membership_.epoch();
  pin.expires_beat = c_.LoadFlag(pool_.OwnerLineOffset(me_)) +
                     absl::ToInt64Milliseconds(options_.pin_lease) / beat_ms + 1;
  size_t n = 0;
  for (const std::string& key : chain) {
    CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(*id, key, KeyHash(*id, key)));
    if (!found) break;
    uint32_t rec = 0;
    {
      std::lock_guard<std::mutex> lock(pin_mu_);
      if (free_pins_.empty()) {
        CXLRT_LOG(kWarning) << "KV pin table of host " << me_ << " is full ("
                            << view_->h().pins_per_host << "): a lookup stops at " << n << " keys";
        break;
      }
      rec = free_pins_.back();
      free_pins_.pop_back();
      if (rec >= pins_high_) {
        pins_high_ = rec + 1;
        c_.Publish(view_->PartOff(me_) + offsetof(PartitionHeaderLayout, pins_high), &pins_high_,
                   8);
      }
    }
    pin.partition = found->partition;
    pin.index = found->index;
    pin.gen = found->e.gen;
    // Pin, then check the entry is still sealed: an owner unseals before it
    // reads pins, so either it sees this pin or this check sees the unseal.
    c_.PublishObject(view_->PinOff(me_, rec), pin);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!SealIs(found->partition, found->index, found->e.gen)) {
      static const PinLayout kZero = {};
      c_.PublishObject(view_->PinOff(me_, rec), kZero);
      std::lock_guard<std::mutex> lock(pin_mu_);
      free_pins_.push_back(rec);
      break;
    }
    pins->records_.push_back(rec);
    ++n;
    if (found->partition == me_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (local_[found->index].gen == found->e.gen) order_->Touch(found->index);
    }
  }
  hits_[*id].fetch_add(n, std::memory_order_relaxed);
  if (n < chain.size()) misses_[*id].fetch_add(1, std::memory_order_relaxed);
  if (NsMetrics* m = MetricsOf(*id)) {
    m->lookups.Add();
    timer.Record(m->lookup_ns);
  }
  if (reads_.fetch_add(1, std::memory_order_relaxed) % kPublishEvery == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    PublishCounters(*id);
  }
  return n;
}

void Store::Impl::Release(PinSet& pins) {
  static const PinLayout kZero = {};
  // The records may be a new incarnation's once this host is fenced.
  if (membership_.CheckLease().ok()) {
    for (uint32_t rec : pins.records_) c_.PublishObject(view_->PinOff(me_, rec), kZero);
  }
  std::lock_guard<std::mutex> lock(pin_mu_);
  free_pins_.insert(free_pins_.end(), pins.records_.begin(), pins.records_.end());
  pins.records_.clear();
}

std::vector<std::pair<uint32_t, uint64_t>> Store::Impl::PinnedHere() {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  const StoreHeaderLayout& h = view_->h();
  std::vector<PinLayout> pins;
  for (uint32_t p = 0; p < h.hosts; ++p) {
    uint64_t high = 0;
    c_.Fetch(&high, view_->PartOff(p) + offsetof(PartitionHeaderLayout, pins_high), 8);
    high = std::min<uint64_t>(high, h.pins_per_host);
    if (high == 0) continue;  // this host never pinned: no host record to read
    auto v = membership_.Host(p);
    if (v.ok() && v->liveness != runtime::Liveness::kAlive &&
        v->liveness != runtime::Liveness::kSelf) {
      continue;  // a dead host's pins have expired
    }
    if (!v.ok()) {
      // Without its host record no pin of it can be judged expired: treat
      // them all as live (never evict a pinned entry).
      CXLRT_LOG(kWarning) << "KV eviction cannot read host " << p << ": " << v.status();
    }
    pins.resize(high);
    c_.Fetch(pins.data(), view_->PinOff(p, 0), high * sizeof(PinLayout));
    for (const PinLayout& pin : pins) {
      if (pin.gen == 0 || pin.partition != me_) continue;
      if (v.ok() && (pin.epoch != v->record.epoch || v->record.heartbeat >= pin.expires_beat)) {
        continue;
      }
      out.emplace_back(pin.index, pin.gen);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cxlrt::kv
