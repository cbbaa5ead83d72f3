// The allocator's tables in a pool: their layout (PlanLayout), the header's
// validation and HeapMeta's reads and writes of segment entries and headers.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/internal/arena_segment.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/bounds.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/torn_read.h"

namespace cxlrt::allocator_internal {

using allocator::kAllocBitmapOffset;
using allocator::kArenaSize;
using allocator::kClassSizes;
using allocator::kDurableBitmapOffset;
using allocator::kNumClasses;
using allocator::kPageSize;
using allocator::kPagesPerSegment;
using allocator::kRunLengthOffset;
using allocator::kSegmentHeaderSize;
using allocator::kSegmentMagic;
using allocator::kSegmentSize;

namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

uint32_t EntryChecksum(const SegmentEntryLayout& e) {
  return runtime::Crc32c(&e, offsetof(SegmentEntryLayout, checksum));
}
uint32_t SegmentHeaderChecksum(const SegmentHeaderLayout& h) {
  return runtime::Crc32c(&h, offsetof(SegmentHeaderLayout, checksum));
}
uint32_t AllocatorHeaderChecksum(const AllocatorHeaderLayout& h) {
  return runtime::Crc32c(&h, offsetof(AllocatorHeaderLayout, checksum));
}

absl::StatusOr<AllocatorHeaderLayout> PlanLayout(const runtime::Pool& pool) {
  const auto& ph = pool.header();
  AllocatorHeaderLayout h = {};
  h.magic = allocator::kAllocatorMagic;
  h.version = allocator::kAllocatorVersion;
  h.host_slots = ph.host_slot_count;
  h.segment_size = kSegmentSize;
  h.first_segment = ph.heap_offset;
  h.segment_count = static_cast<uint32_t>(ph.heap_size / kSegmentSize);
  h.row_stride = static_cast<uint32_t>(RoundUp(uint64_t{h.host_slots} * 8, 128));
  // The largest ring (up to 1024 frees in flight per host pair) whose
  // tables take at most a sixteenth of the heap; at least 8 entries within
  // a quarter of it.
  for (uint32_t cap = 1024; cap >= 8; cap /= 2) {
    h.ring_capacity = cap;
    const uint64_t ring_row = RoundUp(uint64_t{h.host_slots} * cap * sizeof(RingEntryLayout), 128);
    uint64_t at = h.first_segment + 4096;
    h.segment_table = at;
    at = RoundUp(at + uint64_t{h.segment_count} * 64, 4096);
    h.arenas = at;
    at = RoundUp(at + uint64_t{h.host_slots} * kArenaSize, 4096);
    h.ring_heads = at;
    at = RoundUp(at + uint64_t{h.host_slots} * h.row_stride, 4096);
    h.ring_tails = at;
    at = RoundUp(at + uint64_t{h.host_slots} * h.row_stride, 4096);
    h.ring_entries = at;
    at += uint64_t{h.host_slots} * ring_row;
    h.meta_segments =
        static_cast<uint32_t>(RoundUp(at - h.first_segment, kSegmentSize) / kSegmentSize);
    const uint32_t share = cap == 8 ? 4 : 16;
    if (h.meta_segments < h.segment_count &&
        h.meta_segments * share <= h.segment_count + share - 1) {
      break;
    }
    if (cap == 8) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the heap of ", pool.name(), " (", h.segment_count,
                       " segments of 2 MiB) is too small for "
                       "an allocator with ",
                       h.host_slots, " host slots: its tables need ", h.meta_segments,
                       " segments; create the pool larger or with fewer hosts="));
    }
  }
  h.checksum = AllocatorHeaderChecksum(h);
  return h;
}

absl::StatusOr<AllocatorHeaderLayout> ReadAllocatorHeader(const runtime::Pool& pool) {
  CXLRT_ASSIGN_OR_RETURN(runtime::RegionInfo region,
                         pool.FindRegion(allocator::kAllocatorRegionName));
  const auto& ph = pool.header();
  if (region.offset != ph.heap_offset) {
    return Corrupt(pool, absl::StrCat("its region starts at ", region.offset,
                                      ", not at the heap's start ", ph.heap_offset));
  }
  AllocatorHeaderLayout h;
  pool.coherence().Fetch(&h, region.offset, sizeof(h));
  if (h.magic != allocator::kAllocatorMagic) {
    return Corrupt(pool, absl::StrCat("header magic is 0x", absl::Hex(h.magic)));
  }
  if (h.version != allocator::kAllocatorVersion) {
    return Corrupt(pool, absl::StrCat("header version is ", h.version, " (this build reads ",
                                      allocator::kAllocatorVersion, ")"));
  }
  if (AllocatorHeaderChecksum(h) != h.checksum) {
    return Corrupt(pool,
                   absl::StrCat("header checksum is 0x", absl::Hex(h.checksum),
                                " but its bytes sum to 0x", absl::Hex(AllocatorHeaderChecksum(h))));
  }
  const bool cap_ok = h.ring_capacity >= 8 && h.ring_capacity <= 4096 &&
                      (h.ring_capacity & (h.ring_capacity - 1)) == 0;
  bool fits = h.host_slots == ph.host_slot_count && h.segment_size == kSegmentSize &&
              h.first_segment == ph.heap_offset && h.segment_count == ph.heap_size / kSegmentSize &&
              h.meta_segments >= 1 && h.meta_segments < h.segment_count && cap_ok &&
              h.row_stride >= uint64_t{h.host_slots} * 8 && h.row_stride % 128 == 0 &&
              region.size == uint64_t{h.meta_segments} * kSegmentSize;
  // The tables, in order, each on a line boundary, after the one before
  // and all inside the metadata segments; every sum and product checked for
  // overflow (a header with a valid checksum and segment_table = 2^64 - 64 *
  // count passed the plain sums and aborted every opener: issue 13, defect
  // 9; a misaligned ring_heads, found by pool_bytes_fuzz, made every flag
  // load of the rings misaligned).
  const uint64_t meta_end = h.first_segment + uint64_t{h.meta_segments} * kSegmentSize;
  const uint64_t ring_row =
      RoundUp(uint64_t{h.host_slots} * h.ring_capacity * sizeof(RingEntryLayout), 128);
  const struct {
    uint64_t start, count, each;
  } tables[] = {
      {h.segment_table, h.segment_count, 64},     {h.arenas, h.host_slots, kArenaSize},
      {h.ring_heads, h.host_slots, h.row_stride}, {h.ring_tails, h.host_slots, h.row_stride},
      {h.ring_entries, h.host_slots, ring_row},
  };
  uint64_t end = h.first_segment + sizeof(h);
  for (const auto& t : tables) {
    if (!fits) break;
    uint64_t t_end = 0;
    fits = t.start >= end && t.start % 64 == 0 &&
           runtime::TableEnd(t.start, t.count, t.each, &t_end) && t_end <= meta_end;
    end = t_end;
  }
  if (!fits) {
    return Corrupt(pool, absl::StrCat("its layout does not fit the pool (", h.segment_count,
                                      " segments, ", h.meta_segments, " for metadata, ",
                                      h.host_slots, " hosts, rings of ", h.ring_capacity, ")"));
  }
  return h;
}

// --- HeapMeta ---

uint64_t HeapMeta::RingRowBytes() const {
  return RoundUp(uint64_t{h_.host_slots} * h_.ring_capacity * sizeof(RingEntryLayout), 128);
}

absl::StatusOr<SegmentEntryLayout> HeapMeta::ReadEntry(uint32_t i) const {
  SegmentEntryLayout e;
  static const SegmentEntryLayout kNeverUsed = {};  // a free segment never claimed
  const bool whole = runtime::RetryTornRead([&] {
    c().Fetch(&e, EntryOffset(i), sizeof(e));
    return std::memcmp(&e, &kNeverUsed, sizeof(e)) == 0 || EntryChecksum(e) == e.checksum;
  });
  if (!whole) {
    return Corrupt(pool_,
                   absl::StrCat("segment table entry ", i, " checksum is 0x", absl::Hex(e.checksum),
                                " but its bytes sum to 0x", absl::Hex(EntryChecksum(e))));
  }
  const bool state_ok = e.state <= static_cast<uint32_t>(SegmentState::kHugeTail);
  if (!state_ok || (e.state != 0 && e.state != 1 && e.owner >= h_.host_slots) ||
      (e.state == static_cast<uint32_t>(SegmentState::kSlab) && e.size_class >= kNumClasses)) {
    return Corrupt(pool_, absl::StrCat("segment ", i, " has state ", e.state, ", owner ", e.owner,
                                       ", class ", e.size_class));
  }
  return e;
}

void HeapMeta::WriteEntry(uint32_t i, const SegmentEntryLayout& entry) const {
  SegmentEntryLayout e = entry;
  e.checksum = EntryChecksum(e);
  c().PublishObject(EntryOffset(i), e);
}

std::optional<SegmentHeaderLayout> HeapMeta::ReadSegmentHeader(
    uint32_t i, const SegmentEntryLayout& entry) const {
  SegmentHeaderLayout h;
  c().Fetch(&h, SegOffset(i), sizeof(h));
  if (h.magic != kSegmentMagic || SegmentHeaderChecksum(h) != h.checksum ||
      h.generation != entry.generation || h.state != entry.state || h.owner != entry.owner) {
    return std::nullopt;
  }
  if (h.state == static_cast<uint32_t>(SegmentState::kSlab) &&
      (h.size_class != entry.size_class || h.block_size != kClassSizes[h.size_class] ||
       h.block_count != allocator::SlabBlocks(h.size_class))) {
    return std::nullopt;
  }
  if (h.state == static_cast<uint32_t>(SegmentState::kPages) && h.block_count != kPagesPerSegment) {
    return std::nullopt;
  }
  return h;
}

}  // namespace cxlrt::allocator_internal
