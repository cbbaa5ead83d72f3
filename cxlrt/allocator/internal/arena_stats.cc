// Inspection: the audit of an arena's invariants and its statistics.
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

void ArenaState::Audit(std::vector<std::string>* problems) const {
  problems->insert(problems->end(), load_problems_.begin(), load_problems_.end());
  const ArenaLayout& a = published_;
  auto mismatch = [&](const std::string& what, uint64_t published, uint64_t counted) {
    if (published != counted) {
      problems->push_back(absl::StrCat("host ", slot_, " publishes ", what, " = ", published,
                                       " but its bitmaps hold ", counted));
    }
  };
  // Counters describe the bitmaps of the version they were published at;
  // once the owner has changed its bitmaps since, they are not compared.
  const bool current = a.counters_version == a.version;
  for (uint32_t c = 0; current && c < kNumClasses; ++c) {
    // allocated[c] = sum over its slabs of class c of popcount(alloc)
    mismatch(absl::StrCat("allocated[", kClassSizes[c], " B]"), a.allocated[c],
             counts_[c].allocated);
    // durable[c] = sum of popcount(durable), durable subset of alloc
    mismatch(absl::StrCat("durable[", kClassSizes[c], " B]"), a.durable[c], counts_[c].durable);
    // handed_out[c] <= allocated[c]
    if (a.handed_out[c] > a.allocated[c]) {
      problems->push_back(absl::StrCat("host ", slot_, " hands out ", a.handed_out[c],
                                       " blocks of ", kClassSizes[c], " B but has only ",
                                       a.allocated[c], " allocated"));
    }
  }
  if (current) {
    mismatch("pages_allocated", a.pages_allocated, pages_allocated_);
    mismatch("pages_durable", a.pages_durable, pages_durable_);
    mismatch("huge_segments", a.huge_segments, huge_segments_);
  }
  if (a.owner_epoch == 0) {
    // An unowned arena holds durable blocks only: alloc == durable.
    uint64_t private_blocks = 0;
    for (uint32_t c = 0; c < kNumClasses; ++c)
      private_blocks += counts_[c].allocated - counts_[c].durable;
    private_blocks += pages_allocated_ - pages_durable_;
    for (const auto& s : segs_) {
      if (s && s->state == SegmentState::kHugeHead && !s->huge_durable) ++private_blocks;
    }
    if (private_blocks) {
      problems->push_back(absl::StrCat("host ", slot_, " has no owner but ", private_blocks,
                                       " private blocks are still allocated (not recovered)"));
    }
  }
}

allocator::HostStats ArenaState::Stats() const {
  allocator::HostStats st;
  st.slot = slot_;
  st.owner_epoch = owner_epoch_;
  st.rejected_frees = rejected_frees_;
  for (const auto& s : segs_) {
    if (!s) continue;
    st.segments += s->state == SegmentState::kHugeHead
                       ? s->run_length
                       : (s->state == SegmentState::kHugeTail ? 0 : 1);
  }
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    st.classes[c] = counts_[c];
    st.classes[c].handed_out = HandedToCallers(c);
    const allocator::ClassStats& n = st.classes[c];
    st.bytes_in_use += n.handed_out * kClassSizes[c];
    st.bytes_cached += (n.allocated - n.handed_out) * kClassSizes[c];
    st.durable_bytes += n.durable * kClassSizes[c];
  }
  st.bytes_in_use += pages_allocated_ * kPageSize + huge_segments_ * kSegmentSize;
  st.durable_bytes += pages_durable_ * kPageSize;
  for (const auto& s : segs_) {
    if (s && s->state == SegmentState::kHugeHead && s->huge_durable) {
      st.durable_bytes += uint64_t{s->run_length} * kSegmentSize;
    }
  }
  st.pages_allocated = pages_allocated_;
  st.huge_segments = huge_segments_;
  return st;
}

}  // namespace cxlrt::allocator_internal
