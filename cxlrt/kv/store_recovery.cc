// Recovery: a host that opens the store reopens its own partition as its
// previous incarnation left it. Finished puts stay, unfinished ones are
// dropped (their blocks went with the allocator's recovery), interrupted
// evictions are finished, and the old incarnation's pins are cleared.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::kv {

using kv_internal::kStateTombstone;
using kv_internal::Slot;

namespace {

// gen = epoch << kCounterBits | counter: unique per put across the
// incarnations of a host slot (each attach bumps the epoch).
constexpr int kCounterBits = 40;

}  // namespace

absl::Status Store::Impl::RecoverPartition() {
  std::lock_guard<std::mutex> lock(mu_);
  const StoreHeaderLayout& h = view_->h();
  const uint64_t epoch = membership_.epoch();
  next_gen_ = (epoch << kCounterBits) + 1;
  for (uint32_t ns = 0; ns < h.max_namespaces; ++ns) {
    counters_[ns] = view_->ReadCounters(me_, ns);
    counters_[ns].entries = counters_[ns].bytes = 0;  // recounted below
    hits_[ns] = counters_[ns].hits;
    misses_[ns] = counters_[ns].misses;
  }
  // Every slot as the previous incarnation left it. Sealed entries stay;
  // puts that never sealed are dropped (their blocks were private and went
  // with the allocator's recovery); interrupted evictions are finished.
  std::vector<std::pair<uint64_t, uint32_t>> live;  // (gen, index)
  uint32_t dropped = 0, finished = 0;
  for (uint32_t i = 0; i < h.entries_per_host; ++i) {
    EntryLayout e;
    const Slot s = view_->ReadEntry(me_, i, &e);
    const auto state = static_cast<EntryState>(e.state);
    if (s == Slot::kEmpty) continue;
    if (s == Slot::kVisible) {
      Local& l = local_[i];
      l = Local{e.state, false, e.ns, e.value_size, e.gen, e.key_hash, e.block};
      live.emplace_back(e.gen, i);
      continue;
    }
    if (state == EntryState::kTombstone) {
      local_[i].state = kStateTombstone;
      continue;
    }
    if (s == Slot::kEvicting) {
      // Its block is durable until FreeDurable stores the tombstone.
      absl::Status st = alloc_.FreeDurable(
          e.block, view_->EntryOff(me_, i) + offsetof(EntryLayout, state), kStateTombstone);
      if (!st.ok()) {
        CXLRT_LOG(kError) << "KV slot " << i << ": finishing its eviction: " << st;
      }
      ++finished;
    } else if (state == EntryState::kPut) {
      ++dropped;
    } else {
      CXLRT_LOG(kError) << "KV slot " << i << " of host " << me_ << " is corrupt (state " << e.state
                        << "); dropped";
    }
    Tombstone(i);
  }
  std::sort(live.begin(), live.end());
  for (auto [gen, i] : live) {
    order_->Insert(i, local_[i].hash);
    counters_[local_[i].ns].entries += 1;
    counters_[local_[i].ns].bytes += local_[i].size;
  }
  for (uint32_t ns = 0; ns < h.max_namespaces; ++ns) PublishCounters(ns);
  // Pins of the previous incarnation are void (its epoch is gone): clear them.
  PartitionHeaderLayout ph = c_.FetchObject<PartitionHeaderLayout>(view_->PartOff(me_));
  for (uint64_t k = 0; k < std::min<uint64_t>(ph.pins_high, h.pins_per_host); ++k) {
    static const PinLayout kZero = {};
    c_.PublishObject(view_->PinOff(me_, static_cast<uint32_t>(k)), kZero);
  }
  ph.pins_high = 0;
  ph.epoch = epoch;
  c_.PublishObject(view_->PartOff(me_), ph);
  {
    std::lock_guard<std::mutex> pl(pin_mu_);
    pins_high_ = 0;
    free_pins_.clear();
    for (uint32_t k = h.pins_per_host; k-- > 0;) free_pins_.push_back(k);
  }
  if (!live.empty() || dropped || finished) {
    CXLRT_LOG(kInfo) << "host " << me_ << " reopened its KV partition: " << live.size()
                     << " entries, " << dropped << " unfinished puts dropped, " << finished
                     << " evictions finished";
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::kv
