// Internal to cxlrt/allocator/: the allocator's tables in a pool (HeapMeta) and
// one arena's state mirrored in process memory (ArenaState). The owner of
// an arena keeps an ArenaState for it; recovery and frees into an unowned
// arena build one under the pool lock, so one piece of code writes arena
// metadata in every case.
//
// Mirrors: the pool holds each segment's alloc and durable bitmaps (the
// truth that survives a crash); the ArenaState holds copies, plus which
// blocks are handed out to callers (process-local: a block can be
// allocated in the pool but free in the owner's cache). Every change is
// written to the pool before the call returns.
//
// Files by role, as mimalloc splits alloc, free, page, segment and stats:
// heap_layout.cc (the tables' layout, HeapMeta), arena.cc (loading an
// arena, slab views, publishing bitmaps and counters), arena_segments.cc
// (claims and releases of segments), arena_alloc.cc (small, page and huge
// allocation), arena_free.cc (frees and the rings), arena_durable.cc
// (durability, the redo record, reclaiming private blocks) and
// arena_stats.cc (audit and statistics); arena_segment.h holds what they
// share.
//
// Thread-safety: HeapMeta is thread-safe; an ArenaState is not (the
// Allocator's mutex or the pool lock guards it).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/allocator/allocator_layout.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::allocator_internal {

using allocator::AllocatorHeaderLayout;
using allocator::ArenaLayout;
using allocator::RingEntryLayout;
using allocator::SegmentEntryLayout;
using allocator::SegmentHeaderLayout;
using allocator::SegmentState;
using runtime::PoolOffset;

// Block index of `rel` bytes into a slab's blocks, by multiplication:
// idx = rel * ceil(2^42 / size) >> 42 is exact for rel < 2^21 (a segment)
// and sizes of at most 2^18, since rel / size never has a fractional part
// above 1 - 2^-18.
inline constexpr std::array<uint64_t, allocator::kNumClasses> kInverse = [] {
  std::array<uint64_t, allocator::kNumClasses> v{};
  for (uint32_t c = 0; c < allocator::kNumClasses; ++c) {
    v[c] = ((uint64_t{1} << 42) + allocator::kClassSizes[c] - 1) / allocator::kClassSizes[c];
  }
  return v;
}();
inline uint64_t BlockIndex(uint64_t rel, uint32_t cls) { return (rel * kInverse[cls]) >> 42; }

uint32_t EntryChecksum(const SegmentEntryLayout& e);
uint32_t SegmentHeaderChecksum(const SegmentHeaderLayout& h);
uint32_t AllocatorHeaderChecksum(const AllocatorHeaderLayout& h);

// Reads and validates the allocator header of `pool`: kNotFound when the
// pool has no allocator, kDataLoss naming what is wrong.
absl::StatusOr<AllocatorHeaderLayout> ReadAllocatorHeader(const runtime::Pool& pool);

// The layout an allocator of `pool` gets (for Init). kResourceExhausted
// when the tables would leave no segment for data.
absl::StatusOr<AllocatorHeaderLayout> PlanLayout(const runtime::Pool& pool);

class HeapMeta {
 public:
  HeapMeta(const runtime::Pool& pool, const AllocatorHeaderLayout& h)
      : pool_(pool),
        h_(h),
        data_begin_(SegOffset(h.meta_segments)),
        data_end_(SegOffset(h.segment_count)) {}

  const AllocatorHeaderLayout& header() const { return h_; }
  runtime::Coherence& c() const { return pool_.coherence(); }
  const runtime::Pool& pool() const { return pool_; }
  uint32_t slots() const { return h_.host_slots; }

  PoolOffset SegOffset(uint32_t i) const {
    return h_.first_segment + uint64_t{i} * h_.segment_size;
  }
  PoolOffset EntryOffset(uint32_t i) const { return h_.segment_table + uint64_t{i} * 64; }
  PoolOffset ArenaOffset(uint32_t s) const {
    return h_.arenas + uint64_t{s} * allocator::kArenaSize;
  }
  PoolOffset HeadOffset(uint32_t p, uint32_t o) const {
    return h_.ring_heads + uint64_t{p} * h_.row_stride + uint64_t{o} * 8;
  }
  PoolOffset TailOffset(uint32_t o, uint32_t p) const {
    return h_.ring_tails + uint64_t{o} * h_.row_stride + uint64_t{p} * 8;
  }
  uint64_t RingRowBytes() const;
  PoolOffset RingOffset(uint32_t p, uint32_t o) const {
    return h_.ring_entries + uint64_t{p} * RingRowBytes() +
           uint64_t{o} * h_.ring_capacity * sizeof(allocator::RingEntryLayout);
  }
  // True when `word` is an 8-byte aligned word of the heap (a word that
  // CommitDurable / FreeDurable may store to).
  bool IsHeapWord(PoolOffset word) const {
    return word % 8 == 0 && word >= pool_.header().heap_offset && word <= pool_.size() - 8;
  }
  // The data segment holding `off`, or nullopt outside [first data
  // segment, end of heap).
  std::optional<uint32_t> SegmentOf(PoolOffset off) const {
    if (off < data_begin_ || off >= data_end_) return std::nullopt;
    static_assert(allocator::kSegmentSize == uint64_t{1} << 21);
    return static_cast<uint32_t>((off - h_.first_segment) >> 21);
  }

  // Entry i, checksum-verified (torn reads retried). kDataLoss when corrupt.
  absl::StatusOr<SegmentEntryLayout> ReadEntry(uint32_t i) const;
  // Publishes entry i with its checksum. REQUIRES: the pool lock is held.
  void WriteEntry(uint32_t i, const SegmentEntryLayout& e) const;
  // The static header of segment i when it is valid for `entry` (magic,
  // checksum, generation, state); nullopt otherwise (a claim that did not
  // finish).
  std::optional<SegmentHeaderLayout> ReadSegmentHeader(uint32_t i,
                                                       const SegmentEntryLayout& entry) const;

 private:
  const runtime::Pool& pool_;
  const AllocatorHeaderLayout h_;
  const PoolOffset data_begin_, data_end_;  // the data segments
};

// Runs `fn` holding the pool lock (or directly, when the caller already
// holds it).
using LockRunner = std::function<absl::Status(const std::function<absl::Status()>&)>;

// Where a block of a slab is, as the thread caches (allocator.cc) see it.
enum class BlockState : uint8_t {
  kArena = 0,        // free in the arena, or held by a caller that got it on a slow path
  kUser = 1,         // private, handed to a caller by a cached path: its free may go fast
  kThreadCache = 2,  // free in some thread's cache (a free of it is a double free)
};

// The part of an arena that thread caches read without the allocator's
// lock: per segment, the class + 1 while the arena holds it as a valid slab
// (0 otherwise), and one BlockState byte per block. The arena writes them
// holding the allocator's lock; a thread moves a block it holds between
// kUser and kThreadCache without it. Process-local.
struct SlabView {
  std::atomic<uint32_t> cls1{0};
  std::atomic<std::atomic<uint8_t>*> state{nullptr};  // SlabBlocks(0) bytes, kept once made
};

class ArenaState {
 public:
  // `use_cache`: keep freed small blocks allocated in a local cache (the
  // owner's fast path); recovery and offline frees write straight through.
  ArenaState(const HeapMeta& meta, uint32_t slot, bool use_cache);
  ~ArenaState();

  // Reads the arena's segments, bitmaps and counters from the pool. Blocks
  // already allocated count as handed out (whoever holds them).
  absl::Status Load();

  uint64_t owner_epoch() const { return owner_epoch_; }
  void set_owner_epoch(uint64_t e) { owner_epoch_ = e; }
  uint64_t rejected_frees() const { return rejected_frees_; }
  void CountRejectedFree() { ++rejected_frees_; }
  // True once a batch found the arena taken from this process in the pool:
  // its owner epoch there is no longer the one this process loaded or last
  // wrote, because a survivor fenced this host (a stall past its lease) and
  // recovered the arena. The arena then writes nothing more to the pool;
  // the allocator turns it into kAborted.
  bool lost() const { return lost_; }

  // Recovery: frees every private block, releases segments left empty,
  // never initialised or orphaned. REQUIRES: the pool lock is held and no
  // live host owns the arena (or the caller is its new owner).
  absl::Status ReclaimPrivate();
  // Applies the frees queued in every ring to this arena and consumes them
  // (`tails`: this arena's consumer tails, one per producer, updated).
  // Returns how many were applied; refused ones are counted and logged.
  // `active_only`: only producers that sent frees lately (a refill's cheap
  // look); otherwise every producer.
  uint64_t DrainRings(std::vector<uint64_t>* tails, const LockRunner& lock,
                      bool active_only = false);
  // Returns cached blocks to the slabs.
  void FlushCache();

  absl::StatusOr<PoolOffset> Allocate(uint64_t size, uint64_t alignment, bool durable,
                                      const LockRunner& lock);
  // A run of whole segments inside the pool range [begin, end) (one device).
  absl::StatusOr<PoolOffset> AllocateIn(uint64_t size, uint64_t alignment, bool durable,
                                        const LockRunner& lock, PoolOffset begin, PoolOffset end);
  // The common cases, with nothing written to the pool: a private block of
  // class `cls` from the cache (0 when the cache is empty), and a free of
  // a private small block of this arena into a cache with room (false when
  // the full path must run; nothing changed then).
  PoolOffset TryAllocCached(uint32_t cls);
  bool TryFreeCached(PoolOffset off);
  // Frees a block of this arena. `allow_named` false: a durable block that
  // is published by name is refused. kInvalidArgument / kFailedPrecondition
  // as Allocator::Free.
  absl::Status Free(PoolOffset off, bool allow_named, const LockRunner& lock);
  // Marks the private block `off`, handed to a caller, durable.
  // kInvalidArgument / kFailedPrecondition when it is not such a block.
  absl::Status MakeDurable(PoolOffset off, const LockRunner& lock);
  // Publishes the arena's intent record (kind kNone clears it).
  void WriteRedo(allocator::RedoKind kind, PoolOffset block = 0, PoolOffset word = 0,
                 uint64_t value = 0);
  // Finishes what a crashed owner's intent record names (idempotent: the
  // block change is skipped when done, the word is stored again), then
  // clears it. Called by recovery before private blocks are reclaimed.
  // REQUIRES: the pool lock is held and no live host owns the arena (or the
  // caller is its new owner).
  void FinishRedo();
  absl::StatusOr<uint64_t> BlockSize(PoolOffset off) const;
  bool Owns(PoolOffset off) const;
  // True when `off` starts a durable block of this arena; `usable` gets its size.
  bool IsDurableBlockStart(PoolOffset off, uint64_t* usable) const;

  // Appends to `problems` every invariant of this arena that does not hold
  // (docs/allocator.md): what Load found wrong in the bitmaps and segments,
  // and published counters that disagree with the bitmaps.
  // REQUIRES: Load() succeeded.
  void Audit(std::vector<std::string>* problems) const;
  // The counters as published in the pool when Load() read them.
  const ArenaLayout& published() const { return published_; }

  // Called when a small allocation finds its cache empty, before the slabs
  // are scanned: the owner drains its free rings there.
  void set_refill_hook(std::function<void()> hook) { refill_hook_ = std::move(hook); }

  // The lock-free view of segment `seg` (see SlabView). REQUIRES: use_cache.
  const SlabView& View(uint32_t seg) const { return views_[seg]; }
  // The state byte of block `off` of a shown slab of class `cls`; lock-free.
  // REQUIRES: use_cache; `off` starts a block of such a slab.
  std::atomic<uint8_t>& StateByte(PoolOffset off, uint32_t cls) const {
    const uint32_t seg = *meta_.SegmentOf(off);
    const uint64_t b = BlockIndex(off - meta_.SegOffset(seg) - allocator::kSegmentHeaderSize, cls);
    return views_[seg].state.load(std::memory_order_relaxed)[b];
  }
  // Blocks per class that thread caches hold: handed out as far as the
  // arena knows, reported as cached by Stats and PublishCounters.
  void set_thread_cached(const std::array<uint64_t, allocator::kNumClasses>& n) {
    thread_cached_ = n;
  }

  // Publishes the counters (the seqlock bumps around them).
  void PublishCounters();
  allocator::HostStats Stats() const;

 private:
  struct Segment;

  Segment* Mine(PoolOffset off, uint32_t* index) const;
  absl::StatusOr<PoolOffset> AllocSmall(uint32_t cls, bool durable, const LockRunner& lock);
  absl::StatusOr<PoolOffset> AllocPages(uint32_t pages, bool durable, const LockRunner& lock);
  absl::StatusOr<PoolOffset> AllocHuge(uint64_t size, uint64_t alignment, bool durable,
                                       const LockRunner& lock, PoolOffset begin = 0,
                                       PoolOffset end = ~PoolOffset{0});
  // Marks up to `want` free blocks of segment `s` allocated and caches them.
  uint32_t Refill(Segment& s, uint32_t want);
  // Claims a free segment as a slab of `cls` (or a page segment).
  absl::StatusOr<Segment*> Claim(SegmentState state, uint32_t cls, const LockRunner& lock);
  // Gives segment `s` back to the free pool. REQUIRES: the pool lock.
  void ReleaseLocked(Segment& s);
  absl::Status ReleaseIfEmpty(Segment& s, const LockRunner& lock);
  void WriteBits(Segment& s, bool durable_map, uint32_t word);
  // Clears the alloc bit of cached block `off` in the pool (it leaves the
  // cache for the slab). Returns its segment.
  Segment* ReturnToSlab(PoolOffset off);
  // Counters from the bitmaps of the segments held.
  void RecountFromBitmaps();
  // Blocks of class `c` held by callers: handed out, less those in threads' caches.
  uint64_t HandedToCallers(uint32_t c) const {
    return counts_[c].handed_out - std::min(thread_cached_[c], counts_[c].handed_out);
  }
  // Opens slab `s` to the thread caches (every block kArena) or closes it.
  void ShowSlab(const Segment& s);
  void HideSlab(uint32_t index) {
    if (views_) views_[index].cls1.store(0, std::memory_order_release);
  }
  BlockState StateOf(const Segment& s, uint32_t block) const;
  void SetState(const Segment& s, uint32_t block, BlockState st);
  void WriteRun(Segment& s, uint32_t page);
  void BeginBatch();
  void EndBatch();
  // Before a store to line 0 (the seqlock `version` shares it with
  // `owner_epoch`, which a recovering survivor rewrites): re-reads the line
  // from the pool, so that the store never writes back a stale copy of it,
  // and sets lost_ when the owner epoch there changed under this process.
  // False when lost.
  bool StillMine();
  absl::StatusOr<bool> IsNamed(PoolOffset off) const;

  const HeapMeta& meta_;
  const uint32_t slot_;
  const bool use_cache_;
  uint64_t version_ = 0;
  uint64_t owner_epoch_ = 0;
  uint64_t rejected_frees_ = 0;
  uint64_t pool_owner_epoch_ = 0;  // owner_epoch as last loaded or written to the pool
  bool lost_ = false;
  int batch_depth_ = 0;
  bool publish_counters_ = false;               // the current batch publishes the counters
  std::vector<std::unique_ptr<Segment>> segs_;  // by segment index; null: not this arena's
  std::array<std::vector<uint32_t>, allocator::kNumClasses> class_segs_;
  std::vector<uint32_t> page_segs_;  // the page segments, as class_segs_ the slabs
  std::array<std::vector<PoolOffset>, allocator::kNumClasses> cache_;
  std::array<allocator::ClassStats, allocator::kNumClasses> counts_{};
  std::array<uint64_t, allocator::kNumClasses> thread_cached_{};
  std::unique_ptr<SlabView[]> views_;                                // by segment index
  std::vector<std::unique_ptr<std::atomic<uint8_t>[]>> view_bytes_;  // owns views_[i].state
  uint64_t pages_allocated_ = 0, pages_durable_ = 0, huge_segments_ = 0, huge_bytes_ = 0;
  uint64_t page_bytes_ = 0;
  ArenaLayout published_{};
  std::function<void()> refill_hook_;
  std::vector<uint8_t> active_;  // per producer: sweeps left before it is skipped
  std::vector<std::string> load_problems_;
};

}  // namespace cxlrt::allocator_internal
