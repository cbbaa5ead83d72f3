// Internal to cxlrt/kv/: a read-only view of a store's tables in a pool, with
// every offset checked. The Store uses it for its reads; tools use it
// without attaching as a host.
//
// Thread-safety: a StoreView is immutable after Open and safe from any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/kv/kv_layout.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::kv_internal {

using kv::EntryLayout;
using kv::NamespaceLayout;
using kv::NsCountersLayout;
using kv::StoreHeaderLayout;
using runtime::PoolOffset;

uint32_t HeaderChecksum(const StoreHeaderLayout& h);
uint32_t NamespaceChecksum(const NamespaceLayout& n);
uint32_t EntryChecksum(const EntryLayout& e);

// The tables' layout for a geometry; kInvalidArgument for a bad one.
absl::StatusOr<StoreHeaderLayout> PlanStore(kv::StoreOptions o, uint32_t pool_hosts);

enum class Slot {
  kEmpty,      // never used: a search stops
  kInvisible,  // tombstone, a put in flight, an eviction
  kVisible,    // sealed, checksum good, bounds good
  kEvicting,   // being evicted (checksum and bounds good): it goes, or comes back if pinned
  kTorn,       // changed while read (retried, still not whole)
  kCorrupt,    // sealed and whole but naming bytes outside the pool
};

class StoreView {
 public:
  // kNotFound when the pool has no store; kDataLoss when its header or
  // block is not valid.
  static absl::StatusOr<std::unique_ptr<StoreView>> Open(const runtime::Pool& pool);

  const StoreHeaderLayout& h() const { return h_; }
  runtime::Coherence& c() const { return pool_.coherence(); }
  PoolOffset base() const { return base_; }

  PoolOffset PartOff(uint32_t p) const {
    return base_ + h_.partitions_offset + p * h_.partition_stride;
  }
  PoolOffset EntryOff(uint32_t p, uint32_t i) const {
    return PartOff(p) + h_.entries_offset + uint64_t{i} * sizeof(EntryLayout);
  }
  PoolOffset PinOff(uint32_t p, uint32_t k) const {
    return PartOff(p) + h_.pins_offset + uint64_t{k} * sizeof(kv::PinLayout);
  }
  PoolOffset CounterOff(uint32_t p, uint32_t ns) const {
    return PartOff(p) + h_.counters_offset + uint64_t{ns} * sizeof(NsCountersLayout);
  }
  PoolOffset NsOff(uint32_t id) const {
    return base_ + h_.namespaces_offset + uint64_t{id} * sizeof(NamespaceLayout);
  }

  // Reads index slot (p, i) into `e`, retrying a torn read a few times.
  Slot ReadEntry(uint32_t p, uint32_t i, EntryLayout* e) const;
  // Namespace `id`: nullopt when unused; kDataLoss when its record stays torn.
  absl::StatusOr<std::optional<NamespaceLayout>> ReadNamespace(uint32_t id) const;
  NsCountersLayout ReadCounters(uint32_t p, uint32_t ns) const;
  uint64_t PartitionEpoch(uint32_t p) const;

  absl::StatusOr<kv::StoreStats> Stats() const;
  // Appends every broken invariant (docs/kv.md) to `problems`.
  void Audit(std::vector<std::string>* problems) const;
  absl::StatusOr<std::vector<kv::EntryInfo>> List(const std::optional<std::string>& ns) const;

 private:
  StoreView(const runtime::Pool& pool, PoolOffset base, const StoreHeaderLayout& h)
      : pool_(pool), base_(base), h_(h) {}

  const runtime::Pool& pool_;
  const PoolOffset base_;
  const StoreHeaderLayout h_;
};

}  // namespace cxlrt::kv_internal
