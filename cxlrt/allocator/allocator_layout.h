// The pooled allocator's structures in pool memory. docs/allocator.md is the
// specification; this file must match it.
//
// The allocator lives in the heap of a pool (cxlrt/runtime/pool_layout.h). Its
// metadata is the named region "cxlrt.allocator" at the start of the heap,
// a whole number of 2 MiB segments:
//
//   AllocatorHeaderLayout     written once by the initialiser, checksummed
//   segment table             segment_count x SegmentEntryLayout (64 B)
//   arenas                    host_slots x ArenaLayout (1 KiB)
//   ring heads                host_slots rows of host_slots x u64
//   ring tails                host_slots rows of host_slots x u64
//   ring entries              host_slots x host_slots rings of ring_capacity x RingEntryLayout
//
// The rest of the heap is segments, each free, metadata, a slab of one size
// class, a page segment (runs of 64 KiB pages), or part of a huge run.
//
// Who writes what (no cross-host read-modify-write anywhere):
//   header, meta entries     the initialiser, under the pool lock, once
//   SegmentEntry i           the pool-lock holder (claim, release, recovery)
//   segment i's header and   the owner of segment i (its arena's host), or
//     bitmaps                  the pool-lock holder when the arena is unowned
//   Arena s                  host slot s's allocator, or the pool-lock holder
//                              when the arena is unowned (owner_epoch 0) or
//                              its host is fenced (recovery)
//   ring head[p][o],         host p (producer of frees for owner o)
//     entries of ring (p,o)
//   ring tail[o][p]          host o (consumer), or the pool-lock holder when
//                              arena o is unowned or being recovered
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cxlrt::allocator {

inline constexpr uint64_t kAllocatorMagic = 0x314C415452584C43ull;  // "CXLRTAL1"
inline constexpr uint32_t kAllocatorVersion = 1;
inline constexpr char kAllocatorRegionName[] = "cxlrt.allocator";

inline constexpr uint64_t kSegmentSize = 2ull << 20;
// A slab or page segment starts with this much header (static line and
// bitmaps); blocks and pages start after it, so they are 64 KiB aligned.
inline constexpr uint64_t kSegmentHeaderSize = 64ull << 10;
inline constexpr uint64_t kPageSize = 64ull << 10;
inline constexpr uint32_t kPagesPerSegment = kSegmentSize / kPageSize;  // page 0: header
inline constexpr uint32_t kNumClasses = 24;
inline constexpr uint32_t kArenaSize = 1024;

struct AllocatorHeaderLayout {
  uint64_t magic;  // kAllocatorMagic
  uint32_t version;
  uint32_t host_slots;     // = the pool's
  uint64_t segment_size;   // kSegmentSize
  uint64_t first_segment;  // pool offset of segment 0 (= heap_offset)
  uint32_t segment_count;  // segments in the heap
  uint32_t meta_segments;  // segments 0..meta_segments-1 hold this metadata
  uint64_t segment_table;  // pool offsets of the tables below
  uint64_t arenas;
  uint64_t ring_heads;
  uint64_t ring_tails;
  uint64_t ring_entries;
  uint32_t ring_capacity;  // entries per ring, a power of two >= 8
  uint32_t row_stride;     // bytes between rows of heads / tails (>= 128)
  uint8_t reserved[160];
  uint32_t reserved2;
  uint32_t checksum;  // CRC-32C of bytes [0, offsetof(checksum))
};
static_assert(sizeof(AllocatorHeaderLayout) == 256);
static_assert(offsetof(AllocatorHeaderLayout, checksum) == 252);

enum class SegmentState : uint32_t {
  kFree = 0,
  kMeta = 1,      // allocator metadata
  kSlab = 2,      // blocks of one size class
  kPages = 3,     // runs of 64 KiB pages
  kHugeHead = 4,  // first segment of a huge block of run_length segments
  kHugeTail = 5,  // other segments of a huge block; head_index names its head
};

// One segment of the heap. Written only under the pool lock.
struct alignas(64) SegmentEntryLayout {
  uint64_t generation;  // +1 on every change; the segment header repeats it
  uint32_t state;       // SegmentState
  uint32_t owner;       // host slot whose arena holds it (slab, pages, huge)
  uint32_t size_class;  // kSlab: the class index
  uint32_t run_length;  // kHugeHead: segments in the block
  uint32_t head_index;  // kHugeTail: the head segment
  uint32_t durable;     // kHugeHead: 1 when the block outlives its host
  uint64_t block_size;  // kHugeHead: bytes asked for
  uint8_t reserved[20];
  uint32_t checksum;  // CRC-32C of bytes [0, 60)
};
static_assert(sizeof(SegmentEntryLayout) == 64);

// First line of a slab or page segment; written once by its owner after
// the claim. Bitmaps follow at fixed offsets (below).
struct alignas(64) SegmentHeaderLayout {
  uint64_t magic;        // kSegmentMagic
  uint64_t generation;   // = the table entry's at claim
  uint32_t state;        // kSlab or kPages
  uint32_t size_class;   // kSlab
  uint32_t block_size;   // kSlab: bytes per block
  uint32_t block_count;  // kSlab: blocks; kPages: kPagesPerSegment - 1
  uint32_t owner;
  uint8_t reserved[24];
  uint32_t checksum;  // CRC-32C of bytes [0, 60)
};
static_assert(sizeof(SegmentHeaderLayout) == 64);
inline constexpr uint64_t kSegmentMagic = 0x4745534C41545843ull;  // "CXTALSEG"

// Offsets inside a slab or page segment (from its start).
inline constexpr uint64_t kAllocBitmapOffset = 4096;    // bit i: block / page i allocated
inline constexpr uint64_t kDurableBitmapOffset = 8192;  // bit i: durable
inline constexpr uint64_t kRunLengthOffset = 12288;     // kPages: u8[32], pages of the run at i
inline constexpr uint32_t kMaxBitmapWords = 4096 / 8;   // 32768 blocks at most

// One host's arena. Written only by its owner (or the pool-lock holder when
// unowned or fenced). Lines: 0 control, 1-3 allocated blocks per class,
// 4-6 blocks handed out per class, 7-9 durable blocks per class, 10 totals.
struct ArenaLayout {
  // line 0
  uint64_t version;         // even: stable; odd: a batch is being written (seqlock)
  uint64_t owner_epoch;     // membership epoch of the owning host; 0: unowned
  uint64_t rejected_frees;  // remote frees the owner refused (double or bad)
  uint64_t stats_time_ns;   // owner's clock when the counters were published
  // The version the counters below describe: they match the bitmaps when it
  // equals `version` (an owner publishes them on its tick, not per batch).
  uint64_t counters_version;
  uint8_t pad0[24];
  uint64_t allocated[kNumClasses];   // alloc bits set in its slabs, per class
  uint64_t handed_out[kNumClasses];  // of those, given to callers (rest: cached)
  uint64_t durable[kNumClasses];
  // line 10: pages and huge blocks
  uint64_t pages_allocated;  // 64 KiB pages allocated in its page segments
  uint64_t pages_durable;
  uint64_t huge_segments;  // segments in its huge blocks
  uint64_t huge_bytes;     // bytes asked for in its huge blocks
  uint64_t page_bytes;     // bytes asked for in its page runs
  uint8_t pad1[24];
  // line 11: an intent record (ArenaRedoLayout) for the two steps that
  // change a block and a caller's word together (CommitDurable, FreeDurable)
  uint8_t redo[64];
  uint8_t reserved[kArenaSize - 64 - 3 * 8 * kNumClasses - 64 - 64];
};
static_assert(sizeof(ArenaLayout) == kArenaSize);
static_assert(offsetof(ArenaLayout, allocated) == 64);
static_assert(offsetof(ArenaLayout, pages_allocated) == 64 + 3 * 8 * kNumClasses);

// What an arena's owner is about to do to one of its blocks together with a
// store to a word of the caller's (a KV entry's seal): recovery of the arena
// finishes it (docs/allocator.md, "Changing a block and a word together").
enum class RedoKind : uint32_t {
  kNone = 0,
  kMakeDurable = 1,  // set the block's durable bit, then store `value` at `word`
  kFree = 2,         // free the (durable) block, then store `value` at `word`
};

struct ArenaRedoLayout {
  uint32_t kind;  // RedoKind
  uint32_t reserved0;
  uint64_t block;  // pool offset of a block of this arena
  uint64_t word;   // pool offset of an 8-byte word (8-byte aligned)
  uint64_t value;
  // The arena's owner epoch when the record was written (0 in records of
  // builds before it: unknown). Recovery finishes a record only when this
  // is the epoch the arena holds: a fenced host that wrote it after a
  // survivor recovered its arena (a freeze past its lease) is ignored.
  uint64_t owner_epoch;
  uint8_t reserved[20];
  uint32_t checksum;  // CRC-32C of bytes [0, 60): a torn record is no record
};
static_assert(sizeof(ArenaRedoLayout) == 64);
static_assert(offsetof(ArenaLayout, redo) == 704);

// A free sent to a block's owner. A private block's free is applied only
// when `owner_epoch` is the owner's: a free meant for an earlier incarnation
// of the slot (one that died or closed with the entry unread) never touches
// the blocks of the next one, since that incarnation's private blocks were
// reclaimed and may have been handed out again. A durable block outlives
// incarnations, so its free (kRingEntryDurable set in `offset`) applies to
// whichever incarnation holds it.
struct RingEntryLayout {
  uint64_t offset;  // block offset (64 B aligned) | kRingEntryDurable
  uint64_t owner_epoch;
};
inline constexpr uint64_t kRingEntryDurable = 1;
static_assert(sizeof(RingEntryLayout) == 16);

}  // namespace cxlrt::allocator
