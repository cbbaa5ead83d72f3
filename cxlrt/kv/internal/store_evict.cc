// Eviction, owner side: a host evicts only its own entries, in its
// eviction order (internal/eviction.h), never one a live reader has pinned:
// it unseals, reads the pins again, and puts back what a reader pinned
// meanwhile. Freeing the block and storing the tombstone are one step
// across crashes (Allocator::FreeDurable).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::kv {

using kv_internal::kStateTombstone;

Store::Impl::Evicted Store::Impl::Evict(uint64_t bytes, uint32_t count,
                                        const std::function<bool(uint32_t)>& eligible) {
  Evicted out;
  auto short_of = [&](const Evicted& planned) {
    return (bytes && out.bytes + planned.bytes < bytes) ||
           (count && out.entries + planned.entries < count);
  };
  while (short_of({})) {
    // Victims in eviction order until they cover what is asked (no more:
    // a quota short by 20 KiB evicts one 30 KiB entry, not a batch).
    std::vector<uint32_t> victims;
    Evicted planned;
    while (short_of(planned)) {
      auto v = order_->TakeVictims(1, [&](uint32_t i) { return !local_[i].busy && eligible(i); });
      if (v.empty()) break;
      victims.push_back(v[0]);
      planned.bytes += local_[v[0]].size;
      ++planned.entries;
    }
    if (victims.empty()) break;
    if (EvictSlots(victims, &out).empty()) break;  // all pinned
  }
  return out;
}

std::vector<uint32_t> Store::Impl::EvictSlots(const std::vector<uint32_t>& victims,
                                              Evicted* evicted) {
  auto pinned = [](const std::vector<std::pair<uint32_t, uint64_t>>& set, uint32_t i,
                   uint64_t gen) {
    return std::binary_search(set.begin(), set.end(), std::make_pair(i, gen));
  };
  std::vector<uint32_t> go, gone;
  {
    const auto before = PinnedHere();
    for (uint32_t v : victims) {
      if (pinned(before, v, local_[v].gen)) {
        order_->Reinstate(v);
      } else {
        go.push_back(v);
      }
    }
  }
  if (go.empty()) return gone;
  // Unseal, then read the pins again: a reader pins, then checks the seal,
  // so a reader that pinned after our first look either shows up now or
  // saw the unseal and let go.
  std::vector<EntryLayout> heads(go.size());
  for (size_t k = 0; k < go.size(); ++k) {
    c_.Fetch(&heads[k], view_->EntryOff(me_, go[k]), sizeof(EntryLayout));
    heads[k].seal = 0;
    heads[k].state = static_cast<uint64_t>(EntryState::kEvicting);
    WriteEntryHead(go[k], heads[k]);
  }
  CXLRT_FAULT_POINT("kv.evict.unsealed");
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const auto after = PinnedHere();
  std::set<uint32_t> touched_ns;
  for (size_t k = 0; k < go.size(); ++k) {
    const uint32_t v = go[k];
    Local& l = local_[v];
    if (pinned(after, v, l.gen)) {
      heads[k].seal = l.gen;
      heads[k].state = static_cast<uint64_t>(EntryState::kPut);
      WriteEntryHead(v, heads[k]);
      order_->Reinstate(v);
      continue;
    }
    const Local was = l;
    absl::Status st = alloc_.FreeDurable(
        was.block, view_->EntryOff(me_, v) + offsetof(EntryLayout, state), kStateTombstone);
    if (!st.ok()) {
      CXLRT_LOG(kError) << "KV eviction of slot " << v << ": freeing its block: " << st;
      Tombstone(v);  // the pool says tombstone whatever happened to the block
    }
    local_[v] = Local{};
    local_[v].state = kStateTombstone;
    NsCountersLayout& c = counters_[was.ns];
    c.entries -= 1;
    c.bytes -= was.size;
    c.evictions += 1;
    touched_ns.insert(was.ns);
    if (evicted) {
      evicted->bytes += was.size;
      ++evicted->entries;
    }
    gone.push_back(v);
    // A tombstone before an empty slot ends no probe early: it can be empty.
    const uint32_t mask = view_->h().entries_per_host - 1;
    for (uint32_t j = v; local_[(j + 1) & mask].state == 0 && local_[j].state == kStateTombstone;
         j = (j - 1) & mask) {
      static const EntryLayout kEmpty = {};
      WriteEntryHead(j, kEmpty);
      local_[j] = Local{};
    }
  }
  for (uint32_t ns : touched_ns) PublishCounters(ns);
  return gone;
}

}  // namespace cxlrt::kv
