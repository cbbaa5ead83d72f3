// Internal to the arena's files (arena*.cc, heap_layout.cc): the process-
// local record of one segment an arena holds, and the small helpers those
// files share. The helpers that the allocation and free paths call per
// block are defined here, inline, so that splitting the arena by role
// (alloc, free, segments, durability, stats) costs no call.
//
// Thread-safety: as ArenaState (the Allocator's mutex or the pool lock
// guards a Segment).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlrt/allocator/internal/arena.h"

namespace cxlrt::allocator_internal {

// One segment an arena holds: its pool bitmaps mirrored, plus which blocks
// are handed out to callers (process-local).
struct ArenaState::Segment {
  uint32_t index = 0;
  SegmentState state = SegmentState::kFree;
  bool valid = true;  // false: a claim that did not finish, or an orphan tail
  uint32_t cls = 0;
  uint32_t blocks = 0;  // slab blocks; pages: kPagesPerSegment
  uint64_t block_size = 0;
  std::vector<uint64_t> alloc, durable, handed;
  uint32_t alloc_count = 0;
  uint32_t next_word = 0;  // where Refill looks first
  std::array<uint8_t, allocator::kPagesPerSegment> run{};
  uint32_t run_length = 0;  // huge head
  uint64_t huge_bytes = 0;
  bool huge_durable = false;
};

// kDataLoss naming the pool and what is wrong in its allocator.
inline absl::Status Corrupt(const runtime::Pool& pool, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("allocator of ", pool.name(), " is corrupt: ", what));
}

// Blocks a refill takes at once: about 64 KiB worth, 4..64 blocks (large
// classes still take several, so a host that allocates while others free
// its blocks does not pay a refill per block).
inline constexpr std::array<uint32_t, allocator::kNumClasses> kBatch = [] {
  std::array<uint32_t, allocator::kNumClasses> b{};
  for (uint32_t c = 0; c < allocator::kNumClasses; ++c) {
    b[c] =
        static_cast<uint32_t>(std::clamp<uint64_t>((64 << 10) / allocator::kClassSizes[c], 4, 64));
  }
  return b;
}();
inline uint32_t BatchFor(uint32_t cls) { return kBatch[cls]; }

// The bits of word `word` of a bitmap that stand for blocks (< `blocks`).
inline uint64_t ValidMask(uint32_t blocks, uint32_t word) {
  const uint64_t first = uint64_t{word} * 64;
  if (first + 64 <= blocks) return ~uint64_t{0};
  if (first >= blocks) return 0;
  return (uint64_t{1} << (blocks - first)) - 1;
}

inline bool TestBit(const std::vector<uint64_t>& v, uint32_t b) {
  return (v[b / 64] >> (b % 64)) & 1;
}
inline void SetBit(std::vector<uint64_t>& v, uint32_t b) { v[b / 64] |= uint64_t{1} << (b % 64); }
inline void ClearBit(std::vector<uint64_t>& v, uint32_t b) {
  v[b / 64] &= ~(uint64_t{1} << (b % 64));
}

inline BlockState ArenaState::StateOf(const Segment& s, uint32_t block) const {
  if (!views_) return BlockState::kArena;
  const auto& bytes = view_bytes_[s.index];
  if (!bytes || s.state != SegmentState::kSlab) return BlockState::kArena;
  return static_cast<BlockState>(bytes[block].load(std::memory_order_relaxed));
}

inline void ArenaState::SetState(const Segment& s, uint32_t block, BlockState st) {
  if (!views_) return;
  const auto& bytes = view_bytes_[s.index];
  if (bytes && s.state == SegmentState::kSlab) {
    bytes[block].store(static_cast<uint8_t>(st), std::memory_order_relaxed);
  }
}

inline ArenaState::Segment* ArenaState::Mine(PoolOffset off, uint32_t* index) const {
  auto i = meta_.SegmentOf(off);
  if (!i || !segs_[*i]) return nullptr;
  Segment* s = segs_[*i].get();
  if (s->state == SegmentState::kHugeTail && s->valid) return nullptr;
  *index = *i;
  return s;
}

}  // namespace cxlrt::allocator_internal
