// Internal to cxlrt/kv/: the state of a Store and its steps, behind the
// public class (store.h keeps only `struct Impl; std::unique_ptr<Impl>`, as
// LevelDB's DBImpl and MSCCL++'s pimpl do), so the pool's layout and the
// kv internals are not part of the installed surface. The public methods
// forward here. The steps are defined in files of one role each:
//
//   store.cc                  the public class; open (find or make the
//                             store) and close
//   store_recovery.cc         reopening this host's partition as a previous
//                             incarnation left it
//   store_namespaces.cc       namespace ids and quotas
//   store_index.cc            key hashes, searching every partition,
//                             writing this host's
//   store_put.cc              put (reserve, copy, seal) and delete
//   store_get.cc              get and value sizes
//   store_batch.cc            batches whose buffers are GPU memory
//   store_pins.cc             lookup and pins
//   internal/store_evict.cc   eviction, owner side
//   store_inspect.cc          counters, stats, and reading a store as a tool
//
// Thread-safety: as Store's. Each member says which mutex guards it; the
// rest is set at open and read-only after.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/kv/internal/eviction.h"
#include "cxlrt/kv/internal/store_view.h"
#include "cxlrt/kv/internal/workers.h"
#include "cxlrt/kv/kv_layout.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/metrics.h"

namespace cxlrt::kv {

// This process's metrics of one namespace (docs/metrics.md): made when the
// store first learns the namespace's id, read by the store's collector
// without the store's locks. The hits and misses are hits_ / misses_.
struct NsMetrics {
  explicit NsMetrics(std::string ns_name);
  const std::string name;
  runtime::Counter lookups;    // Lookup calls
  runtime::Counter get_bytes;  // value bytes of gets that hit
  runtime::Counter put_bytes;  // value bytes of puts that sealed
  runtime::Histogram lookup_ns, put_ns, get_ns;
};

struct Store::Impl {
  Impl(allocator::Allocator& alloc, const StoreOptions& options);
  // Publishes this host's counters and clears its pins (they end with the
  // process).
  ~Impl();

  // --- Open (store.cc) ---
  absl::Status Init();
  // The pool's store, made when missing and options_.create; waits (10 s in
  // all) for a store another host is writing.
  absl::StatusOr<std::unique_ptr<kv_internal::StoreView>> OpenView();
  // Makes the store's block and header; OK when another host made it first.
  absl::Status MakeStore();
  absl::Status ReclaimUnwrittenStore();

  // --- Recovery (store_recovery.cc) ---
  absl::Status RecoverPartition();

  // --- Namespaces (store_namespaces.cc) ---
  // The id of `ns`, registering it when `create` (kNotFound when it is not
  // registered and !create).
  absl::StatusOr<uint32_t> NamespaceId(absl::string_view ns, bool create);
  absl::Status RefreshNamespaces();
  uint64_t QuotaOf(uint32_t ns);
  absl::Status SetQuota(absl::string_view ns, uint64_t bytes);
  uint64_t NsBytesElsewhere(uint32_t ns);

  // --- The index (store_index.cc) ---
  // What the owner knows of each slot of its partition.
  struct Local {
    uint64_t state = 0;  // EntryState as in the pool
    bool busy = false;   // a put is copying into it
    uint32_t ns = 0;
    uint64_t size = 0;
    uint64_t gen = 0;
    uint64_t hash = 0;
    PoolOffset block = 0;
  };
  struct Found {
    uint32_t partition = 0;
    uint32_t index = 0;
    EntryLayout e{};
  };
  // Searches every partition; nullopt when no visible entry has the key.
  // With `evicting` set, an entry being evicted that has the key is
  // returned (and *evicting set true) when no visible one does.
  absl::StatusOr<std::optional<Found>> Search(uint32_t ns, absl::string_view key, uint64_t hash,
                                              uint32_t only_partition = ~0u,
                                              bool* evicting = nullptr, uint32_t skip = ~0u);
  // Search over every partition but `skip` (~0u: none), widening to
  // partitions first used since the last look when nothing is found.
  absl::StatusOr<std::optional<Found>> SearchAll(uint32_t ns, absl::string_view key, uint64_t hash,
                                                 bool* evicting = nullptr, uint32_t skip = ~0u);
  // True when this host's partition holds a live entry of the key, or a put
  // of it is in flight here (the owner's own view). REQUIRES: mu_.
  absl::StatusOr<bool> OwnEntryExists(uint32_t ns, absl::string_view key, uint64_t hash);
  bool SealIs(uint32_t partition, uint32_t index, uint64_t gen);
  // Writing this host's partition. REQUIRES: mu_ (Tombstone resets local_).
  void WriteEntry(uint32_t index, const EntryLayout& e);
  void WriteEntryHead(uint32_t index, const EntryLayout& e);  // line 0 only
  void Tombstone(uint32_t index);

  // --- Put (store_put.cc) ---
  absl::Status Put(absl::string_view ns, absl::string_view key, const void* data, size_t size);
  std::vector<absl::Status> BatchPut(absl::string_view ns, absl::Span<const PutItem> items,
                                     const BatchOptions& options);
  absl::Status PutOne(uint32_t ns, absl::string_view ns_name, absl::string_view key,
                      absl::Span<const PutPart> parts);
  // A put in three steps: Reserve makes the unsealed entry and its block
  // (invisible to readers, dropped by recovery); the caller copies the
  // value into r.block; Seal publishes it (or Abandon undoes Reserve).
  struct Reserved {
    uint32_t index;
    PoolOffset block;
    uint64_t gen;
    uint64_t hash;
  };
  absl::StatusOr<Reserved> Reserve(uint32_t ns, absl::string_view ns_name, absl::string_view key,
                                   size_t size);
  absl::Status Seal(uint32_t ns, absl::string_view key, const Reserved& r, size_t size);
  void Abandon(const Reserved& r);
  absl::Status Delete(absl::string_view ns, absl::string_view key);
  // Runs fn(i), i in [0, n), on several threads when the batch is large.
  void ForEachItem(size_t n, uint64_t bytes, const std::function<void(size_t)>& fn);

  // --- Get (store_get.cc) ---
  absl::StatusOr<size_t> Get(absl::string_view ns, absl::string_view key, void* dst,
                             size_t capacity);
  std::vector<absl::StatusOr<size_t>> BatchGet(absl::string_view ns,
                                               absl::Span<const GetItem> items,
                                               const BatchOptions& options);
  absl::StatusOr<uint64_t> ValueSize(absl::string_view ns, absl::string_view key);
  absl::StatusOr<bool> Contains(absl::string_view ns, absl::string_view key);
  // Copies the value into `parts`, through `dev` when set (they are GPU
  // memory). `exact`: the value must fill the parts (else it must fit).
  absl::StatusOr<size_t> GetOne(uint32_t ns, absl::string_view key, absl::Span<const GetPart> parts,
                                bool exact, gpu::DmaEngine* dev = nullptr);

  // --- GPU memory (store_batch.cc) ---
  // docs/gpu.md, "KV blocks": batches whose buffers are GPU memory run
  // here, their copies pipelined on the CUDA engine.
  // The memory kind of each item (`told`, or of its first part); empty
  // when no item is GPU memory and none is refused. `refused` gets an
  // error for an item whose parts mix kinds or are not of the told kind.
  template <typename Item>
  std::vector<runtime::MemoryKind> ItemKinds(absl::Span<const Item> items,
                                             std::optional<runtime::MemoryKind> told,
                                             std::vector<absl::Status>* refused);
  // The engine, its copies ordered after `stream`'s work so far (null:
  // the legacy default stream). REQUIRES: gpu_mu_
  absl::StatusOr<gpu::DmaEngine*> Dma(void* stream);
  std::vector<absl::Status> GpuBatchPut(uint32_t ns, absl::string_view ns_name,
                                        absl::Span<const PutItem> items,
                                        const std::vector<runtime::MemoryKind>& kinds,
                                        const std::vector<absl::Status>& refused,
                                        void* stream = nullptr);
  std::vector<absl::StatusOr<size_t>> GpuBatchGet(uint32_t ns, absl::Span<const GetItem> items,
                                                  const std::vector<runtime::MemoryKind>& kinds,
                                                  const std::vector<absl::Status>& refused,
                                                  void* stream = nullptr);

  // --- Lookup and pins (store_pins.cc) ---
  absl::StatusOr<size_t> Lookup(absl::string_view ns, absl::Span<const std::string> chain,
                                PinSet* pins);
  void Release(PinSet& pins);
  // (index, gen) of this partition's entries pinned by live hosts' pins.
  std::vector<std::pair<uint32_t, uint64_t>> PinnedHere();

  // --- Eviction, owner side (internal/store_evict.cc) ---
  // REQUIRES mu_: evicts this host's entries (those `eligible`) until
  // `bytes` of values are gone or `count` entries; returns what went.
  struct Evicted {
    uint64_t bytes = 0;
    uint32_t entries = 0;
  };
  Evicted Evict(uint64_t bytes, uint32_t count, const std::function<bool(uint32_t)>& eligible);
  // Evicts the given slots unless pinned; returns those evicted, and adds
  // them to `evicted` when set.
  std::vector<uint32_t> EvictSlots(const std::vector<uint32_t>& victims,
                                   Evicted* evicted = nullptr);

  // --- Counters and stats (store_inspect.cc) ---
  // A hit of (partition, index, gen) that got `bytes`: counted, and touched
  // when it is ours.
  void CountHit(uint32_t ns, uint32_t partition, uint32_t index, uint64_t gen, uint64_t bytes);
  void Count(std::atomic<uint64_t>* counter, uint32_t ns);
  void PublishCounters(uint32_t ns);
  absl::StatusOr<StoreStats> Stats();
  // The metrics of namespace `id` (made by NoteNamespace), or null.
  NsMetrics* MetricsOf(uint32_t id) const {
    return id < ns_metrics_count_ ? ns_metrics_[id].load(std::memory_order_acquire) : nullptr;
  }
  // Makes the metrics of namespace `id`, named `name`, once. REQUIRES: ns_mu_.
  void NoteNamespace(uint32_t id);
  // The samples of this store's metrics (its collector).
  void CollectMetrics(std::vector<runtime::Sample>* out);

  // --- State (declared in the order it is made; destroyed in reverse) ---
  std::mutex gpu_mu_;                    // one GPU batch at a time
  std::unique_ptr<gpu::DmaEngine> dma_;  // guarded by gpu_mu_

  allocator::Allocator& alloc_;
  runtime::Pool& pool_;
  runtime::Coherence& c_;
  runtime::Membership& membership_;
  const StoreOptions options_;
  const uint32_t me_;
  std::unique_ptr<kv_internal::StoreView> view_;

  std::mutex ns_mu_;
  std::vector<std::string> ns_names_;                  // guarded by ns_mu_: by id ("" unused)
  absl::flat_hash_map<std::string, uint32_t> ns_ids_;  // guarded by ns_mu_

  // This host's partition (owner side).
  std::mutex mu_;
  std::vector<Local> local_;                           // guarded by mu_: by index
  std::unique_ptr<kv_internal::EvictionOrder> order_;  // guarded by mu_
  std::vector<NsCountersLayout> counters_;             // guarded by mu_: by ns
  uint64_t next_gen_ = 0;                              // guarded by mu_

  // Reader-side counters, published with the owner's under mu_.
  std::unique_ptr<std::atomic<uint64_t>[]> hits_, misses_;
  std::atomic<uint64_t> reads_{0};

  // This host's pin table.
  std::mutex pin_mu_;
  std::vector<uint32_t> free_pins_;  // guarded by pin_mu_
  uint64_t pins_high_ = 0;           // guarded by pin_mu_

  // Partitions [0, partitions_seen_) have been used by some host.
  std::atomic<uint32_t> partitions_seen_{0};

  std::unique_ptr<kv_internal::Workers> workers_;

  // By namespace id; each set once under ns_mu_, freed with the Impl.
  std::unique_ptr<std::atomic<NsMetrics*>[]> ns_metrics_;
  uint32_t ns_metrics_count_ = 0;
  // Registered last, unregistered first (it reads the state above).
  std::unique_ptr<runtime::MetricsCollector> collector_;
};

}  // namespace cxlrt::kv
