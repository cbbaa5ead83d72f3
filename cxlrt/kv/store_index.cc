// The index: the hash of a key, searching every host's partition for it
// (readers), and writing this host's own partition (its owner).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::kStateTombstone;
using kv_internal::Slot;

namespace {

uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t KeyHash(uint32_t ns, absl::string_view key) {
  uint64_t h = Mix(0x9e3779b97f4a7c15ull ^ ns ^ (uint64_t{key.size()} << 32));
  size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, key.data() + i, 8);
    h = Mix(h ^ w);
  }
  if (i < key.size()) {
    uint64_t w = 0;
    std::memcpy(&w, key.data() + i, key.size() - i);
    h = Mix(h ^ w ^ 0x5bd1e995ull);
  }
  return h;
}

// --- Searching ---

absl::StatusOr<std::optional<Store::Impl::Found>> Store::Impl::Search(uint32_t ns,
                                                                      absl::string_view key,
                                                                      uint64_t hash, uint32_t only,
                                                                      bool* evicting,
                                                                      uint32_t skip) {
  const StoreHeaderLayout& h = view_->h();
  std::optional<Found> leaving;  // a matching entry being evicted
  const uint32_t mask = h.entries_per_host - 1;
  uint32_t first = 0, end = partitions_seen_.load(std::memory_order_acquire);
  if (only != ~0u) first = only, end = only + 1;
  for (uint32_t p = first; p < end; ++p) {
    if (p == skip) continue;
    const uint32_t home = static_cast<uint32_t>(hash) & mask;
    for (uint32_t k = 0; k < h.probe_limit; ++k) {
      const uint32_t i = (home + k) & mask;
      Found f;
      const Slot s = view_->ReadEntry(p, i, &f.e);
      if (s == Slot::kEmpty) break;
      if (s == Slot::kInvisible || s == Slot::kTorn) continue;
      if (s == Slot::kEvicting && (!evicting || leaving)) continue;
      const EntryLayout& e = f.e;
      if (e.key_hash != hash || e.ns != ns || e.key_len != key.size()) continue;
      if (s == Slot::kCorrupt) {
        return absl::DataLossError(absl::StrCat("KV entry ", i, " of host ", p, " at 0x",
                                                absl::Hex(view_->EntryOff(p, i)),
                                                " names bytes outside the pool"));
      }
      const size_t inline_len = std::min<size_t>(key.size(), kInlineKeyBytes);
      if (std::memcmp(e.key, key.data(), inline_len) != 0) continue;
      if (key.size() > inline_len) {
        char rest[kMaxKeyBytes];
        c_.Fetch(rest, e.block + e.value_size, key.size() - inline_len);
        if (std::memcmp(rest, key.data() + inline_len, key.size() - inline_len) != 0) continue;
      }
      f.partition = p;
      f.index = i;
      if (s == Slot::kEvicting) {
        leaving = f;
        continue;
      }
      return std::optional<Found>(f);
    }
  }
  if (leaving) *evicting = true;
  return leaving;
}

absl::StatusOr<std::optional<Store::Impl::Found>> Store::Impl::SearchAll(
    uint32_t ns, absl::string_view key, uint64_t hash, bool* evicting, uint32_t skip) {
  CXLRT_ASSIGN_OR_RETURN(auto found, Search(ns, key, hash, ~0u, evicting, skip));
  if (found) return found;
  // A host that put for the first time since we last looked: widen.
  const uint32_t before = partitions_seen_.load(std::memory_order_acquire);
  uint32_t seen = 0;
  for (uint32_t p = 0; p < view_->h().hosts; ++p) {
    if (view_->PartitionEpoch(p) != 0) seen = p + 1;
  }
  if (seen <= before) return found;
  partitions_seen_.store(seen, std::memory_order_release);
  for (uint32_t p = before; p < seen; ++p) {
    if (p == skip) continue;
    CXLRT_ASSIGN_OR_RETURN(found, Search(ns, key, hash, p, evicting));
    if (found) return found;
  }
  return found;
}

absl::StatusOr<bool> Store::Impl::OwnEntryExists(uint32_t ns, absl::string_view key,
                                                 uint64_t hash) {
  // Every entry of this partition lies in its key's probe window; only a
  // slot whose hash and namespace match is read from the pool.
  const StoreHeaderLayout& h = view_->h();
  const uint32_t mask = h.entries_per_host - 1;
  const uint32_t home = static_cast<uint32_t>(hash) & mask;
  for (uint32_t k = 0; k < h.probe_limit; ++k) {
    const Local& l = local_[(home + k) & mask];
    if (l.hash != hash || l.ns != ns) continue;
    if (l.busy) return true;  // the same key (or its hash twin) is being put by another thread
    if (l.state != static_cast<uint64_t>(EntryState::kPut)) continue;
    CXLRT_ASSIGN_OR_RETURN(auto found, Search(ns, key, hash, me_));
    return found.has_value();
  }
  return false;
}

bool Store::Impl::SealIs(uint32_t partition, uint32_t index, uint64_t gen) {
  uint64_t seal = 0;
  c_.Fetch(&seal, view_->EntryOff(partition, index) + offsetof(EntryLayout, seal), 8);
  return seal == gen;
}

// --- Writing this host's partition ---

void Store::Impl::WriteEntry(uint32_t index, const EntryLayout& e) {
  c_.PublishObject(view_->EntryOff(me_, index), e);
}

void Store::Impl::WriteEntryHead(uint32_t index, const EntryLayout& e) {
  c_.Publish(view_->EntryOff(me_, index), &e, 64);
}

void Store::Impl::Tombstone(uint32_t index) {
  c_.Publish(view_->EntryOff(me_, index) + offsetof(EntryLayout, state), &kStateTombstone, 8);
  uint64_t zero = 0;
  c_.Publish(view_->EntryOff(me_, index) + offsetof(EntryLayout, seal), &zero, 8);
  local_[index] = Local{};
  local_[index].state = kStateTombstone;
}

}  // namespace cxlrt::kv
