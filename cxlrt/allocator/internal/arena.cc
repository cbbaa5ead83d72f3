// An arena's state: loading it from the pool, the lock-free slab views, and
// publishing bitmaps and counters (the seqlock batches).
#include "cxlrt/allocator/internal/arena.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena_segment.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
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

ArenaState::ArenaState(const HeapMeta& meta, uint32_t slot, bool use_cache)
    : meta_(meta),
      slot_(slot),
      use_cache_(use_cache),
      // Only an owner's arena has thread caches to show its slabs to.
      views_(use_cache ? std::make_unique<SlabView[]>(meta.header().segment_count) : nullptr),
      view_bytes_(use_cache ? meta.header().segment_count : 0) {}

ArenaState::~ArenaState() = default;

absl::Status ArenaState::Load() {
  const AllocatorHeaderLayout& h = meta_.header();
  ArenaLayout& a = published_;
  meta_.c().Fetch(&a, meta_.ArenaOffset(slot_), sizeof(a));
  load_problems_.clear();
  auto problem = [&](uint32_t i, const std::string& what) {
    load_problems_.push_back(absl::StrCat("host ", slot_, " segment ", i, ": ", what));
  };
  version_ = a.version + (a.version & 1);  // an interrupted batch: make it even again
  owner_epoch_ = a.owner_epoch;
  pool_owner_epoch_ = a.owner_epoch;
  lost_ = false;
  rejected_frees_ = a.rejected_frees;
  for (uint32_t i = 0; i < h.segment_count; ++i) HideSlab(i);
  segs_.clear();
  segs_.resize(h.segment_count);
  for (auto& v : class_segs_) v.clear();
  page_segs_.clear();
  for (auto& v : cache_) v.clear();

  std::vector<SegmentEntryLayout> entries(h.segment_count);
  for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
    CXLRT_ASSIGN_OR_RETURN(entries[i], meta_.ReadEntry(i));
  }
  for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
    const SegmentEntryLayout& e = entries[i];
    const auto state = static_cast<SegmentState>(e.state);
    if (e.owner != slot_ || state == SegmentState::kFree || state == SegmentState::kMeta) continue;
    auto s = std::make_unique<Segment>();
    s->index = i;
    s->state = state;
    if (state == SegmentState::kSlab || state == SegmentState::kPages) {
      auto hdr = meta_.ReadSegmentHeader(i, e);
      s->valid = hdr.has_value();
      s->cls = e.size_class;
      s->blocks =
          state == SegmentState::kSlab ? allocator::SlabBlocks(e.size_class) : kPagesPerSegment;
      s->block_size = state == SegmentState::kSlab ? kClassSizes[e.size_class] : kPageSize;
      const uint32_t words = (s->blocks + 63) / 64;
      s->alloc.assign(words, 0);
      s->durable.assign(words, 0);
      if (s->valid) {
        const PoolOffset base = meta_.SegOffset(i);
        meta_.c().Fetch(s->alloc.data(), base + kAllocBitmapOffset, words * 8);
        meta_.c().Fetch(s->durable.data(), base + kDurableBitmapOffset, words * 8);
        if (state == SegmentState::kPages) {
          meta_.c().Fetch(s->run.data(), base + kRunLengthOffset, s->run.size());
        }
      }
      if (!s->valid) problem(i, "claimed but its header is not initialised (an interrupted claim)");
      for (uint32_t w = 0; w < words; ++w) {
        if (s->alloc[w] & ~ValidMask(s->blocks, w))
          problem(i, "alloc bits set past its last block");
        if (s->durable[w] & ~s->alloc[w]) problem(i, "durable bits set on blocks not allocated");
        s->alloc[w] &= ValidMask(s->blocks, w);
        s->durable[w] &= s->alloc[w];
        s->alloc_count += std::popcount(s->alloc[w]);
      }
      if (state == SegmentState::kPages && s->valid) {
        // Runs tile the allocated pages exactly: alloc == header page + runs.
        uint64_t covered = 1;
        for (uint32_t p = 1; p < kPagesPerSegment; ++p) {
          const uint32_t n = s->run[p];
          if (n == 0) continue;
          const uint64_t bits = (n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << p;
          if (p + n > kPagesPerSegment || (covered & bits)) {
            problem(i, absl::StrCat("page run at ", p, " of ", n, " pages overlaps or overruns"));
            s->run[p] = 0;  // never used to size or free anything
            continue;
          }
          const uint64_t d = s->durable[0] & bits;
          if (d != 0 && d != (bits & ((uint64_t{1} << kPagesPerSegment) - 1))) {
            problem(i, absl::StrCat("page run at ", p, " is partly durable"));
          }
          covered |= bits;
        }
        if ((s->alloc[0] | 1) != covered || !(s->alloc[0] & 1)) {
          problem(i, "allocated pages do not match its runs");
        }
      }
      s->handed = s->alloc;
      if (state == SegmentState::kSlab) class_segs_[s->cls].push_back(i);
      if (state == SegmentState::kPages) page_segs_.push_back(i);
    } else if (state == SegmentState::kHugeHead) {
      s->run_length = e.run_length;
      s->huge_bytes = e.block_size;
      s->huge_durable = e.durable != 0;
      if (e.run_length < 1 || i + uint64_t{e.run_length} > h.segment_count) {
        return Corrupt(meta_.pool(), absl::StrCat("huge block at segment ", i, " runs ",
                                                  e.run_length, " segments past the heap"));
      }
      for (uint32_t k = 1; k < e.run_length; ++k) {
        const SegmentEntryLayout& t = entries[i + k];
        if (t.state != static_cast<uint32_t>(SegmentState::kHugeTail) || t.head_index != i ||
            t.owner != slot_) {
          return Corrupt(meta_.pool(),
                         absl::StrCat("huge block at segment ", i, " of ", e.run_length,
                                      " segments: segment ", i + k, " is not its tail"));
        }
      }
    } else {  // a tail: valid when its head claims it
      const uint32_t head = e.head_index;
      const bool ok = head < i &&
                      entries[head].state == static_cast<uint32_t>(SegmentState::kHugeHead) &&
                      entries[head].owner == slot_ && head + entries[head].run_length > i;
      if (ok) continue;
      s->valid = false;  // an orphan left by an interrupted claim or release
      problem(i, "huge tail segment without its head (an interrupted claim or release)");
    }
    segs_[i] = std::move(s);
    ShowSlab(*segs_[i]);
  }
  RecountFromBitmaps();
  return absl::OkStatus();
}

void ArenaState::ShowSlab(const Segment& s) {
  if (!views_ || s.state != SegmentState::kSlab || !s.valid) return;
  auto& bytes = view_bytes_[s.index];
  if (!bytes) {
    bytes = std::make_unique<std::atomic<uint8_t>[]>(allocator::SlabBlocks(0));
    views_[s.index].state.store(bytes.get(), std::memory_order_release);
  }
  for (uint32_t b = 0; b < s.blocks; ++b) SetState(s, b, BlockState::kArena);
  views_[s.index].cls1.store(s.cls + 1, std::memory_order_release);
}

bool ArenaState::Owns(PoolOffset off) const {
  auto i = meta_.SegmentOf(off);
  if (!i) return false;
  if (segs_[*i]) return true;
  return false;
}

void ArenaState::WriteBits(Segment& s, bool durable_map, uint32_t word) {
  if (lost_) return;
  const uint64_t v = (durable_map ? s.durable : s.alloc)[word];
  meta_.c().Publish(meta_.SegOffset(s.index) +
                        (durable_map ? kDurableBitmapOffset : kAllocBitmapOffset) +
                        uint64_t{word} * 8,
                    &v, sizeof(v));
}

void ArenaState::WriteRun(Segment& s, uint32_t page) {
  if (lost_) return;
  meta_.c().Publish(meta_.SegOffset(s.index) + kRunLengthOffset + page, &s.run[page], 1);
}

bool ArenaState::StillMine() {
  if (lost_) return false;
  const uint64_t in_pool =
      meta_.c().LoadFlag(meta_.ArenaOffset(slot_) + offsetof(ArenaLayout, owner_epoch));
  if (in_pool == pool_owner_epoch_) return true;
  lost_ = true;
  CXLRT_LOG(kError) << "the arena of host " << slot_ << " has owner epoch " << in_pool
                    << " in the pool, not " << pool_owner_epoch_
                    << ": a survivor recovered it (this host was fenced); it writes nothing more";
  return false;
}

void ArenaState::BeginBatch() {
  if (batch_depth_++ > 0) return;
  CXLRT_FAULT_POINT("alloc.batch.begin");
  if (!StillMine()) return;
  ++version_;  // odd: readers retry
  meta_.c().StoreFlag(meta_.ArenaOffset(slot_) + offsetof(ArenaLayout, version), version_);
}

void ArenaState::EndBatch() {
  if (--batch_depth_ > 0 || !StillMine()) return;
  // The owner publishes its counters on its tick (PublishCounters), not on
  // every batch; recovery and frees into unowned arenas publish each time.
  if (use_cache_ && !publish_counters_) {
    ++version_;
    meta_.c().StoreFlag(meta_.ArenaOffset(slot_) + offsetof(ArenaLayout, version), version_);
    return;
  }
  ArenaLayout a = {};
  a.counters_version = version_ + 1;
  a.owner_epoch = owner_epoch_;
  a.rejected_frees = rejected_frees_;
  a.stats_time_ns = static_cast<uint64_t>(runtime::NowNs());
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    a.allocated[c] = counts_[c].allocated;
    a.handed_out[c] = HandedToCallers(c);
    a.durable[c] = counts_[c].durable;
  }
  a.pages_allocated = pages_allocated_;
  a.pages_durable = pages_durable_;
  a.huge_segments = huge_segments_;
  a.huge_bytes = huge_bytes_;
  a.page_bytes = page_bytes_;
  const size_t from = offsetof(ArenaLayout, owner_epoch);
  const size_t to = offsetof(ArenaLayout, pad1);
  meta_.c().Publish(meta_.ArenaOffset(slot_) + from, reinterpret_cast<const uint8_t*>(&a) + from,
                    to - from);
  pool_owner_epoch_ = owner_epoch_;
  ++version_;
  meta_.c().StoreFlag(meta_.ArenaOffset(slot_) + offsetof(ArenaLayout, version), version_);
}

void ArenaState::PublishCounters() {
  publish_counters_ = true;
  BeginBatch();
  EndBatch();
  publish_counters_ = false;
}

absl::StatusOr<bool> ArenaState::IsNamed(PoolOffset off) const {
  CXLRT_ASSIGN_OR_RETURN(auto regions, meta_.pool().ListRegions());
  for (const auto& r : regions) {
    if (r.offset == off && r.name != allocator::kAllocatorRegionName) return true;
  }
  return false;
}

absl::StatusOr<uint64_t> ArenaState::BlockSize(PoolOffset off) const {
  uint32_t i = 0;
  Segment* s = Mine(off, &i);
  if (!s)
    return absl::InvalidArgumentError(absl::StrCat("0x", absl::Hex(off), " is not this host's"));
  if (s->state == SegmentState::kSlab) return s->block_size;
  if (s->state == SegmentState::kPages) {
    const uint32_t p = static_cast<uint32_t>((off - meta_.SegOffset(i)) / kPageSize);
    return uint64_t{s->run[p]} * kPageSize;
  }
  return uint64_t{s->run_length} * kSegmentSize;
}

void ArenaState::RecountFromBitmaps() {
  // counts = popcounts of the bitmaps, the truth; every block counts as
  // handed out (whoever holds it), none as cached.
  counts_ = {};
  pages_allocated_ = pages_durable_ = huge_segments_ = huge_bytes_ = page_bytes_ = 0;
  for (auto& sp : segs_) {
    if (!sp || !sp->valid) continue;
    if (sp->state == SegmentState::kSlab) {
      for (uint64_t w : sp->alloc) counts_[sp->cls].allocated += std::popcount(w);
      for (uint64_t w : sp->durable) counts_[sp->cls].durable += std::popcount(w);
      counts_[sp->cls].handed_out = counts_[sp->cls].allocated;
    } else if (sp->state == SegmentState::kPages) {
      const uint32_t pages = sp->alloc_count > 0 ? sp->alloc_count - 1 : 0;  // page 0: header
      pages_allocated_ += pages;
      pages_durable_ += std::popcount(sp->durable[0]);
      page_bytes_ += uint64_t{pages} * kPageSize;
    } else if (sp->state == SegmentState::kHugeHead) {
      huge_segments_ += sp->run_length;
      huge_bytes_ += sp->huge_bytes;
    }
  }
}

}  // namespace cxlrt::allocator_internal
