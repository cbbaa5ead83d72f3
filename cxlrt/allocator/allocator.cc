#include "cxlrt/allocator/allocator.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/internal/free_queue.h"
#include "cxlrt/allocator/internal/thread_cache.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/metrics.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::allocator {

using allocator_internal::ArenaState;
using allocator_internal::AttachThreadCache;
using allocator_internal::BlockIndex;
using allocator_internal::BlockState;
using allocator_internal::HeapMeta;
using allocator_internal::LockRunner;
using allocator_internal::SlabView;
using allocator_internal::ThreadCache;
using allocator_internal::ThreadCacheRegistry;

namespace {

std::atomic<uint64_t> next_allocator_id{1};

// Off the cached paths only, so that a cached Allocate / Free costs no more
// than it did; the cached calls are the thread caches' business.
runtime::Counter g_cache_refills({"allocator.cache_refills", "calls",
                                  "Thread cache bins refilled from this process's arenas."});
runtime::Counter g_cache_returns({"allocator.cache_returns", "calls",
                                  "Half of a full thread cache bin given back to its arena."});
runtime::Counter g_slow_allocations(
    {"allocator.slow_allocations", "calls",
     "Allocate calls past the thread cache (large, aligned, durable or placed blocks)."});
runtime::Counter g_slow_frees(
    {"allocator.slow_frees", "calls",
     "Free calls past the thread cache (remote, large, durable or uncached blocks)."});
runtime::Counter g_remote_frees(
    {"allocator.remote_frees", "calls",
     "Frees of another host's block, sent through its ring to the owner."});
runtime::Counter g_recovered_arenas({"allocator.recovered_arenas", "arenas",
                                     "Arenas of dead hosts this process fenced and recovered."});
const runtime::MetricInfo kBytesInUse{
    "allocator.bytes_in_use", "bytes",
    "Bytes of this host's arena held by callers (class sizes, pages, huge segments)."};
const runtime::MetricInfo kBytesCached{"allocator.bytes_cached", "bytes",
                                       "Bytes of this host's slabs free in its caches."};
const runtime::MetricInfo kSegments{"allocator.segments", "segments",
                                    "Segments in this host's arena."};

// The calling thread's cache of the allocator it used last: one compare on
// the fast paths.
thread_local uint64_t last_allocator_id = 0;
thread_local ThreadCache* last_cache = nullptr;

const LockRunner kHeld = [](const std::function<absl::Status()>& fn) { return fn(); };

// Remote frees queued for one owner before they are pushed into its ring.
constexpr size_t kPushBatch = 16;

}  // namespace

// The allocator's state and its paths, behind the public class so that its
// header installs no internal one (free queues, arenas, thread caches).
class Allocator::Impl {
 public:
  Impl(runtime::Pool& pool, runtime::Membership& membership, const AllocatorOptions& options);
  ~Impl();

  absl::Status Init();
  // The public calls (allocator.h says what each does).
  // The cached paths, inlined into the public calls (a forwarding call
  // costs about 6% of a 64 B allocate+free pair; cxlrt bench alloc).
  [[gnu::always_inline]] absl::StatusOr<PoolOffset> Allocate(uint64_t size,
                                                             const AllocOptions& options);
  [[gnu::always_inline]] absl::Status Free(PoolOffset offset);
  absl::Status CommitDurable(PoolOffset block, PoolOffset word, uint64_t value);
  absl::Status FreeDurable(PoolOffset block, PoolOffset word, uint64_t value);
  absl::StatusOr<uint64_t> BlockSize(PoolOffset offset);
  absl::StatusOr<PoolOffset> AllocateNamed(absl::string_view name, uint64_t size,
                                           const AllocOptions& options);
  absl::StatusOr<NamedBlock> Find(absl::string_view name);
  absl::Status FreeNamed(absl::string_view name);
  absl::Status Tick();
  absl::StatusOr<std::vector<uint32_t>> RecoverDeadHosts();
  HostStats LocalStats();
  // This host's gauges, for the metrics registry; StartMetrics registers them.
  void CollectMetrics(std::vector<runtime::Sample>* out);
  void StartMetrics() {
    collector_ = std::make_unique<runtime::MetricsCollector>(
        [this](std::vector<runtime::Sample>* out) { CollectMetrics(out); });
  }
  absl::Status Close();
  // Starts the background tick (options.tick). REQUIRES: Init succeeded.
  void StartTick();

  uint32_t slot() const { return slot_; }
  runtime::Pool& pool() const { return pool_; }
  runtime::Membership& membership() const { return membership_; }

 private:
  // Not closed, and the host's lease held (one clock read): every path that
  // writes the pool checks it first (docs/membership.md, "Leases").
  bool Usable() const {
    return !closed_.load(std::memory_order_relaxed) && !arena_->lost() && membership_.LeaseHeld();
  }
  // The slow paths' check: Usable, and the host's slot read from the pool
  // (Membership::ConfirmLease). The cached paths check Usable only.
  absl::Status CheckUsable() {
    if (arena_->lost()) return Lost();
    return Usable() ? membership_.ConfirmLease() : Unusable();
  }
  absl::Status Unusable();
  // kAborted: a batch found this host's arena recovered by a survivor
  // (ArenaState::lost), so the call's own pool writes were dropped. Every
  // slow path asks after its arena steps: a call whose stores were dropped
  // must not return OK.
  absl::Status Lost() const;
  absl::Status FreeLocked(PoolOffset offset, bool allow_named);
  // The body of CommitDurable / FreeDurable.
  absl::Status ChangeWithWord(RedoKind kind, PoolOffset block, PoolOffset word, uint64_t value);
  // Allocate with options.device set: whole segments on that device.
  absl::StatusOr<PoolOffset> AllocateOnDevice(uint64_t size, uint64_t alignment,
                                              const AllocOptions& options);
  // Sets the state byte of cached-path block `off` of class `cls` (lock-free).
  void SetState(PoolOffset off, uint32_t cls, BlockState st);
  // The state byte of `offset` when it starts a block of one of this
  // arena's slabs that the thread caches serve (its class in `cls`), else
  // nullptr. Lock-free.
  std::atomic<uint8_t>* CachedState(PoolOffset offset, uint32_t* cls) const;
  // A block from / into bin `cls` of a thread cache. REQUIRES: the bin is
  // not empty / not full; `off` starts a block of class `cls` of this arena
  // and `state` is its state byte.
  PoolOffset TakeCached(ThreadCache& tc, uint32_t cls);
  void PutCached(ThreadCache& tc, uint32_t cls, std::atomic<uint8_t>& state, PoolOffset off);
  // The cached paths' rare steps and everything past them, out of line so
  // that the cached paths stay small: refill an empty bin, return half of
  // a full one, and Allocate / Free of what no thread cache serves
  // (`state`: the block's state byte when it is a cached-path block).
  [[gnu::noinline]] absl::StatusOr<PoolOffset> RefillAndTake(ThreadCache& tc, uint32_t cls);
  [[gnu::noinline]] void ReturnHalf(ThreadCache& tc, uint32_t cls);
  [[gnu::noinline]] absl::StatusOr<PoolOffset> AllocateSlow(uint64_t size,
                                                            const AllocOptions& options);
  [[gnu::noinline]] absl::Status FreeSlow(PoolOffset offset, const std::atomic<uint8_t>* state,
                                          uint32_t cls);
  // The calling thread's cache (made on first use).
  ThreadCache& MyCache();
  // Takes mu_ for a batch move between a thread cache and the arena:
  // spins up to 4 us before it sleeps.
  void LockForBatch();
  // Fills the empty cache bin of class `cls` from the arena. REQUIRES: mu_.
  absl::Status RefillBin(ThreadCache& tc, uint32_t cls);
  // Takes back what other hosts freed (on every refill). REQUIRES: mu_.
  void DrainOnRefill();
  // Returns the oldest `n` blocks of bin `cls` to the arena. REQUIRES: mu_.
  void ReturnBlocks(ThreadCache& tc, uint32_t cls, uint32_t n);
  // Blocks per class that thread caches hold now (relaxed reads).
  std::array<uint64_t, kNumClasses> ThreadCached();
  absl::Status RemoteFree(PoolOffset offset, bool allow_named);
  // Frees `entries` in `owner`'s arena, which no host owns, under the pool lock.
  absl::Status FreeInUnownedArena(uint32_t owner, const std::vector<RingEntryLayout>& entries);
  // Pushes what fits of the queued frees for `owner` into its ring.
  void PushPending(uint32_t owner);
  absl::Status DrainRings();
  void TickLoop();

  runtime::Pool& pool_;
  runtime::Membership& membership_;
  const AllocatorOptions options_;
  const uint32_t slot_;
  const uint64_t epoch_;
  // Runs a function under the pool lock (made once: it is on every path).
  const std::function<absl::Status(const std::function<absl::Status()>&)> pool_lock_;
  AllocatorHeaderLayout header_{};

  std::unique_ptr<HeapMeta> meta_;  // set by Init, then constant
  const uint64_t id_;               // unique in the process: names this allocator's thread caches
  std::shared_ptr<ThreadCacheRegistry> registry_;
  std::mutex mu_;                      // after registry_->mu when both are taken
  std::unique_ptr<ArenaState> arena_;  // guarded by mu_
  std::vector<uint64_t> my_heads_;     // guarded by mu_: head of ring (me, o)
  std::vector<uint64_t> my_tails_;     // guarded by mu_: tail of ring (p, me)
  uint64_t refills_ = 0;               // guarded by mu_
  // Frees queued for one owner before they go into its ring: block offsets
  // (| kRingEntryDurable), all meant for the owner's incarnation `epoch`.
  struct PendingFrees {
    uint64_t epoch = 0;
    allocator_internal::FreeQueue offsets;

    // The owner's incarnation is now `e`: private frees queued for the one
    // before are moot (its private blocks were reclaimed with it) and are
    // dropped; durable ones stay, for whoever holds the block now.
    void Retag(uint64_t e);
    // Queues `tagged` (offset | durable bit) for the owner's incarnation
    // `owner_epoch`, retagging first when that changed. False: no memory.
    bool Add(uint64_t owner_epoch, uint64_t tagged);
  };
  std::vector<PendingFrees> pending_;  // guarded by mu_: frees queued for owner o
  std::atomic<bool> closed_{false};    // written under mu_
  // Segment entries last read whole and verified, for remote frees.
  struct SeenEntry {
    SegmentEntryLayout entry;
    bool valid = false;
  };
  std::vector<SeenEntry> seen_;  // guarded by mu_

  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool tick_stop_ = false;  // guarded by tick_mu_
  std::thread tick_thread_;
  absl::Time next_recovery_ = absl::InfinitePast();
  std::unique_ptr<runtime::MetricsCollector> collector_;  // set by Open; reset first
};

Allocator::Impl::Impl(runtime::Pool& pool, runtime::Membership& membership,
                      const AllocatorOptions& options)
    : pool_(pool),
      membership_(membership),
      options_(options),
      slot_(membership.slot()),
      epoch_(membership.epoch()),
      pool_lock_(
          [this](const std::function<absl::Status()>& fn) { return membership_.WithPoolLock(fn); }),
      id_(next_allocator_id.fetch_add(1, std::memory_order_relaxed)),
      registry_(std::make_shared<ThreadCacheRegistry>()) {}

absl::Status Allocator::Impl::Init() {
  // Make the allocator's tables when the pool has none (under the pool
  // lock; the directory entry, written last, is the commit point).
  auto header = allocator_internal::ReadAllocatorHeader(pool_);
  if (!header.ok() && header.status().code() == absl::StatusCode::kNotFound) {
    CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
      if (pool_.FindRegion(kAllocatorRegionName).ok()) return absl::OkStatus();  // raced
      CXLRT_ASSIGN_OR_RETURN(AllocatorHeaderLayout h, allocator_internal::PlanLayout(pool_));
      runtime::Coherence& c = pool_.coherence();
      static const uint8_t kZeros[64 << 10] = {};
      const uint64_t bytes = uint64_t{h.meta_segments} * kSegmentSize;
      CXLRT_RETURN_IF_ERROR(pool_.backend().Reserve(h.first_segment, bytes));
      for (uint64_t off = 0; off < bytes; off += sizeof(kZeros)) {
        c.CopyToPool(h.first_segment + off, kZeros,
                     std::min<uint64_t>(sizeof(kZeros), bytes - off));
      }
      HeapMeta meta(pool_, h);
      for (uint32_t i = 0; i < h.meta_segments; ++i) {
        SegmentEntryLayout e = {};
        e.generation = 1;
        e.state = static_cast<uint32_t>(SegmentState::kMeta);
        meta.WriteEntry(i, e);
      }
      c.PublishObject(h.first_segment, h);
      return pool_.CreateRegion(kAllocatorRegionName, h.first_segment, bytes, slot_).status();
    }));
    header = allocator_internal::ReadAllocatorHeader(pool_);
  }
  if (!header.ok()) return header.status();
  header_ = *header;
  meta_ = std::make_unique<HeapMeta>(pool_, header_);
  const HeapMeta& meta = *meta_;

  // Take over this slot's arena: a previous incarnation's private blocks
  // are reclaimed first.
  auto arena = std::make_unique<ArenaState>(meta, slot_, /*use_cache=*/true);
  CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_RETURN_IF_ERROR(arena->Load());
    if (arena->owner_epoch() != epoch_) {
      // Frees sent to the previous incarnation first (they name its
      // epoch), then whatever it still held privately.
      std::vector<uint64_t> tails(meta.slots());
      for (uint32_t p = 0; p < meta.slots(); ++p) {
        tails[p] = pool_.coherence().LoadFlag(meta.TailOffset(slot_, p));
      }
      arena->DrainRings(&tails, kHeld);
      CXLRT_RETURN_IF_ERROR(arena->ReclaimPrivate());
      arena->set_owner_epoch(epoch_);
      arena->PublishCounters();
    }
    return absl::OkStatus();
  }));
  arena_ = std::move(arena);
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->give_back = [this](ThreadCache& tc) {
      std::lock_guard<std::mutex> l(mu_);
      // Returning blocks writes the arena (bitmaps, its version): only
      // with the lease. A fenced host's cached blocks stay handed out;
      // the survivor that recovers the arena reclaims them.
      if (!membership_.ConfirmLease().ok()) {
        for (uint32_t c = 0; c < kNumClasses; ++c) tc.bins[c].count.store(0);
        return;
      }
      for (uint32_t c = 0; c < kNumClasses; ++c) ReturnBlocks(tc, c, tc.bins[c].count);
    };
  }
  arena_->set_refill_hook([this] { DrainOnRefill(); });
  my_heads_.resize(meta.slots());
  for (uint32_t o = 0; o < meta.slots(); ++o) {
    my_heads_[o] = pool_.coherence().LoadFlag(meta.HeadOffset(slot_, o));
  }
  pending_.resize(meta.slots());
  seen_.resize(header_.segment_count);
  my_tails_.resize(meta.slots());
  for (uint32_t p = 0; p < meta.slots(); ++p) {
    my_tails_[p] = pool_.coherence().LoadFlag(meta.TailOffset(slot_, p));
  }
  return absl::OkStatus();
}

Allocator::Impl::~Impl() {
  collector_.reset();
  absl::Status s = Close();
  if (!s.ok() && s.code() != absl::StatusCode::kFailedPrecondition) {
    CXLRT_LOG(kWarning) << "closing the allocator of " << pool_.name() << ": " << s;
  }
}

absl::Status Allocator::Impl::Unusable() {
  if (closed_) return absl::FailedPreconditionError("the allocator is closed");
  // The lease ran out (a stall, a pause) or a survivor fenced this host:
  // renew it, or say why nothing may be written.
  absl::Status s = membership_.CheckLease();
  if (s.ok()) return s;
  return absl::AbortedError(
      absl::StrCat("host ", slot_, "'s allocator may not write ", pool_.name(), ": ", s.message()));
}

absl::Status Allocator::Impl::Lost() const {
  return absl::AbortedError(absl::StrCat(
      "host ", slot_, "'s arena in ", pool_.name(),
      " was recovered by a survivor: this host was fenced (a stall past its lease); its "
      "allocator writes nothing more: attach again"));
}

inline void Allocator::Impl::SetState(PoolOffset off, uint32_t cls, BlockState st) {
  arena_->StateByte(off, cls).store(static_cast<uint8_t>(st), std::memory_order_relaxed);
}

inline PoolOffset Allocator::Impl::TakeCached(ThreadCache& tc, uint32_t cls) {
  ThreadCache::Bin& bin = tc.bins[cls];
  const uint32_t n = bin.count.load(std::memory_order_relaxed);
  const PoolOffset off = bin.blocks[n - 1];
  bin.count.store(n - 1, std::memory_order_relaxed);
  SetState(off, cls, BlockState::kUser);
  return off;
}

inline void Allocator::Impl::PutCached(ThreadCache& tc, uint32_t cls, std::atomic<uint8_t>& state,
                                       PoolOffset off) {
  ThreadCache::Bin& bin = tc.bins[cls];
  const uint32_t n = bin.count.load(std::memory_order_relaxed);
  state.store(static_cast<uint8_t>(BlockState::kThreadCache), std::memory_order_relaxed);
  bin.blocks[n] = off;
  bin.count.store(n + 1, std::memory_order_relaxed);
}

inline absl::StatusOr<PoolOffset> Allocator::Impl::Allocate(uint64_t size,
                                                            const AllocOptions& options) {
  // The cached path: a small private block from this thread's cache (sizes
  // 1..kMaxSmallSize, alignment 64 or less, no device), refilled from the
  // arena when empty. Everything else goes the slow way.
  if (size - 1 < kMaxSmallSize && options.alignment <= 64 && !options.durable &&
      options.device < 0 && Usable()) {
    const uint32_t cls = PlainClassFor(size);
    ThreadCache& tc = MyCache();
    if (tc.bins[cls].count.load(std::memory_order_relaxed) > 0) [[likely]] {
      return TakeCached(tc, cls);
    }
    return RefillAndTake(tc, cls);
  }
  return AllocateSlow(size, options);
}

absl::StatusOr<PoolOffset> Allocator::Impl::RefillAndTake(ThreadCache& tc, uint32_t cls) {
  g_cache_refills.Add();
  LockForBatch();
  std::lock_guard<std::mutex> lock(mu_, std::adopt_lock);
  CXLRT_RETURN_IF_ERROR(RefillBin(tc, cls));
  if (arena_->lost()) return Lost();
  return TakeCached(tc, cls);
}

absl::StatusOr<PoolOffset> Allocator::Impl::AllocateSlow(uint64_t size,
                                                         const AllocOptions& options) {
  g_slow_allocations.Add();
  if (size == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  uint64_t alignment = std::max<uint64_t>(options.alignment, 64);
  if ((alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", options.alignment, " is not a power of two"));
  }
  const uint64_t heap = uint64_t{header_.segment_count - header_.meta_segments} * kSegmentSize;
  if (size > heap) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", size, " bytes: the heap of ",
                                                   pool_.name(), " holds ", heap));
  }
  if (alignment > heap) {
    return absl::InvalidArgumentError(absl::StrCat("alignment ", alignment, " exceeds the heap"));
  }
  if (options.device >= 0) return AllocateOnDevice(size, alignment, options);
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  auto off = arena_->Allocate(size, alignment, options.durable, pool_lock_);
  if (arena_->lost()) return Lost();
  if (off.ok() || off.status().code() != absl::StatusCode::kResourceExhausted) return off;
  // Full: take back what other hosts freed, then try once more.
  CXLRT_RETURN_IF_ERROR(DrainRings());
  off = arena_->Allocate(size, alignment, options.durable, pool_lock_);
  if (arena_->lost()) return Lost();
  return off;
}

absl::StatusOr<PoolOffset> Allocator::Impl::AllocateOnDevice(uint64_t size, uint64_t alignment,
                                                             const AllocOptions& options) {
  const uint32_t devices = pool_.devices().count();
  if (static_cast<uint32_t>(options.device) >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", options.device, " of ", pool_.name(), ", which has ", devices));
  }
  const auto [begin, end] = pool_.HeapOnDevice(options.device);
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  auto off = arena_->AllocateIn(size, alignment, options.durable, pool_lock_, begin, end);
  if (arena_->lost()) return Lost();
  return off;
}

absl::Status Allocator::Impl::CommitDurable(PoolOffset block, PoolOffset word, uint64_t value) {
  return ChangeWithWord(RedoKind::kMakeDurable, block, word, value);
}

absl::Status Allocator::Impl::FreeDurable(PoolOffset block, PoolOffset word, uint64_t value) {
  return ChangeWithWord(RedoKind::kFree, block, word, value);
}

absl::Status Allocator::Impl::ChangeWithWord(RedoKind kind, PoolOffset block, PoolOffset word,
                                             uint64_t value) {
  if (!meta_->IsHeapWord(word)) {
    return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(word),
                                                   " is not an 8-byte aligned word of the heap"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  if (!arena_->Owns(block)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool offset 0x", absl::Hex(block), " is not in a block of host ", slot_));
  }
  // Check first (so a refused call leaves no intent behind), then record the
  // intent, change the block, store the word, clear the intent. A crash
  // anywhere after the intent is finished by recovery (FinishRedo).
  if (kind == RedoKind::kFree) {
    uint64_t usable = 0;
    if (!arena_->IsDurableBlockStart(block, &usable)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the block at 0x", absl::Hex(block), " is not a durable block"));
    }
  }
  arena_->WriteRedo(kind, block, word, value);
  CXLRT_FAULT_POINT("alloc.redo.written");
  // (FreeDurable skips Free's search of the region directory for a name:
  // its caller vouches the block is not named, and a scan per free would
  // cost more than the free.)
  absl::Status st = kind == RedoKind::kMakeDurable ? arena_->MakeDurable(block, pool_lock_)
                                                   : arena_->Free(block, true, pool_lock_);
  // Lost: the word is not stored here. The intent may still be finished by
  // the survivor's recovery (when it was written before the recovery), so
  // kAborted from this call means "not known", as after a crash.
  if (arena_->lost()) return Lost();
  if (!st.ok()) {
    arena_->WriteRedo(RedoKind::kNone);
    return st;
  }
  CXLRT_FAULT_POINT("alloc.redo.block_changed");
  pool_.coherence().Publish(word, &value, sizeof(value));
  arena_->WriteRedo(RedoKind::kNone);
  return absl::OkStatus();
}

inline std::atomic<uint8_t>* Allocator::Impl::CachedState(PoolOffset offset, uint32_t* cls) const {
  const HeapMeta* meta = meta_.get();
  const auto seg = meta != nullptr ? meta->SegmentOf(offset) : std::nullopt;
  if (!seg) return nullptr;
  const SlabView& view = arena_->View(*seg);
  const uint32_t cls1 = view.cls1.load(std::memory_order_acquire);
  const uint64_t rel = offset - meta->SegOffset(*seg) - kSegmentHeaderSize;  // wraps below
  if (cls1 == 0 || rel >= kSegmentSize) return nullptr;
  const uint64_t b = BlockIndex(rel, cls1 - 1);
  if (b * kClassSizes[cls1 - 1] != rel || b >= SlabBlocks(cls1 - 1)) return nullptr;
  *cls = cls1 - 1;
  return &view.state.load(std::memory_order_acquire)[b];
}

inline absl::Status Allocator::Impl::Free(PoolOffset offset) {
  // The cached path: a block of this arena's slabs that a cached path handed
  // out goes into this thread's cache (half of a full bin goes back to the
  // arena first). Everything else goes the slow way.
  uint32_t cls = 0;
  std::atomic<uint8_t>* state = Usable() ? CachedState(offset, &cls) : nullptr;
  if (state != nullptr &&
      state->load(std::memory_order_relaxed) == static_cast<uint8_t>(BlockState::kUser)) {
    ThreadCache& tc = MyCache();
    const ThreadCache::Bin& bin = tc.bins[cls];
    if (bin.count.load(std::memory_order_relaxed) == bin.capacity) [[unlikely]] {
      ReturnHalf(tc, cls);
    }
    PutCached(tc, cls, *state, offset);
    return absl::OkStatus();
  }
  return FreeSlow(offset, state, cls);
}

void Allocator::Impl::ReturnHalf(ThreadCache& tc, uint32_t cls) {
  g_cache_returns.Add();
  LockForBatch();
  std::lock_guard<std::mutex> lock(mu_, std::adopt_lock);
  ReturnBlocks(tc, cls, tc.bins[cls].count.load(std::memory_order_relaxed) / 2);
}

absl::Status Allocator::Impl::FreeSlow(PoolOffset offset, const std::atomic<uint8_t>* state,
                                       uint32_t cls) {
  g_slow_frees.Add();
  if (state != nullptr &&
      state->load(std::memory_order_relaxed) == static_cast<uint8_t>(BlockState::kThreadCache)) {
    return absl::FailedPreconditionError(absl::StrCat("double free: the block at 0x",
                                                      absl::Hex(offset), " (", kClassSizes[cls],
                                                      " bytes) is not allocated"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  absl::Status st =
      arena_->TryFreeCached(offset) ? absl::OkStatus() : FreeLocked(offset, /*allow_named=*/false);
  if (arena_->lost()) return Lost();
  return st;
}

void Allocator::Impl::LockForBatch() {
  // A thread that moves a batch between its cache and the arena usually
  // meets another doing the same (a producer's refills against a
  // consumer's returns), whose hold lasts a few microseconds: less than a
  // futex sleep and wake cost here (about 9 us). So it retries for a while
  // before it sleeps. Only these batch moves spin; the tick and remote
  // frees take the lock plainly.
  if (mu_.try_lock()) return;
  const int64_t until = runtime::NowNs() + 4000;
  do {
    for (int i = 0; i < 16; ++i) _mm_pause();
    if (mu_.try_lock()) return;
  } while (runtime::NowNs() < until);
  mu_.lock();
}

ThreadCache& Allocator::Impl::MyCache() {
  if (last_allocator_id != id_) {
    last_cache = AttachThreadCache(registry_);
    last_allocator_id = id_;
  }
  return *last_cache;
}

absl::Status Allocator::Impl::RefillBin(ThreadCache& tc, uint32_t cls) {
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  ThreadCache::Bin& bin = tc.bins[cls];
  const uint32_t want = std::max<uint32_t>(1, bin.capacity / 2);
  uint32_t n = bin.count.load(std::memory_order_relaxed);
  DrainOnRefill();  // what other hosts freed comes first
  while (n < want) {
    PoolOffset off = arena_->TryAllocCached(cls);
    if (off == 0) {
      // What the arena had (frees from other hosts among them) will do: the
      // next refill drains the rings again before the slabs are scanned.
      if (n > 0) break;
      auto got = arena_->Allocate(kClassSizes[cls], 64, /*durable=*/false, pool_lock_);
      if (absl::IsResourceExhausted(got.status())) {
        // Full: take back what other hosts freed, then try once more.
        CXLRT_RETURN_IF_ERROR(DrainRings());
        got = arena_->Allocate(kClassSizes[cls], 64, /*durable=*/false, pool_lock_);
      }
      if (!got.ok()) return got.status();
      off = *got;
    }
    SetState(off, cls, BlockState::kThreadCache);
    bin.blocks[n++] = off;
  }
  bin.count.store(n, std::memory_order_relaxed);
  return absl::OkStatus();
}

void Allocator::Impl::DrainOnRefill() {
  // Hosts that sent frees lately on every refill, every host now and then.
  const bool all = ++refills_ % 32 == 0;
  arena_->DrainRings(&my_tails_, pool_lock_, /*active_only=*/!all);  // counters: next tick
}

void Allocator::Impl::ReturnBlocks(ThreadCache& tc, uint32_t cls, uint32_t n) {
  ThreadCache::Bin& bin = tc.bins[cls];
  const uint32_t count = bin.count.load(std::memory_order_relaxed);
  n = std::min(n, count);
  for (uint32_t k = 0; k < n; ++k) {
    const PoolOffset off = bin.blocks[k];
    SetState(off, cls, BlockState::kUser);  // back with a caller, then freed as one would
    if (arena_->TryFreeCached(off)) continue;
    absl::Status st = arena_->Free(off, /*allow_named=*/false, pool_lock_);
    if (!st.ok()) {
      CXLRT_LOG(kError) << "host " << slot_ << " could not return cached block 0x" << std::hex
                        << off << std::dec << " to its arena: " << st;
    }
  }
  std::copy(bin.blocks.get() + n, bin.blocks.get() + count, bin.blocks.get());
  bin.count.store(count - n, std::memory_order_relaxed);
}

std::array<uint64_t, kNumClasses> Allocator::Impl::ThreadCached() {
  std::array<uint64_t, kNumClasses> n{};
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (const ThreadCache* tc : registry_->caches) {
    for (uint32_t c = 0; c < kNumClasses; ++c) {
      n[c] += tc->bins[c].count.load(std::memory_order_relaxed);
    }
  }
  return n;
}

absl::Status Allocator::Impl::FreeLocked(PoolOffset offset, bool allow_named) {
  if (arena_->Owns(offset)) return arena_->Free(offset, allow_named, pool_lock_);
  absl::Status s = RemoteFree(offset, allow_named);
  if (s.ok()) g_remote_frees.Add();
  return s;
}

absl::Status Allocator::Impl::RemoteFree(PoolOffset off, bool allow_named) {
  const HeapMeta& meta = *meta_;
  runtime::Coherence& c = pool_.coherence();
  auto index = meta.SegmentOf(off);
  if (!index) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool offset 0x", absl::Hex(off), " is not in the heap's data segments [0x",
                     absl::Hex(meta.SegOffset(header_.meta_segments)), ", 0x",
                     absl::Hex(meta.SegOffset(header_.segment_count)), ")"));
  }
  // The segment's entry: a 32-byte prefix read is enough when it equals the
  // one last read whole and checksummed (every change bumps the generation);
  // otherwise the whole entry is read and verified.
  SegmentEntryLayout e;
  constexpr size_t kPrefixWords = offsetof(SegmentEntryLayout, block_size) / 8;
  static_assert(kPrefixWords == 4);
  SeenEntry& seen = seen_[*index];
  uint64_t prefix[kPrefixWords];
  for (size_t w = 0; w < kPrefixWords; ++w)
    prefix[w] = c.FetchWord(meta.EntryOffset(*index) + w * 8);
  if (seen.valid && std::memcmp(prefix, &seen.entry, sizeof(prefix)) == 0) {
    e = seen.entry;
  } else {
    CXLRT_ASSIGN_OR_RETURN(e, meta.ReadEntry(*index));
    seen = {e, true};
  }
  const PoolOffset base = meta.SegOffset(*index);
  const auto state = static_cast<SegmentState>(e.state);
  bool durable = false;
  switch (state) {
    case SegmentState::kSlab: {
      const uint64_t bs = kClassSizes[e.size_class];
      const uint64_t rel = off - base - kSegmentHeaderSize;  // wraps below the blocks
      const uint64_t b = BlockIndex(rel, e.size_class);      // a multiply, not a division
      if (rel >= kSegmentSize || b * bs != rel || b >= SlabBlocks(e.size_class)) {
        return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                       " is not the start of a block (blocks of ",
                                                       bs, " bytes)"));
      }
      const uint64_t words[2] = {c.FetchWord(base + kAllocBitmapOffset + b / 64 * 8),
                                 c.FetchWord(base + kDurableBitmapOffset + b / 64 * 8)};
      if (!((words[0] >> (b % 64)) & 1)) {
        return absl::FailedPreconditionError(absl::StrCat("double free: the block at 0x",
                                                          absl::Hex(off), " of host ", e.owner,
                                                          " is not allocated"));
      }
      durable = (words[1] >> (b % 64)) & 1;
      break;
    }
    case SegmentState::kPages: {
      const uint64_t rel = off - base;
      uint8_t run = 0;
      if (rel % kPageSize == 0 && rel > 0)
        c.Fetch(&run, base + kRunLengthOffset + rel / kPageSize, 1);
      if (run == 0) {
        return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                       " is not the start of an allocated block"));
      }
      uint64_t dw = 0;
      c.Fetch(&dw, base + kDurableBitmapOffset, 8);
      durable = (dw >> (rel / kPageSize)) & 1;
      break;
    }
    case SegmentState::kHugeHead:
      if (off != base) {
        return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                       " is inside the block starting at 0x",
                                                       absl::Hex(base)));
      }
      durable = e.durable != 0;
      break;
    case SegmentState::kHugeTail:
      return absl::InvalidArgumentError(absl::StrCat("pool offset 0x", absl::Hex(off),
                                                     " is inside a block that starts at segment ",
                                                     e.head_index));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("double free: pool offset 0x", absl::Hex(off), " is in a free segment"));
  }
  if (durable && !allow_named) {
    for (const auto& r : pool_.ListRegions().value_or(std::vector<runtime::RegionInfo>{})) {
      if (r.offset == off) {
        return absl::FailedPreconditionError(absl::StrCat("the block at 0x", absl::Hex(off),
                                                          " is published as '", r.name,
                                                          "': free it with FreeNamed"));
      }
    }
  }
  const uint32_t owner = e.owner;
  const uint64_t owner_epoch =
      c.FetchWord(meta.ArenaOffset(owner) + offsetof(ArenaLayout, owner_epoch));
  const uint64_t tagged = off | (durable ? kRingEntryDurable : 0);
  if (owner_epoch == 0) return FreeInUnownedArena(owner, {{tagged, owner_epoch}});
  // Frees travel in batches (one flush and one head store for many); the
  // tick pushes a partial batch within a tick period.
  PendingFrees& q = pending_[owner];
  if (!q.Add(owner_epoch, tagged)) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory to queue a free for host ", owner,
                                                     " (", q.offsets.size(), " queued)"));
  }
  // Every kPushBatch-th queued free tries a push: when the owner's ring is
  // full the queue keeps growing, and a push attempt per free (two reads of
  // the owner's lines) would cost more than the free itself.
  if (q.offsets.size() % kPushBatch == 0) PushPending(owner);
  return absl::OkStatus();
}

void Allocator::Impl::PendingFrees::Retag(uint64_t e) {
  offsets.EraseIf([](uint64_t o) { return !(o & kRingEntryDurable); });
  epoch = e;
}

bool Allocator::Impl::PendingFrees::Add(uint64_t owner_epoch, uint64_t tagged) {
  if (owner_epoch != epoch) Retag(owner_epoch);
  return offsets.Push(tagged);
}

absl::Status Allocator::Impl::FreeInUnownedArena(uint32_t owner,
                                                 const std::vector<RingEntryLayout>& entries) {
  // Nobody owns that arena (its host left or died and was recovered): free
  // in place, as the pool-lock holder. Only durable blocks are still there.
  return membership_.WithPoolLock([&]() -> absl::Status {
    ArenaState other(*meta_, owner, /*use_cache=*/false);
    CXLRT_RETURN_IF_ERROR(other.Load());
    absl::Status first;
    for (const RingEntryLayout& e : entries) {
      const bool durable = e.offset & kRingEntryDurable;
      if (other.owner_epoch() != 0) {  // owned again meanwhile: use the ring
        if (durable || e.owner_epoch == other.owner_epoch()) {
          if (!pending_[owner].Add(other.owner_epoch(), e.offset)) {
            CXLRT_LOG(kError) << "no memory to queue a free for host " << owner << ": block 0x"
                              << std::hex << e.offset << std::dec << " stays allocated";
          }
        }
        continue;
      }
      absl::Status st = other.Free(e.offset & ~kRingEntryDurable, true, kHeld);
      if (!st.ok() && first.ok()) first = st;
    }
    other.PublishCounters();
    return first;
  });
}

void Allocator::Impl::PushPending(uint32_t owner) {
  PendingFrees& q = pending_[owner];
  if (q.offsets.empty()) return;
  const HeapMeta& meta = *meta_;
  runtime::Coherence& c = pool_.coherence();
  const uint32_t cap = header_.ring_capacity;
  // Frees meant for an incarnation of the owner that has gone are moot: its
  // private blocks were reclaimed with it (and the ring would drop them).
  const uint64_t owner_epoch =
      c.FetchWord(meta.ArenaOffset(owner) + offsetof(ArenaLayout, owner_epoch));
  if (owner_epoch == 0) {
    std::vector<RingEntryLayout> durable;
    for (size_t k = 0; k < q.offsets.size(); ++k) {
      if (q.offsets[k] & kRingEntryDurable) durable.push_back({q.offsets[k], q.epoch});
    }
    q.offsets.PopFront(q.offsets.size());
    if (!durable.empty()) {
      absl::Status st = FreeInUnownedArena(owner, durable);
      if (!st.ok()) {
        CXLRT_LOG(kWarning) << "queued frees for departed host " << owner << ": " << st;
      }
    }
    return;
  }
  // Only when the owner has changed since the frees were queued are the
  // private ones dropped (a rare, linear pass).
  if (q.epoch != owner_epoch) {
    q.Retag(owner_epoch);
    if (q.offsets.empty()) return;
  }
  const uint64_t tail = c.LoadFlag(meta.TailOffset(owner, slot_));
  uint64_t& head = my_heads_[owner];
  if (head < tail || head - tail > cap) {
    CXLRT_LOG(kError) << "free ring from host " << slot_ << " to host " << owner
                      << " is corrupt (head " << head << ", tail " << tail << ")";
    return;
  }
  const uint64_t n = std::min<uint64_t>(cap - (head - tail), q.offsets.size());
  if (n == 0) return;
  // Entries in at most two contiguous pieces (the ring wraps), each written
  // and flushed once; then the head.
  const PoolOffset ring = meta.RingOffset(slot_, owner);
  for (uint64_t done = 0; done < n;) {
    const uint64_t at = (head + done) % cap;
    const uint64_t run = std::min(n - done, cap - at);
    RingEntryLayout batch[64];
    for (uint64_t k = 0; k < run;) {
      const uint64_t m = std::min<uint64_t>(64, run - k);
      for (uint64_t j = 0; j < m; ++j) batch[j] = {q.offsets[done + k + j], q.epoch};
      c.Write(ring + (at + k) * sizeof(RingEntryLayout), batch, m * sizeof(RingEntryLayout));
      k += m;
    }
    c.Flush(ring + at * sizeof(RingEntryLayout), run * sizeof(RingEntryLayout));
    done += run;
  }
  CXLRT_FAULT_POINT("alloc.remote_free.after_entry");
  head += n;
  c.StoreFlag(meta.HeadOffset(slot_, owner), head);
  q.offsets.PopFront(n);
}

absl::Status Allocator::Impl::DrainRings() {
  // Only this host writes its tails (a survivor does once it is fenced), so
  // they are kept here rather than re-read.
  const uint64_t applied = arena_->DrainRings(&my_tails_, pool_lock_);
  if (applied > 0) arena_->PublishCounters();
  return arena_->lost() ? Lost() : absl::OkStatus();
}

absl::StatusOr<uint64_t> Allocator::Impl::BlockSize(PoolOffset offset) {
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  return arena_->BlockSize(offset);
}

absl::StatusOr<PoolOffset> Allocator::Impl::AllocateNamed(absl::string_view name, uint64_t size,
                                                          const AllocOptions& options) {
  AllocOptions o = options;
  o.durable = true;
  CXLRT_ASSIGN_OR_RETURN(PoolOffset off, Allocate(size, o));
  absl::Status st =
      membership_.WithPoolLock([&] { return pool_.CreateRegion(name, off, size, slot_).status(); });
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status undo = FreeLocked(off, /*allow_named=*/true);
    if (!undo.ok()) {
      CXLRT_LOG(kError) << "could not free the block of failed name '" << name << "': " << undo;
    }
    return st;
  }
  return off;
}

absl::StatusOr<NamedBlock> Allocator::Impl::Find(absl::string_view name) {
  CXLRT_ASSIGN_OR_RETURN(runtime::RegionInfo r, pool_.FindRegion(name));
  return NamedBlock{r.offset, r.size, r.owner_host};
}

absl::Status Allocator::Impl::FreeNamed(absl::string_view name) {
  if (name == kAllocatorRegionName) {
    return absl::InvalidArgumentError("the allocator's own region cannot be freed");
  }
  PoolOffset off = 0;
  CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_ASSIGN_OR_RETURN(runtime::RegionInfo r, pool_.FindRegion(name));
    off = r.offset;
    return pool_.DeleteRegion(r.index);
  }));
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  absl::Status st = FreeLocked(off, /*allow_named=*/true);
  if (arena_->lost()) return Lost();
  return st;
}

absl::Status Allocator::Impl::Tick() {
  CXLRT_FAULT_POINT("alloc.tick.begin");
  const auto thread_cached = ThreadCached();
  std::lock_guard<std::mutex> lock(mu_);
  CXLRT_RETURN_IF_ERROR(CheckUsable());
  arena_->set_thread_cached(thread_cached);
  for (uint32_t o = 0; o < pending_.size(); ++o) PushPending(o);
  CXLRT_RETURN_IF_ERROR(DrainRings());
  arena_->PublishCounters();  // handed-out counts move without batches
  return arena_->lost() ? Lost() : absl::OkStatus();
}

void Allocator::Impl::StartTick() {
  if (options_.tick > absl::ZeroDuration()) tick_thread_ = std::thread([this] { TickLoop(); });
}

void Allocator::Impl::TickLoop() {
  std::unique_lock<std::mutex> lock(tick_mu_);
  while (!tick_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.tick),
                            [&] { return tick_stop_; })) {
    lock.unlock();
    absl::Status s = Tick();
    if (s.ok() && options_.recover_dead_hosts && absl::Now() >= next_recovery_) {
      next_recovery_ = absl::Now() + std::max(membership_.lease() / 4, absl::Milliseconds(50));
      auto r = RecoverDeadHosts();
      if (!r.ok()) {
        CXLRT_LOG(kWarning) << "recovering dead hosts: " << r.status();
      }
    }
    lock.lock();
  }
}

absl::StatusOr<std::vector<uint32_t>> Allocator::Impl::RecoverDeadHosts() {
  const HeapMeta& meta = *meta_;
  CXLRT_ASSIGN_OR_RETURN(std::vector<runtime::HostView> hosts, membership_.Hosts());
  std::vector<uint32_t> recovered;
  for (const runtime::HostView& v : hosts) {
    const uint32_t s = v.record.slot;
    if (v.liveness != runtime::Liveness::kDead && v.liveness != runtime::Liveness::kFenced)
      continue;
    if (v.liveness == runtime::Liveness::kDead) {
      absl::Status f = membership_.Fence(s);
      if (!f.ok() && f.code() != absl::StatusCode::kFailedPrecondition) return f;
      if (!f.ok()) continue;  // came back to life, or someone else fenced it
    }
    // Fenced, but maybe still holding a lease it renewed as the fence
    // landed: its arena waits for a later round. Decided under the pool
    // lock, so that another survivor cannot release the slot and a new
    // incarnation be fenced in between.
    bool recovered_now = false;
    uint64_t fenced_epoch = 0;
    CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
      auto rec = pool_.ReadHost(s);
      if (!rec.ok() || rec->state != runtime::SlotState::kFenced) return absl::OkStatus();
      CXLRT_ASSIGN_OR_RETURN(bool quiet, membership_.Quiet(s));
      if (!quiet) return absl::OkStatus();
      recovered_now = true;
      fenced_epoch = rec->epoch;
      ArenaState dead(meta, s, /*use_cache=*/false);
      CXLRT_RETURN_IF_ERROR(dead.Load());
      std::vector<uint64_t> tails(meta.slots());
      for (uint32_t p = 0; p < meta.slots(); ++p) {
        tails[p] = pool_.coherence().LoadFlag(meta.TailOffset(s, p));
      }
      dead.DrainRings(&tails, kHeld);
      CXLRT_RETURN_IF_ERROR(dead.ReclaimPrivate());
      dead.set_owner_epoch(0);
      dead.PublishCounters();
      return absl::OkStatus();
    }));
    if (!recovered_now) continue;
    if (absl::Status r = membership_.Release(s, fenced_epoch); !r.ok()) {
      if (r.code() != absl::StatusCode::kFailedPrecondition) return r;
      continue;  // released (and maybe re-taken) by someone else meanwhile
    }
    CXLRT_LOG(kInfo) << "host " << slot_ << " recovered the arena of dead host " << s;
    recovered.push_back(s);
    g_recovered_arenas.Add();
  }
  return recovered;
}

void Allocator::Impl::CollectMetrics(std::vector<runtime::Sample>* out) {
  const auto thread_cached = ThreadCached();
  HostStats st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !arena_) return;
    arena_->set_thread_cached(thread_cached);
    st = arena_->Stats();
  }
  const runtime::Labels l = {{"slot", absl::StrCat(slot_)}};
  out->push_back(runtime::GaugeSample(kBytesInUse, l, static_cast<double>(st.bytes_in_use)));
  out->push_back(runtime::GaugeSample(kBytesCached, l, static_cast<double>(st.bytes_cached)));
  out->push_back(runtime::GaugeSample(kSegments, l, static_cast<double>(st.segments)));
}

HostStats Allocator::Impl::LocalStats() {
  const auto thread_cached = ThreadCached();
  std::lock_guard<std::mutex> lock(mu_);
  arena_->set_thread_cached(thread_cached);
  return arena_->Stats();
}

absl::Status Allocator::Impl::Close() {
  {
    std::lock_guard<std::mutex> lock(tick_mu_);
    tick_stop_ = true;
  }
  tick_cv_.notify_all();
  if (tick_thread_.joinable()) tick_thread_.join();
  {
    // Every thread's cached blocks back to the arena; threads that exit
    // later find nothing to give back.
    std::lock_guard<std::mutex> lock(registry_->mu);
    if (registry_->give_back) {
      for (ThreadCache* tc : registry_->caches) registry_->give_back(*tc);
    }
    registry_->give_back = nullptr;
    registry_->caches.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !arena_) return absl::FailedPreconditionError("the allocator is already closed");
  closed_ = true;
  arena_->set_thread_cached({});
  if (arena_->lost()) return Lost();
  // Fenced (or the lease lapsed and cannot be renewed): nothing written.
  if (absl::Status s = membership_.CheckLease(); !s.ok()) {
    return absl::AbortedError(absl::StrCat("host ", slot_, " closes its allocator without writing ",
                                           pool_.name(), ": ", s.message()));
  }
  // Queued frees: a few tries while owners drain, then give up (logged).
  for (int attempt = 0; attempt < 100; ++attempt) {
    bool left = false;
    for (uint32_t o = 0; o < pending_.size(); ++o) {
      PushPending(o);
      left |= !pending_[o].offsets.empty();
    }
    if (!left) break;
    if (attempt == 99) {
      CXLRT_LOG(kWarning) << "host " << slot_ << " closes with frees for other hosts still queued";
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  arena_->FlushCache();
  return membership_.WithPoolLock([&]() -> absl::Status {
    arena_->DrainRings(&my_tails_, kHeld);
    CXLRT_RETURN_IF_ERROR(arena_->ReclaimPrivate());
    arena_->set_owner_epoch(0);
    arena_->PublishCounters();
    return absl::OkStatus();
  });
}

// --- The public class: each call goes to the state behind it. ---

Allocator::Allocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Allocator::~Allocator() = default;

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::Open(runtime::Pool& pool,
                                                           runtime::Membership& membership,
                                                           const AllocatorOptions& options) {
  auto impl = std::make_unique<Impl>(pool, membership, options);
  CXLRT_RETURN_IF_ERROR(impl->Init());
  impl->StartTick();
  impl->StartMetrics();
  return std::unique_ptr<Allocator>(new Allocator(std::move(impl)));
}

absl::StatusOr<PoolOffset> Allocator::Allocate(uint64_t size, const AllocOptions& options) {
  return impl_->Allocate(size, options);
}

absl::Status Allocator::Free(PoolOffset offset) { return impl_->Free(offset); }

absl::Status Allocator::CommitDurable(PoolOffset block, PoolOffset word, uint64_t value) {
  return impl_->CommitDurable(block, word, value);
}

absl::Status Allocator::FreeDurable(PoolOffset block, PoolOffset word, uint64_t value) {
  return impl_->FreeDurable(block, word, value);
}

absl::StatusOr<uint64_t> Allocator::BlockSize(PoolOffset offset) {
  return impl_->BlockSize(offset);
}

absl::StatusOr<PoolOffset> Allocator::AllocateNamed(absl::string_view name, uint64_t size,
                                                    const AllocOptions& options) {
  return impl_->AllocateNamed(name, size, options);
}

absl::StatusOr<NamedBlock> Allocator::Find(absl::string_view name) { return impl_->Find(name); }

absl::Status Allocator::FreeNamed(absl::string_view name) { return impl_->FreeNamed(name); }

absl::Status Allocator::Tick() { return impl_->Tick(); }

absl::StatusOr<std::vector<uint32_t>> Allocator::RecoverDeadHosts() {
  return impl_->RecoverDeadHosts();
}

HostStats Allocator::LocalStats() { return impl_->LocalStats(); }

absl::Status Allocator::Close() { return impl_->Close(); }

uint32_t Allocator::slot() const { return impl_->slot(); }

runtime::Pool& Allocator::pool() const { return impl_->pool(); }

runtime::Membership& Allocator::membership() const { return impl_->membership(); }

}  // namespace cxlrt::allocator
