// Segments: claiming a free segment for an arena (under the pool lock) and
// giving empty ones back.
#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/internal/arena_segment.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

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

absl::StatusOr<ArenaState::Segment*> ArenaState::Claim(SegmentState state, uint32_t cls,
                                                       const LockRunner& lock) {
  Segment* claimed = nullptr;
  CXLRT_RETURN_IF_ERROR(lock([&]() -> absl::Status {
    const AllocatorHeaderLayout& h = meta_.header();
    for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
      CXLRT_ASSIGN_OR_RETURN(SegmentEntryLayout e, meta_.ReadEntry(i));
      if (e.state != static_cast<uint32_t>(SegmentState::kFree)) continue;
      // Memory first (a pool made with reserve=lazy has none here yet): a
      // full filesystem is an error before anything is claimed.
      CXLRT_RETURN_IF_ERROR(meta_.pool().backend().Reserve(meta_.SegOffset(i), kSegmentSize));
      SegmentEntryLayout n = {};
      n.generation = e.generation + 1;
      n.state = static_cast<uint32_t>(state);
      n.owner = slot_;
      n.size_class = cls;
      meta_.WriteEntry(i, n);
      CXLRT_FAULT_POINT("alloc.claim.after_entry");
      // The owner initialises the header: bitmaps zero, then the static line.
      static const uint8_t kZeros[16384] = {};
      const PoolOffset base = meta_.SegOffset(i);
      meta_.c().CopyToPool(base, kZeros, sizeof(kZeros));
      auto s = std::make_unique<Segment>();
      s->index = i;
      s->state = state;
      s->cls = cls;
      s->blocks = state == SegmentState::kSlab ? allocator::SlabBlocks(cls) : kPagesPerSegment;
      s->block_size = state == SegmentState::kSlab ? kClassSizes[cls] : kPageSize;
      const uint32_t words = (s->blocks + 63) / 64;
      s->alloc.assign(words, 0);
      s->durable.assign(words, 0);
      s->handed.assign(words, 0);
      if (state == SegmentState::kPages) {
        s->alloc[0] = 1;  // page 0 holds the header
        s->alloc_count = 1;
        WriteBits(*s, false, 0);
      }
      SegmentHeaderLayout hdr = {};
      hdr.magic = kSegmentMagic;
      hdr.generation = n.generation;
      hdr.state = n.state;
      hdr.size_class = cls;
      hdr.block_size = static_cast<uint32_t>(s->block_size);
      hdr.block_count = s->blocks;
      hdr.owner = slot_;
      hdr.checksum = SegmentHeaderChecksum(hdr);
      meta_.c().PublishObject(base, hdr);
      if (state == SegmentState::kSlab) class_segs_[cls].push_back(i);
      if (state == SegmentState::kPages) page_segs_.push_back(i);
      claimed = s.get();
      segs_[i] = std::move(s);
      ShowSlab(*claimed);
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat("the heap of ", meta_.pool().name(),
                                                     " is full: no free 2 MiB segment left of ",
                                                     h.segment_count - h.meta_segments));
  }));
  return claimed;
}

void ArenaState::ReleaseLocked(Segment& s) {
  const uint32_t n = s.state == SegmentState::kHugeHead && s.valid ? s.run_length : 1;
  // Head first, tails after: a crash in between leaves orphan tails, which
  // recovery frees (never a head whose tails are free).
  for (uint32_t k = 0; k < n; ++k) {
    auto e = meta_.ReadEntry(s.index + k);
    SegmentEntryLayout f = {};
    f.generation = (e.ok() ? e->generation : 0) + 1;
    meta_.WriteEntry(s.index + k, f);
  }
  if (s.state == SegmentState::kSlab || s.state == SegmentState::kPages) {
    auto& v = s.state == SegmentState::kSlab ? class_segs_[s.cls] : page_segs_;
    v.erase(std::remove(v.begin(), v.end(), s.index), v.end());
  }
  HideSlab(s.index);
  segs_[s.index].reset();
}

absl::Status ArenaState::ReleaseIfEmpty(Segment& s, const LockRunner& lock) {
  const bool empty = s.state == SegmentState::kPages ? s.alloc_count <= 1 : s.alloc_count == 0;
  if (!empty) return absl::OkStatus();
  if (use_cache_) {
    // Keep up to two empty segments of a class (and of pages) as spares:
    // claims and releases take the pool lock, and a host whose blocks come
    // back from other hosts would otherwise claim and release in a loop.
    int empty_of_kind = 0;
    for (uint32_t i : s.state == SegmentState::kSlab ? class_segs_[s.cls] : page_segs_) {
      const Segment& o = *segs_[i];
      empty_of_kind += o.state == SegmentState::kPages ? o.alloc_count <= 1 : o.alloc_count == 0;
    }
    if (empty_of_kind <= 2) return absl::OkStatus();
  }
  return lock([&] {
    ReleaseLocked(s);
    return absl::OkStatus();
  });
}

}  // namespace cxlrt::allocator_internal
