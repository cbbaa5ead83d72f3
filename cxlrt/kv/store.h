// The KV-cache block store: hosts put KV-cache blocks into the pool under a
// (namespace, key) and any host gets them, looks up the longest cached
// prefix of a key chain and pins what it found. docs/kv.md is the protocol.
//
// - Entries are write-once: a put allocates a block, copies the value in,
//   then seals its entry (the block becomes durable in the same step). A
//   second put of a key that is there reports kAlreadyExists.
// - Each host slot writes only its own index partition, counters and pin
//   table; readers search every partition. No coordinator, no cross-host
//   read-modify-write.
// - A get copies the value and then checks that the entry's seal still
//   names the same put: a get that raced an eviction retries or reports
//   kNotFound, never returns other bytes. Pins (from Lookup) keep entries
//   from eviction until released, or until the pinning host dies or its
//   lease runs out.
// - Everything lives in the pool: a host that restarts finds its entries;
//   a host that dies leaves its entries readable (evicted once a host takes
//   its slot again) and its unfinished puts invisible and reclaimed.
//
// Thread-safety: a Store is thread-safe. One Store per Allocator.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/memory_kind.h"

namespace cxlrt::kv {

using runtime::PoolOffset;

enum class EvictionPolicy { kLru, kS3Fifo };

struct StoreOptions {
  // Make the store when the pool has none (else kNotFound).
  bool create = false;
  // The geometry of a store being made (ignored when it exists): host
  // slots [0, hosts) get a partition of `entries_per_host` index slots (a
  // power of two) and `pins_per_host` pin records. hosts 0: every host slot
  // of the pool.
  uint32_t hosts = 0;
  uint32_t entries_per_host = 4096;
  uint32_t pins_per_host = 1024;
  uint32_t max_namespaces = 64;
  // This host's eviction order (each host evicts only its own entries).
  EvictionPolicy policy = EvictionPolicy::kLru;
  // How long a pin lasts unless released (measured in the pinning host's
  // heartbeats, so no clocks are compared across hosts).
  absl::Duration pin_lease = absl::Seconds(30);
  // Threads that copy the items of a BatchPut / BatchGet of 1 MiB or more,
  // the calling thread included (1: the caller alone).
  int copy_threads = 2;
};

// Pins taken by Lookup, released by Release (or by destroying the Store).
class PinSet {
 public:
  size_t size() const { return records_.size(); }
  bool empty() const { return records_.empty(); }

 private:
  friend class Store;
  std::vector<uint32_t> records_;  // this host's pin records
};

// A value may be kept in parts: a paged KV block is the K and V pages of
// every layer, each in its own tensor. The value is its parts in order,
// copied straight between them and the pool (no staging buffer).
struct PutPart {
  const void* data = nullptr;
  size_t size = 0;
};
struct GetPart {
  void* data = nullptr;
  size_t size = 0;
};

// One buffer (data, size) or, when `parts` is not empty, parts (data and
// size then stay unset). The parts of one item are all host memory or all
// GPU memory.
struct PutItem {
  absl::string_view key;
  const void* data = nullptr;
  size_t size = 0;
  absl::Span<const PutPart> parts;
};

// One buffer (dst, capacity: at least the value's size) or parts, whose
// sizes must add up to the value's size exactly (the layout must match
// the put's; kInvalidArgument otherwise, and nothing is copied).
struct GetItem {
  absl::string_view key;
  void* dst = nullptr;
  size_t capacity = 0;
  absl::Span<const GetPart> parts;
};

struct BatchOptions {
  // The memory kind of every buffer of the batch, when the caller knows it
  // (as UCX's memory_type). Unset, the store asks CUDA about every buffer
  // and part (cudaPointerGetAttributes: a paged block of 80 layers is 160
  // calls). Set, it asks about each item's first buffer only: an item
  // whose first buffer is of another kind is kInvalidArgument, GPU memory
  // where no GPU is usable kUnavailable. The rest are taken to be of it.
  std::optional<runtime::MemoryKind> memory;
  // The stream (a cudaStream_t) whose work so far a GPU batch's copies
  // start after: the producer's, when it wrote the pages on a non-blocking
  // stream, which the legacy default stream (null, the default) does not
  // wait for. Put and Get, and host batches, order after the legacy stream
  // only (docs/gpu.md, "KV blocks in GPU memory").
  void* stream = nullptr;
};

struct NamespaceStats {
  std::string name;
  uint64_t quota = 0;  // 0: none
  uint64_t entries = 0;
  uint64_t bytes = 0;  // value bytes
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t puts = 0;
  uint64_t put_exists = 0;
};

struct StoreStats {
  uint32_t hosts = 0;
  uint32_t entries_per_host = 0;
  uint32_t pins_per_host = 0;
  uint32_t max_namespaces = 0;
  uint64_t live_entries = 0;  // in every partition
  std::vector<NamespaceStats> namespaces;
};

struct EntryInfo {
  std::string ns;
  std::string key;
  uint64_t value_size = 0;
  uint32_t owner = 0;  // partition (host slot)
  uint32_t index = 0;
  uint64_t gen = 0;
  PoolOffset block = 0;
};

class Store {
 public:
  // Opens the store of `alloc`'s pool as `alloc`'s host slot, making it
  // when options.create. Recovers this slot's partition as a previous
  // incarnation left it (finished puts stay, unfinished ones are dropped,
  // interrupted evictions finished). kNotFound: no store and !create;
  // kDataLoss: a corrupt store; kFailedPrecondition: this host's slot has
  // no partition; kInvalidArgument: bad geometry.
  // REQUIRES: alloc outlives the Store.
  static absl::StatusOr<std::unique_ptr<Store>> Open(allocator::Allocator& alloc,
                                                     const StoreOptions& options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores `size` bytes under (ns, key). kAlreadyExists when the key is
  // there (the first writer wins); kInvalidArgument: empty or oversized
  // namespace or key, size 0, a value larger than the namespace's quota;
  // kResourceExhausted: no room after evicting what this host may evict.
  absl::Status Put(absl::string_view ns, absl::string_view key, const void* data, size_t size);
  // Put of each item; one status per item.
  // Items of a batch of 1 MiB or more are put on `copy_threads` threads.
  std::vector<absl::Status> BatchPut(absl::string_view ns, absl::Span<const PutItem> items,
                                     const BatchOptions& options = {});

  // Copies the value of (ns, key) into dst and returns its size. kNotFound
  // (dst's bytes are then unspecified: a copy that raced an eviction may
  // have begun); kInvalidArgument when `capacity` is too small (the message
  // says the size needed; nothing is copied).
  absl::StatusOr<size_t> Get(absl::string_view ns, absl::string_view key, void* dst,
                             size_t capacity);
  std::vector<absl::StatusOr<size_t>> BatchGet(absl::string_view ns,
                                               absl::Span<const GetItem> items,
                                               const BatchOptions& options = {});
  // The value size of (ns, key), or kNotFound.
  absl::StatusOr<uint64_t> ValueSize(absl::string_view ns, absl::string_view key);
  absl::StatusOr<bool> Contains(absl::string_view ns, absl::string_view key);

  // The number of leading keys of `chain` that are present, each pinned in
  // the same step (added to `pins`). Stops at the first missing key, or
  // when this host's pin table is full.
  absl::StatusOr<size_t> Lookup(absl::string_view ns, absl::Span<const std::string> chain,
                                PinSet* pins);
  // Releases every pin of `pins` and empties it.
  void Release(PinSet& pins);

  // Deletes (ns, key) from this host's partition. kNotFound when this host
  // has no such entry; kFailedPrecondition when another host owns it (only
  // its owner removes it) or a reader has it pinned.
  absl::Status Delete(absl::string_view ns, absl::string_view key);

  // Sets the quota of `ns` (bytes of values across every host; 0: none).
  absl::Status SetQuota(absl::string_view ns, uint64_t bytes);

  // Counters of every namespace, summed over hosts (each host publishes its
  // own; this host's are exact).
  absl::StatusOr<StoreStats> Stats();

  // This host's slot: the partition it writes.
  uint32_t slot() const;

 private:
  // The state and the steps (internal/store_impl.h); the pool's layout
  // and the kv internals stay out of this header.
  struct Impl;
  Store(allocator::Allocator& alloc, const StoreOptions& options);
  std::unique_ptr<Impl> impl_;
};

// --- Reading a store without being a host of the pool (tools). ---

// True when the pool holds a store.
bool HasStore(const runtime::Pool& pool);
absl::StatusOr<StoreStats> ReadStats(const runtime::Pool& pool);
// Every visible entry, of namespace `ns` only when set.
absl::StatusOr<std::vector<EntryInfo>> ListEntries(const runtime::Pool& pool,
                                                   std::optional<std::string> ns = std::nullopt);
// Checks every invariant of the store's tables (docs/kv.md): sealed entries
// describe their blocks, no block serves two entries, each host's published
// counters match its index, pins name index slots. Exact on a quiescent
// store. Returns OK, or kDataLoss summarising the problems, each appended to
// `problems`.
absl::Status Audit(const runtime::Pool& pool, std::vector<std::string>* problems = nullptr);

// The 64-bit hash of a key in namespace `ns`, as the index uses it.
uint64_t KeyHash(uint32_t ns, absl::string_view key);

}  // namespace cxlrt::kv
