// Frees: the cached fast path, the full path for slabs, pages and huge
// blocks, returning cached blocks to their slabs, and draining the rings
// of frees other hosts sent.
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

bool ArenaState::TryFreeCached(PoolOffset off) {
  const auto i = meta_.SegmentOf(off);
  if (!i) return false;
  Segment* s = segs_[*i].get();
  if (!s || s->state != SegmentState::kSlab || !s->valid) return false;
  const uint64_t rel = off - meta_.SegOffset(*i);
  if (rel < kSegmentHeaderSize) return false;
  const uint64_t b = BlockIndex(rel - kSegmentHeaderSize, s->cls);
  if (b * s->block_size != rel - kSegmentHeaderSize || b >= s->blocks) return false;
  const uint32_t bit = static_cast<uint32_t>(b);
  if (!TestBit(s->handed, bit) || TestBit(s->durable, bit)) return false;
  if (StateOf(*s, bit) == BlockState::kThreadCache) return false;  // Free reports it
  auto& cache = cache_[s->cls];
  if (cache.size() >= 2 * BatchFor(s->cls)) return false;
  ClearBit(s->handed, bit);
  SetState(*s, bit, BlockState::kArena);
  --counts_[s->cls].handed_out;
  cache.push_back(off);
  return true;
}

absl::Status ArenaState::Free(PoolOffset off, bool allow_named, const LockRunner& lock) {
  uint32_t i = 0;
  Segment* sp = Mine(off, &i);
  if (!sp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool offset 0x", absl::Hex(off), " is not in an allocated block of host ", slot_));
  }
  Segment& s = *sp;
  const PoolOffset base = meta_.SegOffset(i);
  auto named_check = [&]() -> absl::Status {
    if (allow_named) return absl::OkStatus();
    CXLRT_ASSIGN_OR_RETURN(bool named, IsNamed(off));
    if (named) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the block at 0x", absl::Hex(off), " is published by name: free it with FreeNamed"));
    }
    return absl::OkStatus();
  };
  if (!s.valid) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool offset 0x", absl::Hex(off), " is in a segment being claimed"));
  }
  switch (s.state) {
    case SegmentState::kSlab: {
      const uint64_t rel = off - base;
      const uint64_t b64 =
          rel >= kSegmentHeaderSize ? BlockIndex(rel - kSegmentHeaderSize, s.cls) : ~0ull;
      if (rel < kSegmentHeaderSize || b64 * s.block_size != rel - kSegmentHeaderSize ||
          b64 >= s.blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pool offset 0x", absl::Hex(off), " is not the start of a block (blocks of ",
            s.block_size, " bytes start at 0x", absl::Hex(base + kSegmentHeaderSize), ")"));
      }
      const uint32_t b = static_cast<uint32_t>(b64);
      if (!TestBit(s.handed, b) || StateOf(s, b) == BlockState::kThreadCache) {
        return absl::FailedPreconditionError(absl::StrCat("double free: the block at 0x",
                                                          absl::Hex(off), " (", s.block_size,
                                                          " bytes) is not allocated"));
      }
      const bool durable = TestBit(s.durable, b);
      if (durable) CXLRT_RETURN_IF_ERROR(named_check());
      ClearBit(s.handed, b);
      SetState(s, b, BlockState::kArena);
      --counts_[s.cls].handed_out;
      auto& cache = cache_[s.cls];
      if (use_cache_ && cache.size() < 2 * BatchFor(s.cls) && !durable) {
        // The fast path: no pool write (the block stays allocated in the
        // bitmap, free in this host's cache).
        cache.push_back(off);
        return absl::OkStatus();
      }
      BeginBatch();
      if (durable) {
        ClearBit(s.durable, b);
        WriteBits(s, true, b / 64);
        --counts_[s.cls].durable;
      }
      if (use_cache_ && cache.size() < 2 * BatchFor(s.cls)) {
        cache.push_back(off);
        EndBatch();
        return absl::OkStatus();
      }
      // Write back this block, and half the cache when it is full.
      std::vector<PoolOffset> back = {off};
      if (use_cache_) {
        const size_t keep = BatchFor(s.cls);
        back.insert(back.end(), cache.begin() + keep, cache.end());
        cache.resize(keep);
      }
      std::vector<Segment*> touched;
      for (PoolOffset o : back) {
        Segment* t = ReturnToSlab(o);
        if (std::find(touched.begin(), touched.end(), t) == touched.end()) touched.push_back(t);
      }
      CXLRT_FAULT_POINT("alloc.free.after_bitmap");
      absl::Status st;
      for (Segment* t : touched) {
        if (st.ok()) st = ReleaseIfEmpty(*t, lock);
      }
      EndBatch();
      return st;
    }
    case SegmentState::kPages: {
      const uint64_t rel = off - base;
      const uint32_t p = static_cast<uint32_t>(rel / kPageSize);
      if (rel % kPageSize != 0 || p == 0 || s.run[p] == 0 || !((s.handed[0] >> p) & 1)) {
        const bool start = rel % kPageSize == 0 && p > 0 && s.run[p] > 0;
        if (start) {
          return absl::FailedPreconditionError(
              absl::StrCat("double free: the block at 0x", absl::Hex(off), " is not allocated"));
        }
        return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                       " is not the start of an allocated block"));
      }
      const uint32_t n = s.run[p];
      const uint64_t bits = (n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << p;
      const bool durable = (s.durable[0] >> p) & 1;
      if (durable) CXLRT_RETURN_IF_ERROR(named_check());
      BeginBatch();
      s.alloc[0] &= ~bits;
      s.handed[0] &= ~bits;
      s.durable[0] &= ~bits;
      s.alloc_count -= n;
      s.run[p] = 0;
      WriteBits(s, false, 0);
      if (durable) WriteBits(s, true, 0);
      WriteRun(s, p);
      pages_allocated_ -= n;
      if (durable) pages_durable_ -= n;
      page_bytes_ -= uint64_t{n} * kPageSize;
      absl::Status st = ReleaseIfEmpty(s, lock);
      EndBatch();
      return st;
    }
    case SegmentState::kHugeHead: {
      if (off != base) {
        return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                       " is inside the block starting at 0x",
                                                       absl::Hex(base)));
      }
      if (s.huge_durable) CXLRT_RETURN_IF_ERROR(named_check());
      const uint32_t n = s.run_length;
      const uint64_t bytes = s.huge_bytes;
      BeginBatch();
      absl::Status st = lock([&] {
        ReleaseLocked(s);
        return absl::OkStatus();
      });
      if (st.ok()) {
        huge_segments_ -= n;
        huge_bytes_ -= bytes;
      }
      EndBatch();
      return st;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("pool offset 0x", absl::Hex(off), " is not the start of a block"));
  }
}

ArenaState::Segment* ArenaState::ReturnToSlab(PoolOffset off) {
  const uint32_t i = *meta_.SegmentOf(off);
  Segment* s = segs_[i].get();
  const uint32_t b =
      static_cast<uint32_t>(BlockIndex(off - meta_.SegOffset(i) - kSegmentHeaderSize, s->cls));
  ClearBit(s->alloc, b);
  WriteBits(*s, false, b / 64);
  --s->alloc_count;
  --counts_[s->cls].allocated;
  return s;
}

void ArenaState::FlushCache() {
  BeginBatch();
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    for (PoolOffset o : cache_[c]) ReturnToSlab(o);
    cache_[c].clear();
  }
  EndBatch();
}

uint64_t ArenaState::DrainRings(std::vector<uint64_t>* tails, const LockRunner& lock,
                                bool active_only) {
  const uint32_t cap = meta_.header().ring_capacity;
  uint64_t applied = 0;
  if (active_.size() != meta_.slots()) active_.assign(meta_.slots(), 64);  // all, at first
  for (uint32_t p = 0; p < meta_.slots(); ++p) {
    // A refill looks only at hosts that sent frees lately; ticks look at all.
    if (active_only && !active_[p]) continue;
    const uint64_t head = meta_.c().LoadFlag(meta_.HeadOffset(p, slot_));
    uint64_t& tail = (*tails)[p];
    if (head == tail) {
      if (active_[p] > 0) --active_[p];
      continue;
    }
    active_[p] = 64;  // sweeps with nothing from p before it is skipped again
    if (head < tail || head - tail > cap) {
      CXLRT_LOG(kError) << "free ring from host " << p << " to host " << slot_ << " of "
                        << meta_.pool().name() << " is corrupt (head " << head << ", tail " << tail
                        << ", capacity " << cap << "); its entries are dropped";
      tail = head;
    } else {
      for (uint64_t seq = tail; seq < head; ++seq) {
        RingEntryLayout entry;
        meta_.c().Fetch(&entry, meta_.RingOffset(p, slot_) + (seq % cap) * sizeof(entry),
                        sizeof(entry));
        const PoolOffset off = entry.offset & ~allocator::kRingEntryDurable;
        const bool durable = entry.offset & allocator::kRingEntryDurable;
        if (!durable && entry.owner_epoch != owner_epoch_) {
          // Meant for an earlier incarnation of this slot: its blocks were
          // reclaimed with it, so applying it could free a new block.
          CXLRT_LOG(kInfo) << "host " << p << "'s free of 0x" << std::hex << off << std::dec
                           << " was meant for epoch " << entry.owner_epoch << " of host " << slot_
                           << ", not " << owner_epoch_ << ": dropped";
          continue;
        }
        if (TryFreeCached(off)) {
          ++applied;
          continue;
        }
        absl::Status st = Free(off, /*allow_named=*/false, lock);
        if (!st.ok()) {
          ++rejected_frees_;
          CXLRT_LOG(kWarning) << "host " << p << " freed 0x" << std::hex << off << std::dec
                              << " of host " << slot_ << ": refused: " << st.message();
        } else {
          ++applied;
        }
      }
      tail = head;
    }
    if (!lost_) meta_.c().StoreFlag(meta_.TailOffset(slot_, p), tail);
  }
  return applied;
}

}  // namespace cxlrt::allocator_internal
