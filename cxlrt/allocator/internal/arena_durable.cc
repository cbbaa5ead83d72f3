// Durability and recovery: making a block durable, the intent record that
// makes CommitDurable / FreeDurable one step across crashes (redo), and
// reclaiming a dead or closing owner's private blocks.
#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/internal/arena_segment.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/checksum.h"
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

absl::Status ArenaState::MakeDurable(PoolOffset off, const LockRunner& lock) {
  uint32_t i = 0;
  Segment* sp = Mine(off, &i);
  auto not_block = [&] {
    return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                   " is not the start of a block of host ", slot_));
  };
  if (!sp || !sp->valid) return not_block();
  Segment& s = *sp;
  const PoolOffset base = meta_.SegOffset(i);
  auto already = [&] {
    return absl::FailedPreconditionError(absl::StrCat("the block at 0x", absl::Hex(off),
                                                      " is not a private block held by a caller"));
  };
  switch (s.state) {
    case SegmentState::kSlab: {
      const uint64_t rel = off - base;
      if (rel < kSegmentHeaderSize) return not_block();
      const uint64_t b64 = BlockIndex(rel - kSegmentHeaderSize, s.cls);
      if (b64 * s.block_size != rel - kSegmentHeaderSize || b64 >= s.blocks) return not_block();
      const uint32_t b = static_cast<uint32_t>(b64);
      if (!TestBit(s.handed, b) || TestBit(s.durable, b) ||
          StateOf(s, b) == BlockState::kThreadCache) {
        return already();
      }
      SetState(s, b, BlockState::kArena);  // its free must take the full path now
      BeginBatch();
      SetBit(s.durable, b);
      WriteBits(s, true, b / 64);
      ++counts_[s.cls].durable;
      EndBatch();
      return absl::OkStatus();
    }
    case SegmentState::kPages: {
      const uint64_t rel = off - base;
      const uint32_t p = static_cast<uint32_t>(rel / kPageSize);
      if (rel % kPageSize != 0 || p == 0 || s.run[p] == 0) return not_block();
      if (!((s.handed[0] >> p) & 1) || ((s.durable[0] >> p) & 1)) return already();
      const uint32_t n = s.run[p];
      BeginBatch();
      s.durable[0] |= (n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << p;
      WriteBits(s, true, 0);
      pages_durable_ += n;
      EndBatch();
      return absl::OkStatus();
    }
    case SegmentState::kHugeHead: {
      if (off != base) return not_block();
      if (s.huge_durable) return already();
      BeginBatch();
      absl::Status st = lock([&]() -> absl::Status {
        CXLRT_ASSIGN_OR_RETURN(SegmentEntryLayout e, meta_.ReadEntry(i));
        e.durable = 1;
        meta_.WriteEntry(i, e);
        return absl::OkStatus();
      });
      if (st.ok()) s.huge_durable = true;
      EndBatch();
      return st;
    }
    default:
      return not_block();
  }
}

namespace {
uint32_t RedoChecksum(const allocator::ArenaRedoLayout& r) {
  return runtime::Crc32c(&r, offsetof(allocator::ArenaRedoLayout, checksum));
}
const LockRunner kLockHeld = [](const std::function<absl::Status()>& fn) { return fn(); };
}  // namespace

void ArenaState::WriteRedo(allocator::RedoKind kind, PoolOffset block, PoolOffset word,
                           uint64_t value) {
  // An intent is a promise to store `value` at `word` even after a crash:
  // written only while the arena is still this process's in the pool.
  if (kind == allocator::RedoKind::kNone ? lost_ : !StillMine()) return;
  allocator::ArenaRedoLayout r = {};
  r.kind = static_cast<uint32_t>(kind);
  r.block = block;
  r.word = word;
  r.value = value;
  r.owner_epoch = kind == allocator::RedoKind::kNone ? 0 : pool_owner_epoch_;
  if (kind != allocator::RedoKind::kNone) CXLRT_FAULT_POINT("alloc.redo.intent");
  r.checksum = RedoChecksum(r);
  meta_.c().PublishObject(meta_.ArenaOffset(slot_) + offsetof(ArenaLayout, redo), r);
}

void ArenaState::FinishRedo() {
  const auto r = meta_.c().FetchObject<allocator::ArenaRedoLayout>(meta_.ArenaOffset(slot_) +
                                                                   offsetof(ArenaLayout, redo));
  const auto kind = static_cast<allocator::RedoKind>(r.kind);
  if (kind == allocator::RedoKind::kNone || r.checksum != RedoChecksum(r)) return;
  if ((kind != allocator::RedoKind::kMakeDurable && kind != allocator::RedoKind::kFree) ||
      !meta_.IsHeapWord(r.word)) {
    CXLRT_LOG(kError) << "arena " << slot_ << ": intent record of kind " << r.kind
                      << " names word 0x" << std::hex << r.word
                      << ", not a word of the heap; dropped";
    WriteRedo(allocator::RedoKind::kNone);
    return;
  }
  if (r.owner_epoch != 0 && r.owner_epoch != pool_owner_epoch_) {
    // Written by an incarnation after its arena had been recovered (it was
    // fenced and froze between its checks and this store): its call
    // returned kAborted, and nobody may act on it.
    CXLRT_LOG(kWarning) << "arena " << slot_ << ": intent record of owner epoch " << r.owner_epoch
                        << " in an arena of owner epoch " << pool_owner_epoch_
                        << " (written after its recovery by a fenced host); dropped";
    WriteRedo(allocator::RedoKind::kNone);
    return;
  }
  // The block change may have happened before the crash: MakeDurable then
  // finds the block durable, Free finds it not allocated. Either way the
  // block ends as the record says, and the word is stored again.
  absl::Status st = kind == allocator::RedoKind::kMakeDurable ? MakeDurable(r.block, kLockHeld)
                                                              : Free(r.block, true, kLockHeld);
  CXLRT_LOG(kInfo) << "arena " << slot_ << ": finished an interrupted "
                   << (kind == allocator::RedoKind::kMakeDurable ? "commit" : "free")
                   << " of block 0x" << std::hex << r.block << std::dec << " ("
                   << (st.ok() ? "done now" : "already done") << ")";
  meta_.c().Publish(r.word, &r.value, 8);
  WriteRedo(allocator::RedoKind::kNone);
}

absl::Status ArenaState::ReclaimPrivate() {
  FinishRedo();
  BeginBatch();
  for (auto& sp : segs_) {
    if (!sp) continue;
    Segment& s = *sp;
    if (!s.valid) {
      ReleaseLocked(s);
      continue;
    }
    if (s.state == SegmentState::kSlab || s.state == SegmentState::kPages) {
      if (s.state == SegmentState::kPages) {
        for (uint32_t p = 1; p < kPagesPerSegment; ++p) {
          if (s.run[p] && !((s.durable[0] >> p) & 1)) {
            s.run[p] = 0;
            WriteRun(s, p);
          }
        }
        s.durable[0] &= ~uint64_t{1};
      }
      s.alloc_count = 0;
      for (uint32_t w = 0; w < s.alloc.size(); ++w) {
        const uint64_t keep = s.durable[w] | (s.state == SegmentState::kPages && w == 0 ? 1 : 0);
        if (s.alloc[w] != keep) {
          s.alloc[w] = keep;
          WriteBits(s, false, w);
        }
        s.handed[w] = s.durable[w];
        s.alloc_count += std::popcount(keep);
      }
      if (s.state == SegmentState::kSlab) {
        for (uint32_t b = 0; b < s.blocks; ++b) SetState(s, b, BlockState::kArena);
      }
      const bool empty = s.state == SegmentState::kPages ? s.alloc_count <= 1 : s.alloc_count == 0;
      if (empty) ReleaseLocked(s);
    } else if (s.state == SegmentState::kHugeHead && !s.huge_durable) {
      ReleaseLocked(s);
    }
  }
  for (auto& v : cache_) v.clear();
  RecountFromBitmaps();
  CXLRT_FAULT_POINT("alloc.recover.reclaimed");
  EndBatch();
  return absl::OkStatus();
}

bool ArenaState::IsDurableBlockStart(PoolOffset off, uint64_t* usable) const {
  uint32_t i = 0;
  Segment* s = Mine(off, &i);
  if (!s || !s->valid) return false;
  const PoolOffset base = meta_.SegOffset(i);
  if (s->state == SegmentState::kSlab) {
    const uint64_t rel = off - base;
    if (rel < kSegmentHeaderSize || (rel - kSegmentHeaderSize) % s->block_size) return false;
    const uint64_t b = (rel - kSegmentHeaderSize) / s->block_size;
    if (b >= s->blocks) return false;
    *usable = s->block_size;
    return TestBit(s->durable, static_cast<uint32_t>(b));
  }
  if (s->state == SegmentState::kPages) {
    const uint64_t rel = off - base;
    const uint32_t p = static_cast<uint32_t>(rel / kPageSize);
    if (rel % kPageSize || p == 0 || s->run[p] == 0) return false;
    *usable = uint64_t{s->run[p]} * kPageSize;
    return (s->durable[0] >> p) & 1;
  }
  if (s->state == SegmentState::kHugeHead && off == base) {
    *usable = uint64_t{s->run_length} * kSegmentSize;
    return s->huge_durable;
  }
  return false;
}

}  // namespace cxlrt::allocator_internal
