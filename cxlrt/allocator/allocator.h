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
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator_layout.h"
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

  uint32_t slot() const;
  runtime::Pool& pool() const;
  runtime::Membership& membership() const;

 private:
  class Impl;  // allocator.cc
  explicit Allocator(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
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
