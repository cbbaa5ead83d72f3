// Allocation: small blocks from slabs (refills of the cache), runs of pages,
// and huge blocks of whole segments.
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

uint32_t ArenaState::Refill(Segment& s, uint32_t want) {
  const uint32_t words = static_cast<uint32_t>(s.alloc.size());
  uint32_t got = 0;
  for (uint32_t k = 0; k < words && got < want; ++k) {
    const uint32_t w = (s.next_word + k) % words;
    uint64_t free = ~s.alloc[w] & ValidMask(s.blocks, w);
    if (!free) continue;
    while (free && got < want) {
      const uint32_t b = w * 64 + std::countr_zero(free);
      free &= free - 1;
      SetBit(s.alloc, b);
      cache_[s.cls].push_back(meta_.SegOffset(s.index) + kSegmentHeaderSize +
                              uint64_t{b} * s.block_size);
      ++got;
    }
    WriteBits(s, false, w);
    s.next_word = w;
  }
  s.alloc_count += got;
  counts_[s.cls].allocated += got;
  return got;
}

absl::StatusOr<PoolOffset> ArenaState::AllocSmall(uint32_t cls, bool durable,
                                                  const LockRunner& lock) {
  if (cache_[cls].empty() && refill_hook_) refill_hook_();  // take back remote frees first
  if (cache_[cls].empty()) {
    const uint32_t want = use_cache_ ? BatchFor(cls) : 1;
    BeginBatch();
    uint32_t got = 0;
    for (uint32_t i : class_segs_[cls]) {
      const Segment& seg = *segs_[i];
      if (seg.alloc_count >= seg.blocks) continue;  // full: nothing to scan for
      got += Refill(*segs_[i], want - got);
      if (got == want) break;
    }
    if (got == 0) {
      auto s = Claim(SegmentState::kSlab, cls, lock);
      if (!s.ok()) {
        EndBatch();
        return s.status();
      }
      got = Refill(**s, want);
    }
    EndBatch();
  }
  const PoolOffset off = cache_[cls].back();
  cache_[cls].pop_back();
  uint32_t i = 0;
  Segment& s = *Mine(off, &i);
  const uint32_t b =
      static_cast<uint32_t>(BlockIndex(off - meta_.SegOffset(i) - kSegmentHeaderSize, s.cls));
  SetBit(s.handed, b);
  ++counts_[cls].handed_out;
  if (durable) {
    BeginBatch();
    SetBit(s.durable, b);
    WriteBits(s, true, b / 64);
    ++counts_[cls].durable;
    EndBatch();
  } else {
    SetState(s, b, BlockState::kUser);
  }
  CXLRT_FAULT_POINT("alloc.allocate.done");
  return off;
}

PoolOffset ArenaState::TryAllocCached(uint32_t cls) {
  auto& cache = cache_[cls];
  if (cache.empty()) return 0;
  const PoolOffset off = cache.back();
  cache.pop_back();
  const uint32_t i = *meta_.SegmentOf(off);
  Segment& s = *segs_[i];
  const auto b =
      static_cast<uint32_t>(BlockIndex(off - meta_.SegOffset(i) - kSegmentHeaderSize, cls));
  SetBit(s.handed, b);
  SetState(s, b, BlockState::kUser);
  ++counts_[cls].handed_out;
  CXLRT_FAULT_POINT("alloc.allocate.done");
  return off;
}

absl::StatusOr<PoolOffset> ArenaState::AllocPages(uint32_t pages, bool durable,
                                                  const LockRunner& lock) {
  const uint64_t want_mask = pages >= 64 ? ~uint64_t{0} : (uint64_t{1} << pages) - 1;
  auto find = [&](Segment& s) -> int {
    for (uint32_t p = 1; p + pages <= kPagesPerSegment; ++p) {
      if ((s.alloc[0] & (want_mask << p)) == 0) return static_cast<int>(p);
    }
    return -1;
  };
  Segment* seg = nullptr;
  int page = -1;
  auto look = [&] {
    for (uint32_t i : page_segs_) {
      Segment& s = *segs_[i];
      if (s.valid && (page = find(s)) >= 0) {
        seg = &s;
        return;
      }
    }
  };
  look();
  if (!seg && refill_hook_) {  // take back remote frees before claiming more
    refill_hook_();
    look();
  }
  BeginBatch();
  if (!seg) {
    auto s = Claim(SegmentState::kPages, 0, lock);
    if (!s.ok()) {
      EndBatch();
      return s.status();
    }
    seg = *s;
    page = find(*seg);
  }
  const uint64_t bits = want_mask << page;
  seg->alloc[0] |= bits;
  seg->handed[0] |= bits;
  if (durable) seg->durable[0] |= bits;
  seg->alloc_count += pages;
  seg->run[page] = static_cast<uint8_t>(pages);
  WriteRun(*seg, page);
  if (durable) WriteBits(*seg, true, 0);
  WriteBits(*seg, false, 0);
  pages_allocated_ += pages;
  if (durable) pages_durable_ += pages;
  page_bytes_ += uint64_t{pages} * kPageSize;
  EndBatch();
  return meta_.SegOffset(seg->index) + uint64_t{static_cast<uint32_t>(page)} * kPageSize;
}

absl::StatusOr<PoolOffset> ArenaState::AllocHuge(uint64_t size, uint64_t alignment, bool durable,
                                                 const LockRunner& lock, PoolOffset begin,
                                                 PoolOffset end) {
  const AllocatorHeaderLayout& h = meta_.header();
  const uint64_t n64 = (size + kSegmentSize - 1) / kSegmentSize;
  if (n64 > h.segment_count - h.meta_segments) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a block of ", size, " bytes needs ", n64, " segments but the heap of ",
                     meta_.pool().name(), " has ", h.segment_count - h.meta_segments));
  }
  const uint32_t n = static_cast<uint32_t>(n64);
  if (refill_hook_) refill_hook_();  // remote frees may give segments back
  PoolOffset result = 0;
  BeginBatch();
  absl::Status st = lock([&]() -> absl::Status {
    std::vector<SegmentEntryLayout> e(h.segment_count);
    for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
      CXLRT_ASSIGN_OR_RETURN(e[i], meta_.ReadEntry(i));
    }
    uint32_t longest = 0, run = 0;
    for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
      run = e[i].state == static_cast<uint32_t>(SegmentState::kFree) ? run + 1 : 0;
      longest = std::max(longest, run);
    }
    for (uint32_t i = h.meta_segments; i + n <= h.segment_count; ++i) {
      if (meta_.SegOffset(i) % alignment != 0) continue;
      if (meta_.SegOffset(i) < begin || meta_.SegOffset(i) + n64 * kSegmentSize > end) continue;
      bool free = true;
      for (uint32_t k = 0; k < n && free; ++k) {
        free = e[i + k].state == static_cast<uint32_t>(SegmentState::kFree);
      }
      if (!free) continue;
      CXLRT_RETURN_IF_ERROR(meta_.pool().backend().Reserve(meta_.SegOffset(i), n64 * kSegmentSize));
      // Tails first, head last: a crash in between leaves orphan tails
      // (freed by recovery), never a head over free segments.
      for (uint32_t k = 1; k < n; ++k) {
        SegmentEntryLayout t = {};
        t.generation = e[i + k].generation + 1;
        t.state = static_cast<uint32_t>(SegmentState::kHugeTail);
        t.owner = slot_;
        t.head_index = i;
        meta_.WriteEntry(i + k, t);
      }
      CXLRT_FAULT_POINT("alloc.huge.after_tails");
      SegmentEntryLayout hd = {};
      hd.generation = e[i].generation + 1;
      hd.state = static_cast<uint32_t>(SegmentState::kHugeHead);
      hd.owner = slot_;
      hd.run_length = n;
      hd.durable = durable ? 1 : 0;
      hd.block_size = size;
      meta_.WriteEntry(i, hd);
      auto s = std::make_unique<Segment>();
      s->index = i;
      s->state = SegmentState::kHugeHead;
      s->run_length = n;
      s->huge_bytes = size;
      s->huge_durable = durable;
      segs_[i] = std::move(s);
      result = meta_.SegOffset(i);
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "no run of ", n, " free 2 MiB segments aligned to ", alignment, " for a block of ", size,
        " bytes in ", meta_.pool().name(), " (longest free run: ", longest, " segments)"));
  });
  if (st.ok()) {
    huge_segments_ += n;
    huge_bytes_ += size;
  }
  EndBatch();
  if (!st.ok()) return st;
  return result;
}

absl::StatusOr<PoolOffset> ArenaState::Allocate(uint64_t size, uint64_t alignment, bool durable,
                                                const LockRunner& lock) {
  if (auto cls = allocator::ClassFor(size, alignment)) return AllocSmall(*cls, durable, lock);
  const uint64_t max_pages = kPagesPerSegment - 1;
  if (alignment <= kPageSize && size <= max_pages * kPageSize) {
    return AllocPages(static_cast<uint32_t>((size + kPageSize - 1) / kPageSize), durable, lock);
  }
  return AllocHuge(size, std::max<uint64_t>(alignment, kSegmentSize), durable, lock);
}

absl::StatusOr<PoolOffset> ArenaState::AllocateIn(uint64_t size, uint64_t alignment, bool durable,
                                                  const LockRunner& lock, PoolOffset begin,
                                                  PoolOffset end) {
  return AllocHuge(size, std::max<uint64_t>(alignment, kSegmentSize), durable, lock, begin, end);
}

}  // namespace cxlrt::allocator_internal
