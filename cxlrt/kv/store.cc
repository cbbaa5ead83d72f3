#include "cxlrt/kv/store.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/kv/internal/eviction.h"
#include "cxlrt/kv/internal/store_view.h"
#include "cxlrt/kv/internal/workers.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::kv {

using kv_internal::EntryChecksum;
using kv_internal::Slot;
using kv_internal::StoreView;

namespace {

// gen = epoch << kCounterBits | counter: unique per put across the
// incarnations of a host slot (each attach bumps the epoch).
constexpr int kCounterBits = 40;
constexpr uint64_t kStateTombstone = static_cast<uint64_t>(EntryState::kTombstone);
// Gets and lookups publish the reader counters every this many reads.
constexpr uint64_t kPublishEvery = 64;
// Batches of at least this many bytes are copied on several threads.
constexpr uint64_t kParallelMinBytes = 1 << 20;
// How long a batch waits for its GPU copies before it reports them failed.
constexpr absl::Duration kDeviceCopyDeadline = absl::Seconds(60);

uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

absl::Status CheckName(absl::string_view what, absl::string_view s, size_t max) {
  if (s.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " is empty"));
  if (s.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " is ", s.size(), " bytes (at most ", max, ")"));
  }
  return absl::OkStatus();
}

// A key or namespace for a message: escaped (absl::CHexEscape), cut at 48 bytes.
std::string Printable(absl::string_view s) {
  return absl::StrCat(absl::CHexEscape(s.substr(0, 48)), s.size() > 48 ? "..." : "");
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

// What the owner knows of each slot of its partition.
namespace {

// An item's parts: its own, or its one buffer as a single part.
absl::Span<const PutPart> PartsOf(const PutItem& it, PutPart* one) {
  if (!it.parts.empty()) return it.parts;
  *one = {it.data, it.size};
  return {one, 1};
}
absl::Span<const GetPart> PartsOf(const GetItem& it, GetPart* one) {
  if (!it.parts.empty()) return it.parts;
  *one = {it.dst, it.capacity};
  return {one, 1};
}

absl::Status CheckItem(absl::string_view key, bool has_buffer, size_t parts) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  if (has_buffer && parts > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", Printable(key), "' has both a buffer and ", parts, " parts; give one of them"));
  }
  return absl::OkStatus();
}
absl::Status CheckItem(const PutItem& it) {
  return CheckItem(it.key, it.data != nullptr || it.size != 0, it.parts.size());
}
absl::Status CheckItem(const GetItem& it) {
  return CheckItem(it.key, it.dst != nullptr || it.capacity != 0, it.parts.size());
}

// The copies that move one value: (dst, src, bytes) lists, as CopyBatch
// takes them. Empty copies are left out.
struct Copies {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  void Add(void* dst, const void* src, size_t n) {
    if (n == 0) return;
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(n);
  }
};

// The bytes of a value's parts.
template <typename Part>
size_t TotalOf(absl::Span<const Part> parts) {
  size_t n = 0;
  for (const Part& p : parts) n += p.size;
  return n;
}

// A value's parts into its block, in order.
Copies IntoBlock(uint8_t* block, absl::Span<const PutPart> parts) {
  Copies c;
  for (size_t at = 0; const PutPart& p : parts) {
    c.Add(block + at, p.data, p.size);
    at += p.size;
  }
  return c;
}

// A value of `size` bytes out of its block, cut along the parts (the last
// one it reaches may be left short).
Copies OutOfBlock(const uint8_t* block, size_t size, absl::Span<const GetPart> parts) {
  Copies c;
  for (size_t i = 0, at = 0; i < parts.size() && at < size; ++i) {
    const size_t n = std::min<size_t>(parts[i].size, size - at);
    c.Add(parts[i].data, block + at, n);
    at += n;
  }
  return c;
}

absl::Status MixedParts(absl::string_view key) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the parts of key '", Printable(key), "' are in both GPU and host memory; give one kind"));
}

}  // namespace

struct Store::Local {
  uint64_t state = 0;  // EntryState as in the pool
  bool busy = false;   // a put is copying into it
  uint32_t ns = 0;
  uint64_t size = 0;
  uint64_t gen = 0;
  uint64_t hash = 0;
  PoolOffset block = 0;
};

struct Store::Found {
  uint32_t partition = 0;
  uint32_t index = 0;
  EntryLayout e{};
};

Store::Store(allocator::Allocator& alloc, const StoreOptions& options)
    : alloc_(alloc),
      pool_(alloc.pool()),
      c_(alloc.pool().coherence()),
      membership_(alloc.membership()),
      options_(options),
      me_(alloc.slot()),
      workers_(std::make_unique<kv_internal::Workers>(options.copy_threads)) {}

Store::~Store() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!view_ || local_.empty()) return;
  for (uint32_t ns = 0; ns < counters_.size(); ++ns) {
    if (counters_[ns].puts || hits_[ns] || misses_[ns]) PublishCounters(ns);
  }
  // This process's pins end with it.
  std::lock_guard<std::mutex> pl(pin_mu_);
  for (uint64_t k = 0; k < pins_high_; ++k) {
    static const PinLayout kZero = {};
    c_.PublishObject(view_->PinOff(me_, static_cast<uint32_t>(k)), kZero);
  }
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(allocator::Allocator& alloc,
                                                   const StoreOptions& options) {
  if (options.pin_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("pin_lease must be positive");
  }
  if (options.copy_threads < 1 || options.copy_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_threads ", options.copy_threads, " is not in [1, 64]"));
  }
  std::unique_ptr<Store> s(new Store(alloc, options));
  CXLRT_RETURN_IF_ERROR(s->Init());
  return s;
}

// True when `v` is a store header that its creator never finished.
bool Unwritten(const absl::StatusOr<std::unique_ptr<StoreView>>& v) {
  return !v.ok() && v.status().code() == absl::StatusCode::kDataLoss &&
         absl::StrContains(v.status().message(), "not written");
}

absl::Status Store::ReclaimUnwrittenStore() {
  // A store whose header was never written belongs to its creator while it
  // lives; once its host is dead, fenced or gone, nothing will write it, and
  // the block is freed so that the next open makes the store afresh (it was
  // bricked for every later open before: issue 13, defect 6).
  auto found = alloc_.Find(kStoreRegionName);
  if (!found.ok()) return absl::OkStatus();  // freed meanwhile
  auto host = membership_.Host(found->owner_host);
  const bool creator_gone = host.ok() && (host->liveness == runtime::Liveness::kDead ||
                                          host->liveness == runtime::Liveness::kFenced ||
                                          host->liveness == runtime::Liveness::kFree);
  if (!creator_gone) return absl::OkStatus();
  CXLRT_LOG(kWarning) << "the KV store of " << pool_.name() << " was never written by host slot "
                      << found->owner_host << ", which is " << runtime::LivenessName(host->liveness)
                      << ": freeing it";
  absl::Status s = alloc_.FreeNamed(kStoreRegionName);
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Status Store::MakeStore() {
  CXLRT_ASSIGN_OR_RETURN(StoreHeaderLayout h, kv_internal::PlanStore(options_, pool_.host_slots()));
  allocator::AllocOptions ao;
  ao.alignment = 4096;
  auto off = alloc_.AllocateNamed(kStoreRegionName, h.store_bytes, ao);
  if (!off.ok()) {
    // Another host made it first: open theirs.
    return off.status().code() == absl::StatusCode::kAlreadyExists ? absl::OkStatus()
                                                                   : off.status();
  }
  // Zero the tables (header line first, so nobody reads an old store's
  // header here), then publish the header: its checksum makes it whole.
  static const uint8_t kZeros[64 << 10] = {};
  c_.CopyToPool(*off, kZeros, sizeof(StoreHeaderLayout));
  for (uint64_t done = 0; done < h.store_bytes; done += sizeof(kZeros)) {
    c_.CopyToPool(*off + done, kZeros, std::min<uint64_t>(sizeof(kZeros), h.store_bytes - done));
  }
  CXLRT_FAULT_POINT("kv.create.zeroed");
  c_.PublishObject(*off, h);
  CXLRT_LOG(kInfo) << "host " << me_ << " made the KV store of " << pool_.name() << " (" << h.hosts
                   << " hosts x " << h.entries_per_host << " entries, " << h.store_bytes
                   << " bytes)";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StoreView>> Store::OpenView() {
  // One deadline for the whole open, however often a creator dies on us:
  // a store another host is making is waited for; one whose creator died
  // unwritten is freed and made again.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    auto view = StoreView::Open(pool_);
    if (Unwritten(view)) {
      if (absl::Now() >= deadline) return view;
      CXLRT_RETURN_IF_ERROR(ReclaimUnwrittenStore());
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    if (view.ok() || view.status().code() != absl::StatusCode::kNotFound || !options_.create) {
      return view;
    }
    CXLRT_RETURN_IF_ERROR(MakeStore());
  }
}

absl::Status Store::Init() {
  auto view = OpenView();
  if (!view.ok()) return view.status();
  view_ = std::move(*view);
  const StoreHeaderLayout& h = view_->h();
  if (me_ >= h.hosts) {
    return absl::FailedPreconditionError(
        absl::StrCat("host slot ", me_, " has no partition in the KV store of ", pool_.name(),
                     ", which was made for host slots 0..", h.hosts - 1));
  }
  local_.resize(h.entries_per_host);
  order_ = std::make_unique<kv_internal::EvictionOrder>(options_.policy == EvictionPolicy::kLru
                                                            ? kv_internal::Policy::kLru
                                                            : kv_internal::Policy::kS3Fifo,
                                                        h.entries_per_host);
  counters_.assign(h.max_namespaces, NsCountersLayout{});
  hits_ = std::make_unique<std::atomic<uint64_t>[]>(h.max_namespaces);
  misses_ = std::make_unique<std::atomic<uint64_t>[]>(h.max_namespaces);
  {
    std::lock_guard<std::mutex> lock(ns_mu_);
    CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
  }
  CXLRT_RETURN_IF_ERROR(RecoverPartition());
  uint32_t seen = 0;
  for (uint32_t p = 0; p < h.hosts; ++p) {
    if (view_->PartitionEpoch(p) != 0) seen = p + 1;
  }
  partitions_seen_.store(seen, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status Store::RecoverPartition() {
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

// --- Namespaces ---

absl::Status Store::RefreshNamespaces() {
  const uint32_t n = view_->h().max_namespaces;
  ns_names_.resize(n);
  for (uint32_t id = 0; id < n; ++id) {
    if (!ns_names_[id].empty()) continue;  // names never change
    CXLRT_ASSIGN_OR_RETURN(auto rec, view_->ReadNamespace(id));
    if (!rec) continue;
    ns_names_[id].assign(reinterpret_cast<const char*>(rec->name), rec->name_len);
    ns_ids_[ns_names_[id]] = id;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Store::NamespaceId(absl::string_view ns, bool create) {
  CXLRT_RETURN_IF_ERROR(CheckName("namespace", ns, kMaxNamespaceBytes));
  std::lock_guard<std::mutex> lock(ns_mu_);
  auto it = ns_ids_.find(ns);
  if (it != ns_ids_.end()) return it->second;
  CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
  it = ns_ids_.find(ns);
  if (it != ns_ids_.end()) return it->second;
  if (!create) {
    return absl::NotFoundError(absl::StrCat("namespace '", Printable(ns), "' has no entries"));
  }
  CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
    if (ns_ids_.contains(ns)) return absl::OkStatus();  // another host made it
    for (uint32_t id = 0; id < ns_names_.size(); ++id) {
      if (!ns_names_[id].empty()) continue;
      NamespaceLayout rec = {};
      rec.used = 1;
      rec.name_len = static_cast<uint16_t>(ns.size());
      std::memcpy(rec.name, ns.data(), ns.size());
      rec.checksum = kv_internal::NamespaceChecksum(rec);
      c_.PublishObject(view_->NsOff(id), rec);
      ns_names_[id] = std::string(ns);
      ns_ids_[ns_names_[id]] = id;
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat("the KV store has all ", ns_names_.size(),
                                                     " namespaces in use; '", Printable(ns),
                                                     "' cannot be added"));
  }));
  return ns_ids_.find(ns)->second;
}

uint64_t Store::QuotaOf(uint32_t ns) {
  // One aligned 8-byte field: read alone, it cannot be torn (the record's
  // CRC was checked when the namespace was first read).
  uint64_t quota = 0;
  c_.Fetch(&quota, view_->NsOff(ns) + offsetof(NamespaceLayout, quota), 8);
  return quota;
}

absl::Status Store::SetQuota(absl::string_view ns, uint64_t bytes) {
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, true));
  return membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_ASSIGN_OR_RETURN(auto rec, view_->ReadNamespace(id));
    if (!rec) return absl::DataLossError("a registered namespace record is gone");
    rec->quota = bytes;
    rec->checksum = kv_internal::NamespaceChecksum(*rec);
    c_.PublishObject(view_->NsOff(id), *rec);
    return absl::OkStatus();
  });
}

uint64_t Store::NsBytesElsewhere(uint32_t ns) {
  uint64_t total = 0;
  const uint32_t seen = partitions_seen_.load(std::memory_order_relaxed);
  for (uint32_t p = 0; p < std::max(seen, me_ + 1); ++p) {
    if (p != me_) total += view_->ReadCounters(p, ns).bytes;
  }
  return total;
}

// --- Searching ---

absl::StatusOr<std::optional<Store::Found>> Store::Search(uint32_t ns, absl::string_view key,
                                                          uint64_t hash, uint32_t only,
                                                          bool* evicting, uint32_t skip) {
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

absl::StatusOr<std::optional<Store::Found>> Store::SearchAll(uint32_t ns, absl::string_view key,
                                                             uint64_t hash, bool* evicting,
                                                             uint32_t skip) {
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

absl::StatusOr<bool> Store::OwnEntryExists(uint32_t ns, absl::string_view key, uint64_t hash) {
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

bool Store::SealIs(uint32_t partition, uint32_t index, uint64_t gen) {
  uint64_t seal = 0;
  c_.Fetch(&seal, view_->EntryOff(partition, index) + offsetof(EntryLayout, seal), 8);
  return seal == gen;
}

// --- Put ---

absl::Status Store::Put(absl::string_view ns, absl::string_view key, const void* data,
                        size_t size) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, true));
  if (gpu::KindOf(data) == runtime::MemoryKind::kGpu) {
    return DeviceBatchPut(id, ns, {PutItem{key, data, size, {}}}, {runtime::MemoryKind::kGpu},
                          {})[0];
  }
  const PutPart part{data, size};
  return PutOne(id, ns, key, {&part, 1});
}

std::vector<absl::Status> Store::BatchPut(absl::string_view ns, absl::Span<const PutItem> items,
                                          const BatchOptions& options) {
  std::vector<absl::Status> out(items.size());
  auto id = NamespaceId(ns, true);
  std::vector<absl::Status> refused;
  if (auto kinds = ItemKinds(items, options.memory, &refused); id.ok() && !kinds.empty()) {
    return DeviceBatchPut(*id, ns, items, kinds, refused, options.stream);
  }
  uint64_t bytes = 0;
  for (const PutItem& it : items) {
    bytes += it.size;
    for (const PutPart& p : it.parts) bytes += p.size;
  }
  ForEachItem(items.size(), bytes, [&](size_t i) {
    const PutItem& it = items[i];
    if (!id.ok()) {
      out[i] = id.status();
      return;
    }
    absl::Status st = CheckItem(it);
    PutPart one;
    out[i] = st.ok() ? PutOne(*id, ns, it.key, PartsOf(it, &one)) : st;
  });
  return out;
}

void Store::ForEachItem(size_t n, uint64_t bytes, const std::function<void(size_t)>& fn) {
  if (bytes >= kParallelMinBytes && n > 1) {
    workers_->Run(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i);
  }
}

absl::Status Store::PutOne(uint32_t ns, absl::string_view ns_name, absl::string_view key,
                           absl::Span<const PutPart> parts) {
  const size_t size = TotalOf(parts);
  CXLRT_ASSIGN_OR_RETURN(const Reserved r, Reserve(ns, ns_name, key, size));
  PoolOffset at = r.block;
  for (const PutPart& p : parts) {
    if (p.size > 0) c_.CopyToPool(at, p.data, p.size);
    at += p.size;
  }
  return Seal(ns, key, r, size);
}

absl::StatusOr<Store::Reserved> Store::Reserve(uint32_t ns, absl::string_view ns_name,
                                               absl::string_view key, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("a value of 0 bytes");
  const uint64_t quota = QuotaOf(ns);
  if (quota != 0 && size > quota) {
    return absl::InvalidArgumentError(absl::StrCat("a value of ", size,
                                                   " bytes exceeds the quota of namespace '",
                                                   Printable(ns_name), "' (", quota, " bytes)"));
  }
  const uint64_t hash = KeyHash(ns, key);
  auto exists = [&](uint32_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_[ns].put_exists;
    PublishCounters(ns);
    return absl::AlreadyExistsError(
        absl::StrCat("key '", Printable(key), "' of namespace '", Printable(ns_name),
                     "' is already in the store (put by host ", owner, ")"));
  };
  // The first writer wins: exact within this host (checked again under the
  // lock), best effort across hosts (two hosts putting one key at the same
  // moment may both succeed; readers then find the lower host's).
  // Other hosts' partitions here; this host's own under the lock, from
  // what it knows of its partition.
  CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(ns, key, hash, nullptr, me_));
  if (found) return exists(found->partition);

  const StoreHeaderLayout& h = view_->h();
  const uint32_t mask = h.entries_per_host - 1;
  const uint64_t block_bytes = BlockBytes(size, static_cast<uint32_t>(key.size()));
  uint32_t index = 0;
  PoolOffset block = 0;
  uint64_t gen = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    CXLRT_ASSIGN_OR_RETURN(const bool mine, OwnEntryExists(ns, key, hash));
    if (mine) {
      lock.unlock();
      return exists(me_);
    }
    const uint32_t home = static_cast<uint32_t>(hash) & mask;
    std::vector<uint32_t> window;
    for (uint32_t k = 0; k < h.probe_limit; ++k) window.push_back((home + k) & mask);
    // Quota: evict this host's entries of the namespace to make room.
    if (quota != 0) {
      const uint64_t total = counters_[ns].bytes + NsBytesElsewhere(ns);
      if (total + size > quota) {
        Evict(total + size - quota, 0, [&](uint32_t i) { return local_[i].ns == ns; });
        if (counters_[ns].bytes + NsBytesElsewhere(ns) + size > quota) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "namespace '", Printable(ns_name), "' is at its quota of ", quota,
              " bytes and this host has no more of its entries it may evict (pinned, or held by "
              "other hosts)"));
        }
      }
    }
    // An index slot in the key's probe window.
    int64_t slot = -1;
    for (uint32_t i : window) {
      if (!local_[i].busy && local_[i].state != static_cast<uint64_t>(EntryState::kPut)) {
        slot = i;
        break;
      }
    }
    if (slot < 0) {
      const int64_t v = order_->OldestOf(window);
      if (v >= 0) {
        order_->Remove(static_cast<uint32_t>(v));
        if (!EvictSlots({static_cast<uint32_t>(v)}).empty()) slot = v;
      }
      if (slot < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the index of host ", me_, " has no free slot near this key's (", h.probe_limit,
            " slots from ", home, " are in use or pinned); the store has ", h.entries_per_host,
            " entries per host"));
      }
    }
    index = static_cast<uint32_t>(slot);
    // The block: when the pool is full, evict a batch of this host's
    // entries (a thirty-second of its bytes at least) and try again.
    for (;;) {
      auto b = alloc_.Allocate(block_bytes);
      if (b.ok()) {
        block = *b;
        break;
      }
      if (b.status().code() != absl::StatusCode::kResourceExhausted) return b.status();
      uint64_t mine = 0;
      for (const auto& k : counters_) mine += k.bytes;
      const Evicted ev =
          Evict(std::max<uint64_t>(block_bytes, mine / 32), 0, [](uint32_t) { return true; });
      if (ev.entries == 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("no room in ", pool_.name(), " for a value of ", size, " bytes, and host ",
                         me_, " has no entry it may evict (", b.status().message(), ")"));
      }
    }
    gen = next_gen_++;
    Local& l = local_[index];
    l = Local{static_cast<uint64_t>(EntryState::kPut), true, ns, size, gen, hash, block};
    EntryLayout e = {};
    e.state = static_cast<uint64_t>(EntryState::kPut);
    e.gen = gen;
    e.block = block;
    e.key_hash = hash;
    e.value_size = size;
    e.ns = ns;
    e.key_len = static_cast<uint16_t>(key.size());
    std::memcpy(e.key, key.data(), std::min<size_t>(key.size(), kInlineKeyBytes));
    e.checksum = EntryChecksum(e);
    WriteEntry(index, e);  // unsealed: invisible, and dropped by recovery
  }
  // The copy runs without the lock: other threads put and get meanwhile.
  return Reserved{index, block, gen, hash};
}

void Store::Abandon(const Reserved& r) {
  std::lock_guard<std::mutex> lock(mu_);
  local_[r.index].busy = false;
  (void)alloc_.Free(r.block);
  Tombstone(r.index);
}

absl::Status Store::Seal(uint32_t ns, absl::string_view key, const Reserved& r, size_t size) {
  const auto [index, block, gen, hash] = r;
  if (key.size() > kInlineKeyBytes) {
    c_.Publish(block + size, key.data() + kInlineKeyBytes, key.size() - kInlineKeyBytes);
  }
  CXLRT_FAULT_POINT("kv.put.copied");
  // The commit point: the block turns durable and the seal is stored, as
  // one step across crashes.
  absl::Status st =
      alloc_.CommitDurable(block, view_->EntryOff(me_, index) + offsetof(EntryLayout, seal), gen);
  std::lock_guard<std::mutex> lock(mu_);
  Local& l = local_[index];
  l.busy = false;
  if (!st.ok()) {
    (void)alloc_.Free(block);
    Tombstone(index);
    return st;
  }
  order_->Insert(index, hash);
  NsCountersLayout& k = counters_[ns];
  k.entries += 1;
  k.bytes += size;
  k.puts += 1;
  PublishCounters(ns);
  if (partitions_seen_.load(std::memory_order_relaxed) <= me_) {
    uint32_t seen = partitions_seen_.load();
    while (seen <= me_ && !partitions_seen_.compare_exchange_weak(seen, me_ + 1)) {
    }
  }
  return absl::OkStatus();
}

// --- Get ---

absl::StatusOr<size_t> Store::Get(absl::string_view ns, absl::string_view key, void* dst,
                                  size_t capacity) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  auto id = NamespaceId(ns, false);
  if (!id.ok()) return id.status();
  if (gpu::KindOf(dst) == runtime::MemoryKind::kGpu) {
    return DeviceBatchGet(*id, {GetItem{key, dst, capacity, {}}}, {runtime::MemoryKind::kGpu},
                          {})[0];
  }
  const GetPart part{dst, capacity};
  return GetOne(*id, key, {&part, 1}, /*exact=*/false);
}

std::vector<absl::StatusOr<size_t>> Store::BatchGet(absl::string_view ns,
                                                    absl::Span<const GetItem> items,
                                                    const BatchOptions& options) {
  std::vector<absl::StatusOr<size_t>> out(items.size(), absl::UnknownError("not run"));
  auto id = NamespaceId(ns, false);
  std::vector<absl::Status> refused;
  if (auto kinds = ItemKinds(items, options.memory, &refused); id.ok() && !kinds.empty()) {
    return DeviceBatchGet(*id, items, kinds, refused, options.stream);
  }
  uint64_t bytes = 0;
  for (const GetItem& it : items) {
    bytes += it.capacity;
    for (const GetPart& p : it.parts) bytes += p.size;
  }
  ForEachItem(items.size(), bytes, [&](size_t i) {
    const GetItem& it = items[i];
    if (!id.ok()) {
      out[i] = id.status();
      return;
    }
    absl::Status st = CheckItem(it);
    GetPart one;
    out[i] = st.ok() ? GetOne(*id, it.key, PartsOf(it, &one), !it.parts.empty())
                     : absl::StatusOr<size_t>(st);
  });
  return out;
}

absl::StatusOr<size_t> Store::GetOne(uint32_t ns, absl::string_view key,
                                     absl::Span<const GetPart> parts, bool exact,
                                     gpu::DmaEngine* dev) {
  const size_t capacity = TotalOf(parts);
  const uint64_t hash = KeyHash(ns, key);
  // A get that races an eviction sees the seal change and looks again; a
  // key evicted for good is then not found.
  int waits = 0;  // evictions waited out (each one put the entry back)
  for (int attempt = 0; attempt < 4; ++attempt) {
    bool evicting = false;
    CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(ns, key, hash, &evicting));
    if (!found) break;
    const EntryLayout& e = found->e;
    if (evicting) {
      // Its owner is evicting it, and puts it back if a reader has it
      // pinned (this host may be that reader). Either happens within
      // microseconds; wait for it, within a deadline (an owner that dies
      // meanwhile leaves the entry unsealed: not found).
      const PoolOffset head = view_->EntryOff(found->partition, found->index);
      uint64_t line[2];
      absl::Status waited = runtime::WaitUntil(
          [&] {
            c_.Fetch(line, head, sizeof(line));  // seal, state
            return line[0] == e.gen || line[1] != static_cast<uint64_t>(EntryState::kEvicting);
          },
          absl::Now() + absl::Milliseconds(50), "a KV entry being evicted", nullptr,
          absl::Milliseconds(50));
      if (!waited.ok() || line[0] != e.gen) break;
      if (++waits < 16) --attempt;  // put back: read it again
      continue;
    }
    if (exact && e.value_size != capacity) {
      return absl::InvalidArgumentError(absl::StrCat("the value of key '", Printable(key), "' is ",
                                                     e.value_size, " bytes; its ", parts.size(),
                                                     " parts hold ", capacity));
    }
    if (e.value_size > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("the value of key '", Printable(key), "' is ",
                                                     e.value_size, " bytes; the destination holds ",
                                                     capacity));
    }
    const uint8_t* base = pool_.backend().base();
    const Copies c = OutOfBlock(base + e.block, e.value_size, parts);
    if (dev) {
      // A DMA read returns this host's cached copy of a line when it has
      // one: drop the lines first, as CopyFromPool does.
      c_.Invalidate(e.block, e.value_size);
      const auto t = dev->CopyBatch(/*to_pool=*/false, c.dsts.data(), c.srcs.data(), c.sizes.data(),
                                    c.dsts.size());
      CXLRT_RETURN_IF_ERROR(dev->Wait(t, absl::Now() + kDeviceCopyDeadline));
    } else {
      for (size_t i = 0; i < c.dsts.size(); ++i) {
        c_.CopyFromPoolStreaming(c.dsts[i], static_cast<const uint8_t*>(c.srcs[i]) - base,
                                 c.sizes[i]);
      }
    }
    // Loads of the value before the seal's: x86 keeps loads in order; the
    // fence keeps the compiler from moving them.
    std::atomic_thread_fence(std::memory_order_acquire);
    if (!SealIs(found->partition, found->index, e.gen)) continue;  // evicted meanwhile
    CountHit(ns, found->partition, found->index, e.gen);
    return static_cast<size_t>(e.value_size);
  }
  Count(misses_.get(), ns);
  return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
}

void Store::Count(std::atomic<uint64_t>* counter, uint32_t ns) {
  counter[ns].fetch_add(1, std::memory_order_relaxed);
  if (reads_.fetch_add(1, std::memory_order_relaxed) % kPublishEvery == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    PublishCounters(ns);
  }
}

void Store::CountHit(uint32_t ns, uint32_t partition, uint32_t index, uint64_t gen) {
  Count(hits_.get(), ns);
  if (partition == me_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (local_[index].gen == gen) order_->Touch(index);
  }
}

// --- GPU memory ---

template <typename Item>
std::vector<runtime::MemoryKind> Store::ItemKinds(absl::Span<const Item> items,
                                                  std::optional<runtime::MemoryKind> told,
                                                  std::vector<absl::Status>* refused) {
  using runtime::MemoryKind;
  const bool devices = gpu::GpuAvailable();
  if (!devices && told != MemoryKind::kGpu) return {};  // every pointer is host memory
  std::vector<MemoryKind> kinds(items.size(), MemoryKind::kHost);
  refused->assign(items.size(), absl::OkStatus());
  bool device_path = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    auto part = [&](size_t j) -> const void* {
      if (!it.parts.empty()) return it.parts[j].data;
      if constexpr (std::is_same_v<Item, PutItem>) {
        return it.data;
      } else {
        return it.dst;
      }
    };
    const size_t n = it.parts.empty() ? 1 : it.parts.size();
    if (told.has_value()) {
      kinds[i] = *told;
      if (devices && gpu::KindOf(part(0)) != kinds[i]) {
        (*refused)[i] = absl::InvalidArgumentError(absl::StrCat(
            "key '", Printable(it.key), "' was said to be in ",
            kinds[i] == MemoryKind::kGpu ? "GPU" : "host", " memory, but its first part is not"));
      }
    } else if (devices) {
      kinds[i] = gpu::KindOf(part(0));
      for (size_t j = 1; j < n && (*refused)[i].ok(); ++j) {
        if (gpu::KindOf(part(j)) != kinds[i]) (*refused)[i] = MixedParts(it.key);
      }
    }
    device_path = device_path || kinds[i] == MemoryKind::kGpu || !(*refused)[i].ok();
  }
  if (!device_path) kinds.clear();
  return kinds;
}

absl::StatusOr<gpu::DmaEngine*> Store::Device(void* stream) {
  if (!device_) {
    CXLRT_ASSIGN_OR_RETURN(device_, gpu::MakeDmaEngine(c_, pool_.backend().base(), pool_.size()));
  }
  CXLRT_RETURN_IF_ERROR(device_->StartAfter(stream));
  return device_.get();
}

namespace {

// Device copies of a batch go out in groups of about this many bytes: one
// submission each (CopyBatch), a few in flight, so that the GPU's copy
// engine is busy while the CPU seals (or checks) the group before.
constexpr uint64_t kGroupBytes = 8 << 20;
constexpr size_t kGroupsInFlight = 3;

// A batch's device copies, in groups: Add queues an item's copy, a full
// group goes out as one CopyBatch, and `done(items, status)` runs for each
// group, in order, once its copies completed (or failed). Flush sends the
// last group and waits for all.
template <typename T>
class CopyGroups {
 public:
  using Done = std::function<void(const std::vector<T>&, const absl::Status&)>;
  CopyGroups(gpu::DmaEngine& engine, bool to_pool, Done done)
      : engine_(engine), to_pool_(to_pool), done_(std::move(done)) {}

  // An item and its copies (its value's parts), all in one group: the item
  // is done when they all are.
  void Add(T item, const Copies& c) {
    open_.items.push_back(std::move(item));
    for (size_t i = 0; i < c.dsts.size(); ++i) {
      open_.copies.Add(c.dsts[i], c.srcs[i], c.sizes[i]);
      open_.bytes += c.sizes[i];
    }
    if (open_.bytes >= kGroupBytes) Submit();
  }
  void Flush() {
    Submit();
    while (!flying_.empty()) FinishOne();
  }

 private:
  struct Group {
    std::vector<T> items;
    Copies copies;
    uint64_t bytes = 0;
    gpu::DmaEngine::Ticket ticket = 0;
  };
  void Submit() {
    if (open_.items.empty()) return;
    const Copies& c = open_.copies;
    open_.ticket =
        engine_.CopyBatch(to_pool_, c.dsts.data(), c.srcs.data(), c.sizes.data(), c.sizes.size());
    flying_.push_back(std::move(open_));
    open_ = {};
    if (flying_.size() >= kGroupsInFlight) FinishOne();
  }
  void FinishOne() {
    const absl::Status st = engine_.Wait(flying_.front().ticket, absl::Now() + kDeviceCopyDeadline);
    std::atomic_thread_fence(std::memory_order_acquire);  // the seals after the bytes
    done_(flying_.front().items, st);
    flying_.pop_front();
  }

  gpu::DmaEngine& engine_;
  const bool to_pool_;
  const Done done_;
  Group open_;
  std::deque<Group> flying_;
};

}  // namespace

// Every item is reserved, its copy submitted with its group's, and sealed
// once its group's copies completed; the GPU's copy engine never waits for
// the protocol. Items in host memory are put by the CPU as in BatchPut.
std::vector<absl::Status> Store::DeviceBatchPut(uint32_t ns, absl::string_view ns_name,
                                                absl::Span<const PutItem> items,
                                                const std::vector<runtime::MemoryKind>& kinds,
                                                const std::vector<absl::Status>& refused,
                                                void* stream) {
  std::vector<absl::Status> out(items.size());
  std::lock_guard<std::mutex> lock(device_mu_);
  auto dev = Device(stream);
  struct Pending {
    size_t item;
    Reserved r;
    size_t size;
  };
  std::optional<CopyGroups<Pending>> g;
  if (dev.ok()) {
    g.emplace(**dev, /*to_pool=*/true,
              [&](const std::vector<Pending>& done, const absl::Status& st) {
                for (const Pending& p : done) {
                  if (!st.ok()) {
                    Abandon(p.r);
                    out[p.item] =
                        absl::Status(st.code(), absl::StrCat("copying the value of key '",
                                                             Printable(items[p.item].key),
                                                             "' from GPU memory: ", st.message()));
                  } else {
                    out[p.item] = Seal(ns, items[p.item].key, p.r, p.size);
                  }
                }
              });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const PutItem& it = items[i];
    if (absl::Status st = CheckItem(it); !st.ok()) {
      out[i] = st;
      continue;
    }
    if (!refused.empty() && !refused[i].ok()) {
      out[i] = refused[i];
      continue;
    }
    PutPart one;
    const absl::Span<const PutPart> parts = PartsOf(it, &one);
    if (kinds[i] != runtime::MemoryKind::kGpu) {
      out[i] = PutOne(ns, ns_name, it.key, parts);
      continue;
    }
    if (!dev.ok()) {
      out[i] = dev.status();
      continue;
    }
    const size_t size = TotalOf(parts);
    auto r = Reserve(ns, ns_name, it.key, size);
    if (!r.ok()) {
      out[i] = r.status();
      continue;
    }
    g->Add({i, *r, size}, IntoBlock(pool_.backend().base() + r->block, parts));
  }
  if (g) g->Flush();
  return out;
}

// Every item is found and its copy submitted with its group's; once the
// group's copies are done, each item's seal is checked again. An item
// whose entry changed meanwhile (evicted, its block reused), a miss, or an
// entry being evicted is read on its own, as Get does.
std::vector<absl::StatusOr<size_t>> Store::DeviceBatchGet(
    uint32_t ns, absl::Span<const GetItem> items, const std::vector<runtime::MemoryKind>& kinds,
    const std::vector<absl::Status>& refused, void* stream) {
  std::vector<absl::StatusOr<size_t>> out(items.size(), absl::UnknownError("not run"));
  std::lock_guard<std::mutex> lock(device_mu_);
  auto dev = Device(stream);
  struct Pending {
    size_t item;
    uint32_t partition, index;
    uint64_t gen, size;
  };
  std::vector<size_t> again;  // items read on their own
  std::optional<CopyGroups<Pending>> g;
  if (dev.ok()) {
    g.emplace(**dev, /*to_pool=*/false,
              [&](const std::vector<Pending>& done, const absl::Status& st) {
                for (const Pending& p : done) {
                  if (!st.ok()) {
                    out[p.item] =
                        absl::Status(st.code(), absl::StrCat("copying the value of key '",
                                                             Printable(items[p.item].key),
                                                             "' to GPU memory: ", st.message()));
                  } else if (!SealIs(p.partition, p.index, p.gen)) {
                    again.push_back(p.item);
                  } else {
                    CountHit(ns, p.partition, p.index, p.gen);
                    out[p.item] = static_cast<size_t>(p.size);
                  }
                }
              });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const GetItem& it = items[i];
    if (absl::Status st = CheckItem(it); !st.ok()) {
      out[i] = st;
      continue;
    }
    if (!refused.empty() && !refused[i].ok()) {
      out[i] = refused[i];
      continue;
    }
    GetPart one;
    const absl::Span<const GetPart> parts = PartsOf(it, &one);
    const bool exact = !it.parts.empty();
    if (kinds[i] != runtime::MemoryKind::kGpu) {
      out[i] = GetOne(ns, it.key, parts, exact);
      continue;
    }
    if (!dev.ok()) {
      out[i] = dev.status();
      continue;
    }
    const size_t capacity = TotalOf(parts);
    bool evicting = false;
    auto found = SearchAll(ns, it.key, KeyHash(ns, it.key), &evicting);
    if (!found.ok() || !*found || evicting || (*found)->e.value_size > capacity ||
        (exact && (*found)->e.value_size != capacity)) {
      again.push_back(i);  // GetOne says why, or waits out the eviction
      continue;
    }
    const EntryLayout& e = (*found)->e;
    // A DMA read returns this host's cached copy of a line when it has
    // one: drop the lines first, as CopyFromPool does.
    c_.Invalidate(e.block, e.value_size);
    g->Add({i, (*found)->partition, (*found)->index, e.gen, e.value_size},
           OutOfBlock(pool_.backend().base() + e.block, e.value_size, parts));
  }
  if (g) g->Flush();
  for (size_t i : again) {
    GetPart one;
    out[i] = GetOne(ns, items[i].key, PartsOf(items[i], &one), !items[i].parts.empty(), *dev);
  }
  return out;
}

absl::StatusOr<uint64_t> Store::ValueSize(absl::string_view ns, absl::string_view key) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, false));
  CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(id, key, KeyHash(id, key)));
  if (!found)
    return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
  return found->e.value_size;
}

absl::StatusOr<bool> Store::Contains(absl::string_view ns, absl::string_view key) {
  auto size = ValueSize(ns, key);
  if (size.ok()) return true;
  if (size.status().code() == absl::StatusCode::kNotFound) return false;
  return size.status();
}

// --- Lookup and pins ---

absl::StatusOr<size_t> Store::Lookup(absl::string_view ns, absl::Span<const std::string> chain,
                                     PinSet* pins) {
  for (const std::string& key : chain) CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  auto id = NamespaceId(ns, false);
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kNotFound) return 0;
    return id.status();
  }
  // The lease in this host's own heartbeats, counted from its heartbeat
  // word as others read it (the first word of its owner line).
  const uint64_t beat_ms =
      std::max<int64_t>(absl::ToInt64Milliseconds(membership_.heartbeat_period()), 1);
  PinLayout pin = {};
  pin.epoch = membership_.epoch();
  pin.expires_beat = c_.LoadFlag(pool_.OwnerLineOffset(me_)) +
                     absl::ToInt64Milliseconds(options_.pin_lease) / beat_ms + 1;
  size_t n = 0;
  for (const std::string& key : chain) {
    CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(*id, key, KeyHash(*id, key)));
    if (!found) break;
    uint32_t rec = 0;
    {
      std::lock_guard<std::mutex> lock(pin_mu_);
      if (free_pins_.empty()) {
        CXLRT_LOG(kWarning) << "KV pin table of host " << me_ << " is full ("
                            << view_->h().pins_per_host << "): a lookup stops at " << n << " keys";
        break;
      }
      rec = free_pins_.back();
      free_pins_.pop_back();
      if (rec >= pins_high_) {
        pins_high_ = rec + 1;
        c_.Publish(view_->PartOff(me_) + offsetof(PartitionHeaderLayout, pins_high), &pins_high_,
                   8);
      }
    }
    pin.partition = found->partition;
    pin.index = found->index;
    pin.gen = found->e.gen;
    // Pin, then check the entry is still sealed: an owner unseals before it
    // reads pins, so either it sees this pin or this check sees the unseal.
    c_.PublishObject(view_->PinOff(me_, rec), pin);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!SealIs(found->partition, found->index, found->e.gen)) {
      static const PinLayout kZero = {};
      c_.PublishObject(view_->PinOff(me_, rec), kZero);
      std::lock_guard<std::mutex> lock(pin_mu_);
      free_pins_.push_back(rec);
      break;
    }
    pins->records_.push_back(rec);
    ++n;
    if (found->partition == me_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (local_[found->index].gen == found->e.gen) order_->Touch(found->index);
    }
  }
  hits_[*id].fetch_add(n, std::memory_order_relaxed);
  if (n < chain.size()) misses_[*id].fetch_add(1, std::memory_order_relaxed);
  if (reads_.fetch_add(1, std::memory_order_relaxed) % kPublishEvery == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    PublishCounters(*id);
  }
  return n;
}

void Store::Release(PinSet& pins) {
  static const PinLayout kZero = {};
  for (uint32_t rec : pins.records_) c_.PublishObject(view_->PinOff(me_, rec), kZero);
  std::lock_guard<std::mutex> lock(pin_mu_);
  free_pins_.insert(free_pins_.end(), pins.records_.begin(), pins.records_.end());
  pins.records_.clear();
}

std::vector<std::pair<uint32_t, uint64_t>> Store::PinnedHere() {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  const StoreHeaderLayout& h = view_->h();
  std::vector<PinLayout> pins;
  for (uint32_t p = 0; p < h.hosts; ++p) {
    uint64_t high = 0;
    c_.Fetch(&high, view_->PartOff(p) + offsetof(PartitionHeaderLayout, pins_high), 8);
    high = std::min<uint64_t>(high, h.pins_per_host);
    if (high == 0) continue;  // this host never pinned: no host record to read
    auto v = membership_.Host(p);
    if (v.ok() && v->liveness != runtime::Liveness::kAlive &&
        v->liveness != runtime::Liveness::kSelf) {
      continue;  // a dead host's pins have expired
    }
    if (!v.ok()) {
      // Without its host record no pin of it can be judged expired: treat
      // them all as live (never evict a pinned entry).
      CXLRT_LOG(kWarning) << "KV eviction cannot read host " << p << ": " << v.status();
    }
    pins.resize(high);
    c_.Fetch(pins.data(), view_->PinOff(p, 0), high * sizeof(PinLayout));
    for (const PinLayout& pin : pins) {
      if (pin.gen == 0 || pin.partition != me_) continue;
      if (v.ok() && (pin.epoch != v->record.epoch || v->record.heartbeat >= pin.expires_beat)) {
        continue;
      }
      out.emplace_back(pin.index, pin.gen);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// --- Eviction (owner side) ---

Store::Evicted Store::Evict(uint64_t bytes, uint32_t count,
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

std::vector<uint32_t> Store::EvictSlots(const std::vector<uint32_t>& victims, Evicted* evicted) {
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

absl::Status Store::Delete(absl::string_view ns, absl::string_view key) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, false));
  const uint64_t hash = KeyHash(id, key);
  std::unique_lock<std::mutex> lock(mu_);
  CXLRT_ASSIGN_OR_RETURN(auto found, Search(id, key, hash, me_));
  if (!found) {
    lock.unlock();
    CXLRT_ASSIGN_OR_RETURN(auto other, SearchAll(id, key, hash));
    if (other) {
      return absl::FailedPreconditionError(
          absl::StrCat("key '", Printable(key), "' belongs to host ", other->partition,
                       ": only its owner removes it (by eviction)"));
    }
    return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
  }
  const uint32_t i = found->index;
  if (local_[i].busy || local_[i].gen != found->e.gen) {
    return absl::FailedPreconditionError("the entry is changing; try again");
  }
  order_->Remove(i);
  if (EvictSlots({i}).empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("key '", Printable(key), "' is pinned by a reader; delete it once released"));
  }
  return absl::OkStatus();
}

// --- Writing this host's partition ---

void Store::WriteEntry(uint32_t index, const EntryLayout& e) {
  c_.PublishObject(view_->EntryOff(me_, index), e);
}

void Store::WriteEntryHead(uint32_t index, const EntryLayout& e) {
  c_.Publish(view_->EntryOff(me_, index), &e, 64);
}

void Store::Tombstone(uint32_t index) {
  c_.Publish(view_->EntryOff(me_, index) + offsetof(EntryLayout, state), &kStateTombstone, 8);
  uint64_t zero = 0;
  c_.Publish(view_->EntryOff(me_, index) + offsetof(EntryLayout, seal), &zero, 8);
  local_[index] = Local{};
  local_[index].state = kStateTombstone;
}

void Store::PublishCounters(uint32_t ns) {
  NsCountersLayout& k = counters_[ns];
  k.hits = hits_[ns].load(std::memory_order_relaxed);
  k.misses = misses_[ns].load(std::memory_order_relaxed);
  c_.PublishObject(view_->CounterOff(me_, ns), k);
}

absl::StatusOr<StoreStats> Store::Stats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t ns = 0; ns < counters_.size(); ++ns) PublishCounters(ns);
  }
  return view_->Stats();
}

// --- Tools ---

bool HasStore(const runtime::Pool& pool) { return pool.FindRegion(kStoreRegionName).ok(); }

absl::StatusOr<StoreStats> ReadStats(const runtime::Pool& pool) {
  CXLRT_ASSIGN_OR_RETURN(auto view, StoreView::Open(pool));
  return view->Stats();
}

absl::StatusOr<std::vector<EntryInfo>> ListEntries(const runtime::Pool& pool,
                                                   std::optional<std::string> ns) {
  CXLRT_ASSIGN_OR_RETURN(auto view, StoreView::Open(pool));
  return view->List(ns);
}

absl::Status Audit(const runtime::Pool& pool, std::vector<std::string>* problems) {
  auto view = StoreView::Open(pool);
  if (!view.ok()) {
    // A store that cannot be opened is a problem of the pool like any other:
    // listed, so that a failed check never reads "0 problems".
    if (problems) problems->emplace_back(view.status().message());
    return view.status();
  }
  std::vector<std::string> found;
  (*view)->Audit(&found);
  if (problems) problems->insert(problems->end(), found.begin(), found.end());
  if (found.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("KV store of ", pool.name(), ": ", found.size(),
                                          " problems; first: ", found.front()));
}

}  // namespace cxlrt::kv
