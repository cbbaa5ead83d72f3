// Reading an allocator from outside: statistics and the full audit. These
// only read the pool, so `cxlrt pool info` and `cxlrt pool check` can run
// them without attaching as a host.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::allocator {

using allocator_internal::ArenaState;
using allocator_internal::HeapMeta;

namespace {

constexpr int kStableReadTries = 50;

// Loads arena `s` while its owner is not in the middle of a batch (its
// seqlock even and unchanged across the read). Returns false when it never
// held still.
absl::StatusOr<bool> LoadStable(const HeapMeta& meta, uint32_t s, ArenaState* arena) {
  runtime::Coherence& c = meta.c();
  const PoolOffset version = meta.ArenaOffset(s) + offsetof(ArenaLayout, version);
  for (int attempt = 0; attempt < kStableReadTries; ++attempt) {
    const uint64_t v1 = c.LoadFlag(version);
    if (v1 & 1) {
      absl::SleepFor(absl::Microseconds(200));
      continue;
    }
    CXLRT_RETURN_IF_ERROR(arena->Load());
    if (c.LoadFlag(version) == v1) return true;
  }
  return false;
}

}  // namespace

bool HasAllocator(const runtime::Pool& pool) { return pool.FindRegion(kAllocatorRegionName).ok(); }

absl::StatusOr<AllocatorStats> ReadStats(const runtime::Pool& pool) {
  CXLRT_ASSIGN_OR_RETURN(AllocatorHeaderLayout h, allocator_internal::ReadAllocatorHeader(pool));
  HeapMeta meta(pool, h);
  AllocatorStats st;
  st.segment_count = h.segment_count;
  st.meta_segments = h.meta_segments;
  st.heap_bytes = uint64_t{h.segment_count - h.meta_segments} * kSegmentSize;
  uint32_t run = 0, longest = 0;
  for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
    CXLRT_ASSIGN_OR_RETURN(SegmentEntryLayout e, meta.ReadEntry(i));
    const bool free = e.state == static_cast<uint32_t>(SegmentState::kFree);
    st.free_segments += free;
    run = free ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  st.largest_free_extent = uint64_t{longest} * kSegmentSize;
  st.free_bytes = uint64_t{st.free_segments} * kSegmentSize;
  for (uint32_t s = 0; s < h.host_slots; ++s) {
    ArenaState arena(meta, s, /*use_cache=*/false);
    CXLRT_ASSIGN_OR_RETURN(bool stable, LoadStable(meta, s, &arena));
    (void)stable;  // statistics tolerate a batch in flight
    HostStats hs = arena.Stats();
    const ArenaLayout& a = arena.published();
    // Handed-out counts are the owner's to know: take its published ones.
    hs.bytes_in_use = 0;
    hs.bytes_cached = 0;
    for (uint32_t c = 0; c < kNumClasses; ++c) {
      hs.classes[c].handed_out = std::min(a.handed_out[c], hs.classes[c].allocated);
      hs.bytes_in_use += hs.classes[c].handed_out * kClassSizes[c];
      hs.bytes_cached += (hs.classes[c].allocated - hs.classes[c].handed_out) * kClassSizes[c];
    }
    hs.bytes_in_use += hs.pages_allocated * kPageSize + hs.huge_segments * kSegmentSize;
    // Free space inside its slabs and page segments.
    for (uint32_t i = h.meta_segments; i < h.segment_count; ++i) {
      auto e = meta.ReadEntry(i);
      if (!e.ok() || e->owner != s) continue;
      if (e->state == static_cast<uint32_t>(SegmentState::kSlab)) {
        st.free_bytes += uint64_t{SlabBlocks(e->size_class)} * kClassSizes[e->size_class];
      } else if (e->state == static_cast<uint32_t>(SegmentState::kPages)) {
        st.free_bytes += uint64_t{kPagesPerSegment - 1} * kPageSize;
      }
    }
    for (uint32_t c = 0; c < kNumClasses; ++c) {
      st.free_bytes -= std::min(st.free_bytes, hs.classes[c].allocated * kClassSizes[c]);
    }
    st.free_bytes -= std::min(st.free_bytes, hs.pages_allocated * kPageSize);
    if (hs.segments > 0 || hs.owner_epoch != 0) st.hosts.push_back(hs);
  }
  st.fragmentation =
      st.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(st.largest_free_extent) / st.free_bytes;
  return st;
}

absl::Status Audit(const runtime::Pool& pool, std::vector<std::string>* problems_out) {
  std::vector<std::string> problems;
  auto header = allocator_internal::ReadAllocatorHeader(pool);
  if (!header.ok()) {
    if (header.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
    problems.emplace_back(header.status().message());
  } else {
    const AllocatorHeaderLayout& h = *header;
    HeapMeta meta(pool, h);
    // The segment table: metadata first, every other entry well formed
    // (ReadEntry checks checksum, state, owner and class), huge runs whole.
    std::vector<SegmentEntryLayout> e(h.segment_count);
    bool table_ok = true;
    for (uint32_t i = 0; i < h.segment_count; ++i) {
      auto r = meta.ReadEntry(i);
      if (!r.ok()) {
        problems.emplace_back(r.status().message());
        table_ok = false;
        continue;
      }
      e[i] = *r;
      const bool is_meta = e[i].state == static_cast<uint32_t>(SegmentState::kMeta);
      if (is_meta != (i < h.meta_segments)) {
        problems.push_back(absl::StrCat("segment ", i, (is_meta ? " is" : " is not"),
                                        " marked as allocator metadata (", h.meta_segments,
                                        " metadata segments)"));
      }
    }
    // Each arena: bitmaps against counters, runs, interrupted claims.
    std::vector<std::unique_ptr<ArenaState>> arenas;
    for (uint32_t s = 0; table_ok && s < h.host_slots; ++s) {
      auto arena = std::make_unique<ArenaState>(meta, s, /*use_cache=*/false);
      auto stable = LoadStable(meta, s, arena.get());
      if (!stable.ok()) {
        problems.emplace_back(stable.status().message());
        arenas.push_back(nullptr);
        continue;
      }
      if (!*stable) {
        problems.push_back(absl::StrCat("host ", s, "'s arena kept changing: not audited (busy)"));
        arenas.push_back(nullptr);
        continue;
      }
      arena->Audit(&problems);
      arenas.push_back(std::move(arena));
    }
    // Named blocks: each starts a durable allocated block and fits in it.
    auto regions = pool.ListRegions();
    if (!regions.ok()) problems.emplace_back(regions.status().message());
    for (const auto& r : regions.value_or(std::vector<runtime::RegionInfo>{})) {
      if (r.name == kAllocatorRegionName) continue;
      auto i = meta.SegmentOf(r.offset);
      const bool owner_ok = i && table_ok && e[*i].owner < arenas.size() && arenas[e[*i].owner];
      uint64_t usable = 0;
      if (!owner_ok || !arenas[e[*i].owner]->IsDurableBlockStart(r.offset, &usable)) {
        problems.push_back(absl::StrCat("named block '", r.name, "' at 0x", absl::Hex(r.offset),
                                        " is not a durable allocated block"));
      } else if (r.size > usable) {
        problems.push_back(absl::StrCat("named block '", r.name, "' of ", r.size,
                                        " bytes overruns its block of ", usable));
      }
    }
    // Rings: tail <= head <= tail + capacity.
    for (uint32_t p = 0; p < h.host_slots; ++p) {
      for (uint32_t o = 0; o < h.host_slots; ++o) {
        // Tail, head, tail again: a consumer that moved in between makes
        // the pair meaningless, and it is skipped.
        const uint64_t tail = meta.c().LoadFlag(meta.TailOffset(o, p));
        const uint64_t head = meta.c().LoadFlag(meta.HeadOffset(p, o));
        if (meta.c().LoadFlag(meta.TailOffset(o, p)) != tail) continue;
        if (tail > head || head - tail > h.ring_capacity) {
          problems.push_back(absl::StrCat("free ring from host ", p, " to host ", o, " has head ",
                                          head, " and tail ", tail, " (capacity ", h.ring_capacity,
                                          ")"));
        }
      }
    }
  }
  if (problems_out) problems_out->insert(problems_out->end(), problems.begin(), problems.end());
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("allocator of ", pool.name(), ": ", problems.size(),
                                          " problem", problems.size() == 1 ? "" : "s", ": ",
                                          absl::StrJoin(problems, "; ")));
}

}  // namespace cxlrt::allocator
