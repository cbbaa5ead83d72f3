// Put: reserve an unsealed entry and its block, copy the value in, seal it
// (the commit point); batches of host memory, on several threads when
// large; and Delete, which an owner does by evicting its own entry.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::CheckItem;
using kv_internal::CheckName;
using kv_internal::EntryChecksum;
using kv_internal::PartsOf;
using kv_internal::Printable;
using kv_internal::TotalOf;

namespace {

// Batches of at least this many bytes are copied on several threads.
constexpr uint64_t kParallelMinBytes = 1 << 20;

}  // namespace

absl::Status Store::Impl::Put(absl::string_view ns, absl::string_view key, const void* data,
                              size_t size) {
  const runtime::SampledTimer timer;
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, true));
  absl::Status st;
  if (gpu::KindOf(data) == runtime::MemoryKind::kGpu) {
    st = GpuBatchPut(id, ns, {PutItem{key, data, size, {}}}, {runtime::MemoryKind::kGpu}, {})[0];
  } else {
    const PutPart part{data, size};
    st = PutOne(id, ns, key, {&part, 1});
  }
  if (timer.sampled()) {
    if (NsMetrics* m = MetricsOf(id)) timer.Record(m->put_ns);
  }
  return st;
}

std::vector<absl::Status> Store::Impl::BatchPut(absl::string_view ns,
                                                absl::Span<const PutItem> items,
                                                const BatchOptions& options) {
  const runtime::SampledTimer timer;
  std::vector<absl::Status> out(items.size());
  auto id = NamespaceId(ns, true);
  NsMetrics* m = id.ok() ? MetricsOf(*id) : nullptr;
  std::vector<absl::Status> refused;
  if (auto kinds = ItemKinds(items, options.memory, &refused); id.ok() && !kinds.empty()) {
    out = GpuBatchPut(*id, ns, items, kinds, refused, options.stream);
    if (m != nullptr) timer.Record(m->put_ns);
    return out;
  }
  uint64_t bytes = 0;
  for (const PutItem& it : items) {
    bytes += it.size;
    for (const PutPart& p : it.parts) bytes += p.size;
  }
  ForEachItem(items.size(), bytes, [&](size_t i) {
    const PutItem& it = items[i];
    if (!id.ok()) {
      out[i] = id.status();
      return;
    }
    absl::Status st = CheckItem(it);
    PutPart one;
    out[i] = st.ok() ? PutOne(*id, ns, it.key, PartsOf(it, &one)) : st;
  });
  if (m != nullptr) timer.Record(m->put_ns);
  return out;
}

void Store::Impl::ForEachItem(size_t n, uint64_t bytes, const std::function<void(size_t)>& fn) {
  if (bytes >= kParallelMinBytes && n > 1) {
    workers_->Run(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i);
  }
}

absl::Status Store::Impl::PutOne(uint32_t ns, absl::string_view ns_name, absl::string_view key,
                                 absl::Span<const PutPart> parts) {
  const size_t size = TotalOf(parts);
  CXLRT_ASSIGN_OR_RETURN(const Reserved r, Reserve(ns, ns_name, key, size));
  PoolOffset at = r.block;
  for (const PutPart& p : parts) {
    if (p.size > 0) c_.CopyToPool(at, p.data, p.size);
    at += p.size;
  }
  return Seal(ns, key, r, size);
}

absl::StatusOr<Store::Impl::Reserved> Store::Impl::Reserve(uint32_t ns, absl::string_view ns_name,
                                                           absl::string_view key, size_t size) {
  // Index entries, the block's bytes and the commit are this host's
  // writes: under a held lease (docs/membership.md, "Leases"); the commit
  // checks it again (CommitDurable).
  CXLRT_RETURN_IF_ERROR(membership_.ConfirmLease());
  if (size == 0) return absl::InvalidArgumentError("a value of 0 bytes");
  const uint64_t quota = QuotaOf(ns);
  if (quota != 0 && size > quota) {
    return absl::InvalidArgumentError(absl::StrCat("a value of ", size,
                                                   " bytes exceeds the quota of namespace '",
                                                   Printable(ns_name), "' (", quota, " bytes)"));
  }
  const uint64_t hash = KeyHash(ns, key);
  auto exists = [&](uint32_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_[ns].put_exists;
    PublishCounters(ns);
    return absl::AlreadyExistsError(
        absl::StrCat("key '", Printable(key), "' of namespace '", Printable(ns_name),
                     "' is already in the store (put by host ", owner, ")"));
  };
  // The first writer wins: exact within this host (checked again under the
  // lock), best effort across hosts (two hosts putting one key at the same
  // moment may both succeed; readers then find the lower host's).
  // Other hosts' partitions here; this host's own under the lock, from
  // what it knows of its partition.
  CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(ns, key, hash, nullptr, me_));
  if (found) return exists(found->partition);

  const StoreHeaderLayout& h = view_->h();
  const uint32_t mask = h.entries_per_host - 1;
  const uint64_t block_bytes = BlockBytes(size, static_cast<uint32_t>(key.size()));
  uint32_t index = 0;
  PoolOffset block = 0;
  uint64_t gen = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    CXLRT_ASSIGN_OR_RETURN(const bool mine, OwnEntryExists(ns, key, hash));
    if (mine) {
      lock.unlock();
      return exists(me_);
    }
    const uint32_t home = static_cast<uint32_t>(hash) & mask;
    std::vector<uint32_t> window;
    for (uint32_t k = 0; k < h.probe_limit; ++k) window.push_back((home + k) & mask);
    // Quota: evict this host's entries of the namespace to make room.
    if (quota != 0) {
      const uint64_t total = counters_[ns].bytes + NsBytesElsewhere(ns);
      if (total + size > quota) {
        Evict(total + size - quota, 0, [&](uint32_t i) { return local_[i].ns == ns; });
        if (counters_[ns].bytes + NsBytesElsewhere(ns) + size > quota) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "namespace '", Printable(ns_name), "' is at its quota of ", quota,
              " bytes and this host has no more of its entries it may evict (pinned, or held by "
              "other hosts)"));
        }
      }
    }
    // An index slot in the key's probe window.
    int64_t slot = -1;
    for (uint32_t i : window) {
      if (!local_[i].busy && local_[i].state != static_cast<uint64_t>(EntryState::kPut)) {
        slot = i;
        break;
      }
    }
    if (slot < 0) {
      const int64_t v = order_->OldestOf(window);
      if (v >= 0) {
        order_->Remove(static_cast<uint32_t>(v));
        if (!EvictSlots({static_cast<uint32_t>(v)}).empty()) slot = v;
      }
      if (slot < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the index of host ", me_, " has no free slot near this key's (", h.probe_limit,
            " slots from ", home, " are in use or pinned); the store has ", h.entries_per_host,
            " entries per host"));
      }
    }
    index = static_cast<uint32_t>(slot);
    // The block: when the pool is full, evict a batch of this host's
    // entries (a thirty-second of its bytes at least) and try again.
    for (;;) {
      auto b = alloc_.Allocate(block_bytes);
      if (b.ok()) {
        block = *b;
        break;
      }
      if (b.status().code() != absl::StatusCode::kResourceExhausted) return b.status();
      uint64_t mine = 0;
      for (const auto& k : counters_) mine += k.bytes;
      const Evicted ev =
          Evict(std::max<uint64_t>(block_bytes, mine / 32), 0, [](uint32_t) { return true; });
      if (ev.entries == 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("no room in ", pool_.name(), " for a value of ", size, " bytes, and host ",
                         me_, " has no entry it may evict (", b.status().message(), ")"));
      }
    }
    gen = next_gen_++;
    Local& l = local_[index];
    l = Local{static_cast<uint64_t>(EntryState::kPut), true, ns, size, gen, hash, block};
    EntryLayout e = {};
    e.state = static_cast<uint64_t>(EntryState::kPut);
    e.gen = gen;
    e.block = block;
    e.key_hash = hash;
    e.value_size = size;
    e.ns = ns;
    e.key_len = static_cast<uint16_t>(key.size());
    std::memcpy(e.key, key.data(), std::min<size_t>(key.size(), kInlineKeyBytes));
    e.checksum = EntryChecksum(e);
    WriteEntry(index, e);  // unsealed: invisible, and dropped by recovery
  }
  // The copy runs without the lock: other threads put and get meanwhile.
  return Reserved{index, block, gen, hash};
}

void Store::Impl::Abandon(const Reserved& r) {
  std::lock_guard<std::mutex> lock(mu_);
  local_[r.index].busy = false;
  (void)alloc_.Free(r.block);
  Tombstone(r.index);
}

absl::Status Store::Impl::Seal(uint32_t ns, absl::string_view key, const Reserved& r, size_t size) {
  const auto [index, block, gen, hash] = r;
  if (key.size() > kInlineKeyBytes) {
    c_.Publish(block + size, key.data() + kInlineKeyBytes, key.size() - kInlineKeyBytes);
  }
  CXLRT_FAULT_POINT("kv.put.copied");
  // The commit point: the block turns durable and the seal is stored, as
  // one step across crashes.
  absl::Status st =
      alloc_.CommitDurable(block, view_->EntryOff(me_, index) + offsetof(EntryLayout, seal), gen);
  std::lock_guard<std::mutex> lock(mu_);
  Local& l = local_[index];
  l.busy = false;
  if (!st.ok()) {
    (void)alloc_.Free(block);
    Tombstone(index);
    return st;
  }
  order_->Insert(index, hash);
  NsCountersLayout& k = counters_[ns];
  k.entries += 1;
  k.bytes += size;
  k.puts += 1;
  if (NsMetrics* m = MetricsOf(ns)) m->put_bytes.Add(size);
  PublishCounters(ns);
  if (partitions_seen_.load(std::memory_order_relaxed) <= me_) {
    uint32_t seen = partitions_seen_.load();
    while (seen <= me_ && !partitions_seen_.compare_exchange_weak(seen, me_ + 1)) {
    }
  }
  return absl::OkStatus();
}

absl::Status Store::Impl::Delete(absl::string_view ns, absl::string_view key) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, false));
  const uint64_t hash = KeyHash(id, key);
  CXLRT_RETURN_IF_ERROR(membership_.ConfirmLease());
  std::unique_lock<std::mutex> lock(mu_);
  CXLRT_ASSIGN_OR_RETURN(auto found, Search(id, key, hash, me_));
  if (!found) {
    lock.unlock();
    CXLRT_ASSIGN_OR_RETURN(auto other, SearchAll(id, key, hash));
    if (other) {
      return absl::FailedPreconditionError(
          absl::StrCat("key '", Printable(key), "' belongs to host ", other->partition,
                       ": only its owner removes it (by eviction)"));
    }
    return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
  }
  const uint32_t i = found->index;
  if (local_[i].busy || local_[i].gen != found->e.gen) {
    return absl::FailedPreconditionError("the entry is changing; try again");
  }
  order_->Remove(i);
  if (EvictSlots({i}).empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", Printable(key), "' is pinned by a reader; delete it once released"));
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::kv
