// The pooled allocator: one heap in the pool shared by every host, with
// single-writer metadata and recovery of dead hosts (docs/allocator.md).
//
// - The heap is cut into 2 MiB segments. A host claims segments under the
//   pool lock (rare) into its arena; only it writes its segments' metadata.
// - Small blocks (64 B - 256 KiB, 24 classes) come from slab segments;
//   medium ones (up to 1984 KiB) from runs of 64 KiB pages in page
//   segments; larger ones, or alignment above 64 KiB, are runs of whole
//   segments (2 MiB aligned, for GPU DMA registration).
// - Freeing another host's block sends its offset through a single-producer
//   ring (one per host pair) to the owner, which reclaims it on its next
//   allocation slow path or background tick. No lock and no atomic on any
//   cross-host path.
// - Blocks are private (they die with their host: a dead or closing host's
//   private blocks are reclaimed) or durable (they outlive it; named blocks
//   are durable). A survivor fences a dead host and recovers its arena.
//
// Thread-safety: an Allocator is thread-safe. Each thread has a cache of
// small private blocks in front of the arena: a local allocate or free of
// one takes no lock (docs/allocator.md). One Allocator per Membership.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator_layout.h"
#include "cxlrt/allocator/internal/free_queue.h"
#include "cxlrt/allocator/pool_ptr.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::allocator {

using runtime::PoolOffset;

struct AllocOptions {
  // A power of two; below 64 means 64. Up to 64 KiB from slabs and pages,
  // beyond that whole segments (2 MiB aligned, or more when asked).
  uint64_t alignment = 64;
  // The block outlives this host: it is not reclaimed when the host dies or
  // closes its allocator (only Free / FreeNamed release it).
  bool durable = false;
  // The pool device (devices= in the URI) that must hold the whole block;
  // -1: any. A placed block is a run of whole 2 MiB segments.
  int device = -1;
};

struct AllocatorOptions {
  // Period of the background tick: drain the free rings, push queued remote
  // frees, publish statistics. Zero: no background thread (call Tick()).
  absl::Duration tick = absl::Milliseconds(2);
  // The tick also fences dead hosts and recovers their arenas.
  bool recover_dead_hosts = true;
};

struct ClassStats {
  uint64_t allocated = 0;   // blocks whose alloc bit is set
  uint64_t handed_out = 0;  // of those, held by callers (the rest: cached)
  uint64_t durable = 0;
};

struct HostStats {
  uint32_t slot = 0;
  uint64_t owner_epoch = 0;   // 0: unowned (its host left or died; durable blocks remain)
  uint64_t segments = 0;      // slab, page and huge segments in the arena
  uint64_t bytes_in_use = 0;  // held by callers: class sizes, pages, huge segments
  uint64_t bytes_cached = 0;  // allocated in slabs but free in the owner's cache
  uint64_t durable_bytes = 0;
  uint64_t rejected_frees = 0;
  std::array<ClassStats, kNumClasses> classes{};
  uint64_t pages_allocated = 0;
  uint64_t huge_segments = 0;
};

struct AllocatorStats {
  uint64_t heap_bytes = 0;
  uint32_t segment_count = 0;
  uint32_t meta_segments = 0;
  uint32_t free_segments = 0;
  // Free space: free segments, free blocks in slabs and free pages.
  uint64_t free_bytes = 0;
  // The longest run of free segments, in bytes: the largest huge block that
  // can be had now.
  uint64_t largest_free_extent = 0;
  // External fragmentation: 1 - largest_free_extent / free_bytes.
  double fragmentation = 0;
  std::vector<HostStats> hosts;  // arenas that hold anything
};

struct NamedBlock {
  PoolOffset offset = 0;
  uint64_t size = 0;
  uint32_t owner_host = 0;
};

}  // namespace cxlrt::allocator

namespace cxlrt::allocator_internal {
class ArenaState;
class HeapMeta;
enum class BlockState : uint8_t;
struct ThreadCache;
struct ThreadCacheRegistry;
}  // namespace cxlrt::allocator_internal

namespace cxlrt::allocator {

class Allocator {
 public:
  // Opens the allocator of `pool` for the host `membership` is attached as;
  // creates the allocator's metadata when the pool has none. Recovers this
  // slot's arena when a previous incarnation left it (private blocks
  // reclaimed). kResourceExhausted when the pool is too small for the
  // allocator's tables; kDataLoss when they are corrupt.
  // REQUIRES: pool and membership outlive the Allocator; one per Membership.
  static absl::StatusOr<std::unique_ptr<Allocator>> Open(runtime::Pool& pool,
                                                         runtime::Membership& membership,
                                                         const AllocatorOptions& options = {});
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Allocates `size` bytes. Returns the block's pool offset, aligned as
  // asked. kInvalidArgument: size 0, bad alignment, larger than the heap;
  // kResourceExhausted: no space (after reclaiming what others freed);
  // kAborted: this host was fenced.
  absl::StatusOr<PoolOffset> Allocate(uint64_t size, const AllocOptions& options = {});
  template <typename T>
  absl::StatusOr<PoolPtr<T>> New(const AllocOptions& options = {}) {
    auto off = Allocate(sizeof(T), options);
    if (!off.ok()) return off.status();
    return PoolPtr<T>(*off);
  }

  // Frees the block at `offset`, this host's or another's (then through the
  // ring to its owner, in batches of 16 or at the next tick). kInvalidArgument: outside the heap or
  // not at a block start; kFailedPrecondition: not allocated (double free), or a named block (use
  // FreeNamed). A double free of a block that its owner holds in its cache is caught by the owner,
  // logged and counted in its stats.
  absl::Status Free(PoolOffset offset);
  template <typename T>
  absl::Status Free(PoolPtr<T> p) {
    return Free(p.offset());
  }

  // Two steps that change a block of this host and an 8-byte word in the
  // pool as one, across crashes (like PMDK's reserve/publish): the arena
  // writes an intent record first, and recovery of the arena (by this slot's
  // next incarnation or by a survivor) finishes an interrupted one before it
  // reclaims private blocks. A KV entry's seal is such a word: the entry is
  // visible exactly when its block is durable.
  //
  // CommitDurable: the private block at `block`, allocated by this host and
  // held by the caller, becomes durable, then `value` is published at `word`.
  // FreeDurable: the durable block at `block` of this host is freed, then
  // `value` is published at `word`. REQUIRES: the block is not published by
  // name (FreeNamed frees those; this call does not search the directory).
  // kInvalidArgument: not a block of this host, or `word` not an 8-byte
  // aligned word of the pool; kFailedPrecondition: the block is not in the
  // state the call needs (nothing changed then); kAborted when fenced.
  absl::Status CommitDurable(PoolOffset block, PoolOffset word, uint64_t value);
  absl::Status FreeDurable(PoolOffset block, PoolOffset word, uint64_t value);

  // Usable bytes of the block at `offset` (its class, pages or segments).
  absl::StatusOr<uint64_t> BlockSize(PoolOffset offset);

  // Allocates a durable block and publishes it under `name` in the pool's
  // region directory, so any host can Find it. kAlreadyExists when taken.
  absl::StatusOr<PoolOffset> AllocateNamed(absl::string_view name, uint64_t size,
                                           const AllocOptions& options = {});
  // The named block, bounds-checked. kNotFound when none.
  absl::StatusOr<NamedBlock> Find(absl::string_view name);
  // Unpublishes the name and frees its block (any host may).
  absl::Status FreeNamed(absl::string_view name);

  // What the background tick does: drain this host's free rings, push
  // queued remote frees, publish statistics. kAborted when fenced.
  absl::Status Tick();

  // Fences every host seen dead that still has an arena, recovers its arena
  // (private blocks freed, durable and named ones kept) and frees its slot.
  // Returns the slots recovered. Idempotent: a recovery interrupted by a
  // crash is finished by the next one.
  absl::StatusOr<std::vector<uint32_t>> RecoverDeadHosts();

  // This host's statistics, exact (not the published copy).
  HostStats LocalStats();

  // Returns cached blocks, pushes queued frees, reclaims this host's
  // private blocks and leaves the arena unowned (durable blocks stay). The
  // destructor calls it. Further calls fail with kFailedPrecondition.
  absl::Status Close();

  uint32_t slot() const { return slot_; }
  runtime::Pool& pool() const { return pool_; }
  runtime::Membership& membership() const { return membership_; }

 private:
  Allocator(runtime::Pool& pool, runtime::Membership& membership, const AllocatorOptions& options);
  absl::Status Init();
  bool Usable() const { return !closed_.load(std::memory_order_relaxed) && !membership_.fenced(); }
  absl::Status CheckUsable() { return Usable() ? absl::OkStatus() : Unusable(); }
  absl::Status Unusable();
  absl::Status FreeLocked(PoolOffset offset, bool allow_named);
  // The body of CommitDurable / FreeDurable.
  absl::Status ChangeWithWord(RedoKind kind, PoolOffset block, PoolOffset word, uint64_t value);
  // Allocate with options.device set: whole segments on that device.
  absl::StatusOr<PoolOffset> AllocateOnDevice(uint64_t size, uint64_t alignment,
                                              const AllocOptions& options);
  // Sets the state byte of cached-path block `off` of class `cls` (lock-free).
  void SetState(PoolOffset off, uint32_t cls, allocator_internal::BlockState st);
  // The state byte of `offset` when it starts a block of one of this
  // arena's slabs that the thread caches serve (its class in `cls`), else
  // nullptr. Lock-free.
  std::atomic<uint8_t>* CachedState(PoolOffset offset, uint32_t* cls) const;
  // A block from / into bin `cls` of a thread cache. REQUIRES: the bin is
  // not empty / not full; `off` starts a block of class `cls` of this arena
  // and `state` is its state byte.
  PoolOffset TakeCached(allocator_internal::ThreadCache& tc, uint32_t cls);
  void PutCached(allocator_internal::ThreadCache& tc, uint32_t cls, std::atomic<uint8_t>& state,
                 PoolOffset off);
  // The cached paths' rare steps and everything past them, out of line so
  // that the cached paths stay small: refill an empty bin, return half of
  // a full one, and Allocate / Free of what no thread cache serves
  // (`state`: the block's state byte when it is a cached-path block).
  [[gnu::noinline]] absl::StatusOr<PoolOffset> RefillAndTake(allocator_internal::ThreadCache& tc,
                                                             uint32_t cls);
  [[gnu::noinline]] void ReturnHalf(allocator_internal::ThreadCache& tc, uint32_t cls);
  [[gnu::noinline]] absl::StatusOr<PoolOffset> AllocateSlow(uint64_t size,
                                                            const AllocOptions& options);
  [[gnu::noinline]] absl::Status FreeSlow(PoolOffset offset, const std::atomic<uint8_t>* state,
                                          uint32_t cls);
  // The calling thread's cache (made on first use).
  allocator_internal::ThreadCache& MyCache();
  // Takes mu_ for a batch move between a thread cache and the arena:
  // spins up to 4 us before it sleeps.
  void LockForBatch();
  // Fills the empty cache bin of class `cls` from the arena. REQUIRES: mu_.
  absl::Status RefillBin(allocator_internal::ThreadCache& tc, uint32_t cls);
  // Takes back what other hosts freed (on every refill). REQUIRES: mu_.
  void DrainOnRefill();
  // Returns the oldest `n` blocks of bin `cls` to the arena. REQUIRES: mu_.
  void ReturnBlocks(allocator_internal::ThreadCache& tc, uint32_t cls, uint32_t n);
  // Blocks per class that thread caches hold now (relaxed reads).
  std::array<uint64_t, kNumClasses> ThreadCached();
  absl::Status RemoteFree(PoolOffset offset, bool allow_named);
  // Frees `entries` in `owner`'s arena, which no host owns, under the pool lock.
  absl::Status FreeInUnownedArena(uint32_t owner, const std::vector<RingEntryLayout>& entries);
  // Pushes what fits of the queued frees for `owner` into its ring.
  void PushPending(uint32_t owner);
  absl::Status DrainRings();
  void TickLoop();

  runtime::Pool& pool_;
  runtime::Membership& membership_;
  const AllocatorOptions options_;
  const uint32_t slot_;
  const uint64_t epoch_;
  // Runs a function under the pool lock (made once: it is on every path).
  const std::function<absl::Status(const std::function<absl::Status()>&)> pool_lock_;
  AllocatorHeaderLayout header_{};

  std::unique_ptr<allocator_internal::HeapMeta> meta_;  // set by Init, then constant
  const uint64_t id_;  // unique in the process: names this allocator's thread caches
  std::shared_ptr<allocator_internal::ThreadCacheRegistry> registry_;
  std::mutex mu_;  // after registry_->mu when both are taken
  std::unique_ptr<allocator_internal::ArenaState> arena_;  // guarded by mu_
  std::vector<uint64_t> my_heads_;                         // guarded by mu_: head of ring (me, o)
  std::vector<uint64_t> my_tails_;                         // guarded by mu_: tail of ring (p, me)
  uint64_t refills_ = 0;                                   // guarded by mu_
  // Frees queued for one owner before they go into its ring: block offsets
  // (| kRingEntryDurable), all meant for the owner's incarnation `epoch`.
  struct PendingFrees {
    uint64_t epoch = 0;
    allocator_internal::FreeQueue offsets;

    // The owner's incarnation is now `e`: private frees queued for the one
    // before are moot (its private blocks were reclaimed with it) and are
    // dropped; durable ones stay, for whoever holds the block now.
    void Retag(uint64_t e);
    // Queues `tagged` (offset | durable bit) for the owner's incarnation
    // `owner_epoch`, retagging first when that changed. False: no memory.
    bool Add(uint64_t owner_epoch, uint64_t tagged);
  };
  std::vector<PendingFrees> pending_;  // guarded by mu_: frees queued for owner o
  std::atomic<bool> closed_{false};    // written under mu_
  // Segment entries last read whole and verified, for remote frees.
  struct SeenEntry {
    SegmentEntryLayout entry;
    bool valid = false;
  };
  std::vector<SeenEntry> seen_;  // guarded by mu_

  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool tick_stop_ = false;  // guarded by tick_mu_
  std::thread tick_thread_;
  absl::Time next_recovery_ = absl::InfinitePast();
};

// --- Reading an allocator without being a host of the pool (tools). ---

// True when the pool holds allocator metadata.
bool HasAllocator(const runtime::Pool& pool);

// Statistics as published by every arena.
absl::StatusOr<AllocatorStats> ReadStats(const runtime::Pool& pool);

// Checks every invariant of the allocator's metadata (docs/allocator.md):
// segment table, segment headers and bitmaps, arena counters, huge runs,
// named blocks, rings. Returns OK or kDataLoss summarising the problems,
// each also appended to `problems`. Exact on a quiescent pool; an arena
// that changes under it is re-read, and reported as busy if it never holds
// still.
absl::Status Audit(const runtime::Pool& pool, std::vector<std::string>* problems = nullptr);

}  // namespace cxlrt::allocator
