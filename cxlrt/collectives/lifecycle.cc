// The lifecycle of a communicator: the plan of its block, rank 0 making it
// (or replacing a stale one), the others joining, this rank's slots, and
// Destroy with its waits for the ranks to go.
#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/membership.h"

namespace cxlrt::collectives {
namespace {

using collectives_internal::kP2pAlign;
using collectives_internal::RoundUp;
using runtime::PoolOffset;

constexpr uint64_t kAlign = 4096;

uint32_t HeaderChecksum(const CommHeaderLayout& h) {
  return runtime::Crc32c(&h, offsetof(CommHeaderLayout, checksum));
}

// Offsets inside the block, from the rank count and buffer sizes.
struct Plan {
  uint64_t p2p_offset, p2p_buffers_offset, total;
};
Plan PlanFor(uint32_t n, uint64_t p2p_bytes) {
  Plan p;
  p.p2p_offset = sizeof(CommHeaderLayout) + uint64_t{n} * sizeof(RankLayout);
  p.p2p_buffers_offset = RoundUp(p.p2p_offset + uint64_t{n} * n * sizeof(P2pLayout), kAlign);
  p.total = p.p2p_buffers_offset + uint64_t{n} * n * p2p_bytes;
  return p;
}

bool ValidBufferBytes(uint64_t v) { return v >= 64 && v <= (1ull << 30) && v % 64 == 0; }
bool ValidP2pBytes(uint64_t v) { return ValidBufferBytes(v) && v % kP2pAlign == 0; }
bool ValidDepth(uint64_t d) { return d >= kMinDepth && d <= kMaxDepth; }

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(allocator::Allocator& alloc,
                                                                   absl::string_view name,
                                                                   int nranks, int rank,
                                                                   const CommOptions& options) {
  if (name.empty() || name.size() > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator name '", name, "' must have 1 to 200 characters"));
  }
  if (nranks < 0 || rank < 0) {
    if (nranks >= 0 || rank >= 0) {
      return absl::InvalidArgumentError("pass both the rank and the size, or neither");
    }
    CXLRT_ASSIGN_OR_RETURN(RankInfo info, RankFromEnvironment());
    nranks = info.nranks;
    rank = info.rank;
  }
  if (options.timeout && *options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("communicator ", name, ": timeout ",
                                                   absl::FormatDuration(*options.timeout),
                                                   " must be positive (or unset: the knob)"));
  }
  if (nranks < 1 || nranks > 1024 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", nranks, " ranks: need 0 <= rank < size <= 1024"));
  }
  // Every rank refuses a name its pool region could not carry (printable
  // ASCII), at once: not only the rank that would make the region.
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator name holds byte 0x",
                       absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2),
                       ": names are printable ASCII (0x20-0x7e)"));
    }
  }
  auto impl = std::make_unique<Impl>(alloc, absl::StrCat("comm/", name), nranks, rank, options);
  impl->metrics_ = std::make_unique<collectives_internal::CommMetrics>(std::string(name), rank,
                                                                       nranks, alloc.slot());
  absl::Status joined = impl->Join();
  if (!joined.ok()) {
    // Nothing to leave; a block this rank made for nobody goes.
    impl->destroyed_ = true;
    impl->FreeSlots();
    if (impl->made_block_) {
      // Ranks may still wait for this block: unpublish it before it goes, so
      // none joins memory the allocator hands to someone else.
      impl->c_.PublishObject(impl->block_, CommHeaderLayout{});
      (void)alloc.FreeNamed(impl->name_);
    }
    return joined;
  }
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

absl::Status Communicator::Impl::Join() {
  runtime::Membership& m = alloc_.membership();
  const absl::Time deadline = absl::Now() + options_.timeout;
  auto creator_alive = [&](const CommHeaderLayout& h) {
    auto host = m.Host(h.creator_slot);
    return host.ok() && host->record.epoch == h.creator_epoch &&
           (host->liveness == runtime::Liveness::kAlive ||
            host->liveness == runtime::Liveness::kSelf);
  };
  auto read_header = [&](PoolOffset at, uint64_t size) -> std::optional<CommHeaderLayout> {
    if (size < sizeof(CommHeaderLayout)) return std::nullopt;
    CommHeaderLayout h = c_.FetchObject<CommHeaderLayout>(at);
    if (h.magic != kCommMagic || h.version != kCommVersion || h.checksum != HeaderChecksum(h)) {
      return std::nullopt;
    }
    return h;
  };
  CommHeaderLayout h = {};
  if (rank_ == 0) {
    if (!ValidBufferBytes(options_.slot_bytes) || !ValidP2pBytes(options_.p2p_bytes) ||
        !ValidDepth(options_.depth)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator ", name_, ": slot_bytes ", options_.slot_bytes, " and p2p_bytes ",
          options_.p2p_bytes, " must each be in [64, 1 GiB], depth ", options_.depth, " in [",
          kMinDepth, ", ", kMaxDepth, "]"));
    }
    const Plan plan = PlanFor(nranks_, options_.p2p_bytes);
    // A host is alive while this process sees its heartbeat move within
    // DeadAfter(its lease), so a creator watched for less than that may be
    // dead already (a job re-run right after one that crashed): look again
    // until that much has passed (within the deadline) before calling it in
    // use.
    absl::Time settled = absl::InfiniteFuture();
    for (;;) {
      auto found = alloc_.Find(name_);
      if (found.ok()) {
        auto old = read_header(found->offset, found->size);
        if (old && creator_alive(*old)) {
          if (settled == absl::InfiniteFuture()) {
            auto host = m.Host(old->creator_slot);
            const bool self = host.ok() && host->liveness == runtime::Liveness::kSelf;
            const absl::Duration lease = host.ok() ? host->lease : m.lease();
            settled =
                self ? absl::Now()
                     : std::min(absl::Now() + runtime::DeadAfter(lease) + kDataPathYield, deadline);
          }
          if (absl::Now() < settled) {
            absl::SleepFor(kDataPathYield);
            continue;
          }
          return absl::AlreadyExistsError(absl::StrCat("communicator ", name_,
                                                       " is in use: host slot ", old->creator_slot,
                                                       " made it and is alive"));
        }
        // Left behind by a dead job: its block is ours to reuse once none of
        // its ranks can write it any more. A rank that outlived the job's
        // rank 0 writes its abort and post lines at its next call: into
        // our instance, if we took the block now (issue 25, defect 5).
        if (old) {
          CXLRT_RETURN_IF_ERROR(AwaitStaleRanksGone(found->offset, found->size, *old, deadline));
        }
        CXLRT_LOG(kInfo) << "replacing stale communicator " << name_;
        absl::Status s = alloc_.FreeNamed(name_);
        if (!s.ok() && !absl::IsNotFound(s)) return s;
        continue;
      }
      if (!absl::IsNotFound(found.status())) return found.status();
      auto made = alloc_.AllocateNamed(name_, plan.total, {.alignment = 2 << 20});
      if (absl::IsAlreadyExists(made.status())) continue;
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("communicator ", name_, " of ", nranks_, " ranks needs ",
                                         plan.total, " bytes: ", made.status().message()));
      }
      block_ = *made;
      made_block_ = true;
      break;
    }
    // Control lines zeroed before the header is published: a joiner never
    // sees a previous user's flags.
    std::vector<uint8_t> zeros(plan.p2p_buffers_offset, 0);
    c_.CopyToPool(block_, zeros.data(), zeros.size());
    h.version = kCommVersion;
    h.nranks = nranks_;
    h.slot_bytes = options_.slot_bytes;
    h.p2p_bytes = options_.p2p_bytes;
    h.instance = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
    h.creator_slot = m.slot();
    h.creator_epoch = m.epoch();
    h.depth = options_.depth;
    h.p2p_buffers_offset = plan.p2p_buffers_offset;
    h.p2p_offset = plan.p2p_offset;
    h.magic = kCommMagic;
    h.checksum = HeaderChecksum(h);
    c_.PublishObject(block_, h);
  } else {
    // Wait for rank 0's block: a stale one from a dead job does not count,
    // and neither does an instance this rank's line of is taken. That line
    // is written once per instance (zeroed by rank 0 at creation), so a rank
    // that has left an instance, or re-creates a communicator right after
    // its Destroy, never joins the old instance again: rank 0's stale posts
    // there carry the same round numbers (issue 13, defect 2).
    absl::Status s = runtime::WaitUntil(
        [&] {
          auto found = alloc_.Find(name_);
          if (!found.ok()) return false;
          auto got = read_header(found->offset, found->size);
          if (!got || !creator_alive(*got)) return false;
          if (got->nranks == static_cast<uint32_t>(nranks_) &&
              found->size >=
                  sizeof(CommHeaderLayout) + uint64_t{got->nranks} * sizeof(RankLayout)) {
            const PoolOffset mine =
                found->offset + sizeof(CommHeaderLayout) + uint64_t(rank_) * sizeof(RankLayout);
            if (c_.LoadFlag(mine) != static_cast<uint64_t>(JoinState::kNone)) return false;
            // The header again: the line read above belongs to this instance
            // only if its header was in place before and after it (rank 0
            // clears a header before it frees the block and zeroes the lines
            // of a new one before publishing its header).
            auto again = read_header(found->offset, found->size);
            if (!again || again->instance != got->instance) return false;
          }
          h = *got;
          block_ = found->offset;
          return true;
        },
        deadline, "rank 0 to make the communicator");
    if (!s.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " waited ", absl::FormatDuration(options_.timeout),
                       " for rank 0 to make ", name_, ": ", s.message()));
    }
    if (h.nranks != static_cast<uint32_t>(nranks_)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " joins ", name_, " with ",
                                                     nranks_, " ranks, but rank 0 made it for ",
                                                     h.nranks));
    }
    // Every size in the header drives an access: check each against what
    // rank 0 can have written (Communicator() rounds both to 64 B) before
    // the plan multiplies them (issue 13, defect 8).
    if (!ValidBufferBytes(h.slot_bytes) || !ValidP2pBytes(h.p2p_bytes) || !ValidDepth(h.depth)) {
      return absl::DataLossError(absl::StrCat(
          "communicator ", name_, "'s header has slot_bytes ", h.slot_bytes, ", p2p_bytes ",
          h.p2p_bytes, " and depth ", h.depth, ": the sizes must be in [64, 1 GiB], multiples of ",
          "64 (p2p_bytes of ", kP2pAlign, "), the depth in [", kMinDepth, ", ", kMaxDepth, "]"));
    }
    const Plan plan = PlanFor(h.nranks, h.p2p_bytes);
    auto found = alloc_.Find(name_);
    if (!found.ok() || found->offset != block_ || found->size < plan.total ||
        h.p2p_buffers_offset != plan.p2p_buffers_offset || h.p2p_offset != plan.p2p_offset) {
      return absl::DataLossError(absl::StrCat("communicator ", name_, "'s header describes ",
                                              plan.total, " bytes that its block does not hold"));
    }
  }
  instance_ = h.instance;
  slot_bytes_ = h.slot_bytes;
  p2p_bytes_ = h.p2p_bytes;
  p2p_offset_ = h.p2p_offset;
  p2p_buffers_offset_ = h.p2p_buffers_offset;
  depth_ = h.depth;
  CXLRT_RETURN_IF_ERROR(AllocateSlots());

  JoinLayout me = {};
  me.instance = instance_;
  me.host_slot = m.slot();
  me.host_epoch = m.epoch();
  me.pid = static_cast<uint32_t>(getpid());
  RingLayout ring = {};
  for (uint32_t i = 0; i < depth_; ++i) ring.slot[i] = my_slots_[i];
  PublishBody(RankAt(rank_), &me, sizeof(me));
  c_.Publish(RankAt(rank_) + offsetof(RankLayout, ring), &ring, sizeof(ring));
  c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kJoined));

  peers_.assign(nranks_, JoinLayout{});
  peers_[rank_] = me;
  std::vector<RingLayout> rings(nranks_);
  rings[rank_] = ring;
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    absl::Status s = runtime::WaitUntil(
        [&] {
          // Joined, or joined and already gone (aborted or left: the first
          // wait of a call reports it).
          if (c_.LoadFlag(RankAt(j)) == static_cast<uint64_t>(JoinState::kNone)) return false;
          peers_[j] = c_.FetchObject<JoinLayout>(RankAt(j));
          rings[j] = c_.FetchObject<RingLayout>(RankAt(j) + offsetof(RankLayout, ring));
          return peers_[j].instance == instance_;
        },
        deadline, "every rank to join");
    if (s.ok()) {
      for (uint32_t i = 0; i < depth_; ++i) {
        const uint64_t slot = rings[j].slot[i];
        if (slot == 0 || slot > pool_.size() || slot_bytes_ > pool_.size() - slot) {
          return absl::DataLossError(absl::StrCat("rank ", j, " of ", name_,
                                                  " published a data slot at 0x", absl::Hex(slot),
                                                  " outside the pool"));
        }
      }
    }
    if (!s.ok()) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", j, " of ", name_,
                                                      " did not join within ",
                                                      absl::FormatDuration(options_.timeout)));
    }
  }
  transport_ = std::make_unique<PoolTransport>(PoolTransport::Setup{
      .coherence = &c_,
      .pool_size = pool_.size(),
      .name = name_,
      .nranks = nranks_,
      .rank = rank_,
      .block = block_,
      .instance = instance_,
      .slot_bytes = slot_bytes_,
      .depth = depth_,
      .rings = std::move(rings),
      .watch = watch_.get(),
      .membership = &alloc_.membership(),
      .spins = spins_,
      .drain = [this] { return DrainEngines(absl::Now() + options_.timeout); },
  });
  return absl::OkStatus();
}

Communicator::~Communicator() {
  if (!impl_->destroyed_) {
    absl::Status s = impl_->Destroy();
    if (!s.ok()) {
      CXLRT_LOG(kWarning) << "destroying communicator " << impl_->name_ << ": " << s;
    }
  }
}

absl::Status Communicator::Impl::Destroy() {
  if (destroyed_) return absl::FailedPreconditionError(name_ + " is already destroyed");
  Quiesce();
  proxy_.reset();
  const bool failed_before = !failed().ok();
  const absl::Status barrier = failed_before ? absl::OkStatus() : Barrier();
  destroyed_ = true;
  // What this rank frees must be unused first: its engines' copies write
  // its slots (and, when an engine publishes post lines, the block), and
  // after a failure a peer may still read a post from its slots or
  // buffers. A barrier that succeeded shows every peer read every post;
  // a failure shows nothing (issue 25, defect 6). When either wait runs
  // out, the memory is kept, not handed to the next allocation.
  const absl::Time deadline = absl::Now() + options_.timeout;
  const absl::Status drained = DrainEngines(deadline);
  absl::Status kept = drained;
  if (kept.ok() && !failed().ok()) kept = AwaitReadersDone(deadline);
  if (kept.ok()) {
    for (PoolOffset b : buffers_) (void)ReleaseBuffer(b);
    FreeSlots();
  } else {
    kept = absl::Status(kept.code(),
                        absl::StrCat(kept.message(), "; its ", my_slots_.size(), " data slots and ",
                                     buffers_.size(), " pool buffers are kept, not freed"));
    CXLRT_LOG(kWarning) << kept;
    for (PoolOffset& slot : my_slots_) slot = 0;
  }
  buffers_.clear();
  // The block may be recovered memory once this host is fenced: write only
  // under the lease (its peers see it fenced, which counts as gone).
  const bool may_write = alloc_.membership().ConfirmLease().ok();
  if (failed().ok() && may_write) {
    c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kLeft));
  }
  if (rank_ == 0) {
    // An engine that may still write post lines into the block keeps it.
    if (!drained.ok()) return kept;
    // The block goes only when no rank can write it any more: each rank has
    // left or aborted (its last write), or its host is dead by the
    // membership lease or restarted. A peer's departure says nothing about
    // the others (issue 13, defect 3).
    CXLRT_RETURN_IF_ERROR(AwaitEveryRankGone());
    CXLRT_RETURN_IF_ERROR(alloc_.membership().ConfirmLease());
    CommHeaderLayout h = {};
    c_.PublishObject(block_, h);  // no magic: nobody joins a freed block
    CXLRT_RETURN_IF_ERROR(alloc_.FreeNamed(name_));
  }
  // The call that failed before Destroy reported its error; a barrier that
  // fails here is reported here.
  return kept.ok() ? barrier : kept;
}

bool Communicator::Impl::HostGone(const JoinLayout& peer) const {
  auto host = alloc_.membership().Host(peer.host_slot);
  if (!host.ok()) return false;  // unreadable: keep waiting, within the deadline
  return host->record.epoch != peer.host_epoch || host->liveness == runtime::Liveness::kDead ||
         host->liveness == runtime::Liveness::kFenced || host->liveness == runtime::Liveness::kFree;
}

absl::Status Communicator::Impl::AwaitEveryRankGone() {
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (int j = 1; j < nranks_; ++j) {
    const JoinLayout& peer = peers_[j];
    auto gone = [&] {
      const auto state = static_cast<JoinState>(c_.LoadFlag(RankAt(j)));
      if (state == JoinState::kLeft || state == JoinState::kAborted) return true;
      return HostGone(peer);
    };
    absl::Status s = runtime::WaitUntil(gone, deadline, "a rank to leave", nullptr, kDataPathYield);
    if (!s.ok()) {
      // Freeing now would hand memory that rank j still writes to the next
      // allocation: keep the block (rank 0's next Create of this name says
      // it is in use) and say who is in the way.
      return absl::DeadlineExceededError(absl::StrCat(
          "rank 0 destroying ", name_, ": rank ", j, " (host slot ", peer.host_slot, ", pid ",
          peer.pid, ") neither left nor died within ", absl::FormatDuration(options_.timeout),
          "; the communicator's block is kept"));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::Impl::AwaitReadersDone(absl::Time deadline) {
  const uint64_t posted = transport_->published();
  if (posted == 0) return absl::OkStatus();
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    const JoinLayout& peer = peers_[j];
    uint64_t done = 0;
    // Read every post up to `posted` (done counters only grow), or can read
    // no more: it left (after a barrier over every post), aborted (its call
    // returned an error, whatever it read), or its host is gone.
    auto finished = [&] {
      done = c_.LoadFlag(transport_->DoneAt(j));
      if (done >= posted) return true;
      const auto state = static_cast<JoinState>(c_.LoadFlag(RankAt(j)));
      if (state == JoinState::kLeft || state == JoinState::kAborted) return true;
      return HostGone(peer);
    };
    absl::Status s = runtime::WaitUntil(finished, deadline, "a peer to read this rank's posts",
                                        nullptr, kDataPathYield);
    if (!s.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, " destroying ", name_, " after an error: rank ", j, " (host slot ",
          peer.host_slot, ", pid ", peer.pid, ") has read this rank's posts up to ", done, " of ",
          posted, " and neither left, aborted nor died by the deadline (",
          absl::FormatDuration(options_.timeout), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::Impl::AwaitStaleRanksGone(PoolOffset block, uint64_t size,
                                                     const CommHeaderLayout& old,
                                                     absl::Time deadline) {
  // Only lines the block holds: a header naming more ranks is corrupt, and
  // its lines past the block are no rank's.
  const uint64_t fit = (size - sizeof(CommHeaderLayout)) / sizeof(RankLayout);
  const uint64_t n = std::min<uint64_t>(old.nranks, fit);
  for (uint64_t j = 0; j < n; ++j) {
    const PoolOffset at = block + sizeof(CommHeaderLayout) + j * sizeof(RankLayout);
    JoinLayout peer = {};
    // Never joined (writes nothing), left or aborted (its last write), or
    // its host dead, fenced or restarted. The join line is written before
    // the state flag, for the instance the header names.
    auto gone = [&] {
      const auto state = static_cast<JoinState>(c_.LoadFlag(at));
      if (state != JoinState::kJoined) return true;
      peer = c_.FetchObject<JoinLayout>(at);
      if (peer.instance != old.instance) return true;  // not a line of that instance
      return HostGone(peer);
    };
    absl::Status s =
        runtime::WaitUntil(gone, deadline, "the old job's ranks to go", nullptr, kDataPathYield);
    if (!s.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "communicator ", name_, " is still in use: its maker (host slot ", old.creator_slot,
          ") is dead, but rank ", j, " of that job (host slot ", peer.host_slot, ", pid ", peer.pid,
          ") is alive and has neither left nor aborted within ",
          absl::FormatDuration(options_.timeout),
          "; it would write into a new instance. End it (its next call on the communicator "
          "aborts it), then create the communicator again"));
    }
  }
  return absl::OkStatus();
}

void Communicator::Impl::PublishBody(PoolOffset line, const void* obj, size_t size) {
  // Bytes after the flag word; Publish drops a stale copy of the flag line
  // first (the block may be a reused one), so the whole-line write-back
  // carries the pool's flag, not one of a previous instance.
  c_.Publish(line + sizeof(uint64_t), static_cast<const uint8_t*>(obj) + sizeof(uint64_t),
             size - sizeof(uint64_t));
}

absl::Status Communicator::Impl::AllocateSlots() {
  const uint32_t devices = pool_.devices().count();
  my_slots_.assign(depth_, 0);
  for (uint32_t p = 0; p < depth_; ++p) {
    allocator::AllocOptions o;
    o.alignment = 4096;
    if (devices > 1) o.device = static_cast<int>((rank_ + p) % devices);
    auto slot = alloc_.Allocate(slot_bytes_, o);
    if (!slot.ok()) {
      FreeSlots();
      return absl::Status(slot.status().code(),
                          absl::StrCat("rank ", rank_, " of ", name_, ": its data slot of ",
                                       slot_bytes_, " bytes: ", slot.status().message()));
    }
    my_slots_[p] = *slot;
  }
  return absl::OkStatus();
}

void Communicator::Impl::FreeSlots() {
  for (PoolOffset& s : my_slots_) {
    if (s != 0) (void)alloc_.Free(s);
    s = 0;
  }
}

}  // namespace cxlrt::collectives
