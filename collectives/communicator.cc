#include "collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/checksum.h"
#include "runtime/config.h"
#include "runtime/fault.h"
#include "runtime/log.h"
#include "runtime/membership.h"
#include "runtime/status_macros.h"

namespace cxlrt::collectives {
namespace {

using runtime::PoolOffset;

constexpr uint64_t kAlign = 4096;
constexpr PoolOffset kNotInPool = ~PoolOffset{0};

// Chunks of `chunk` that cover `total`: at least one, so that a call of no
// elements still runs a round (and the ranks still check each other's call).
size_t Chunks(size_t total, size_t chunk) { return total == 0 ? 1 : (total + chunk - 1) / chunk; }
// Data-path waits yield (rather than sleep) this long: a peer is normally
// microseconds away, and a sleep overshoots by tens of them.
constexpr absl::Duration kYieldFor = absl::Milliseconds(20);

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

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

// Slot and p2p buffer sizes a header may carry: a multiple of 64 in
// [64, 1 GiB] (rank 0 rounds what it is given up to 64 B).
bool ValidBufferBytes(uint64_t v) { return v >= 64 && v <= (1ull << 30) && v % 64 == 0; }

absl::StatusOr<int> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return absl::NotFoundError(name);
  int out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not a rank or size"));
  }
  return out;
}

}  // namespace

const char* CollKindName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce:
      return "AllReduce";
    case CollKind::kReduceScatter:
      return "ReduceScatter";
    case CollKind::kAllGather:
      return "AllGather";
    case CollKind::kBroadcast:
      return "Broadcast";
    case CollKind::kReduce:
      return "Reduce";
    case CollKind::kGather:
      return "Gather";
    case CollKind::kScatter:
      return "Scatter";
    case CollKind::kAllToAll:
      return "AllToAll";
    case CollKind::kBarrier:
      return "Barrier";
  }
  return "?";
}

absl::StatusOr<RankInfo> RankFromEnvironment() {
  static const struct {
    const char* rank;
    const char* size;
    const char* source;
  } kLaunchers[] = {
      {"CXLRT_RANK", "CXLRT_WORLD_SIZE", "cxlrt run"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"},
      {"PMI_RANK", "PMI_SIZE", "mpirun (PMI)"},
      {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
      {"RANK", "WORLD_SIZE", "torchrun"},
  };
  for (const auto& l : kLaunchers) {
    auto rank = EnvInt(l.rank);
    if (absl::IsNotFound(rank.status())) continue;
    if (!rank.ok()) return rank.status();
    auto size = EnvInt(l.size);
    if (!size.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(l.rank, " is set but ", l.size, " is not: ", size.status().message()));
    }
    if (*size < 1 || *rank >= *size) {
      return absl::InvalidArgumentError(
          absl::StrCat(l.rank, "=", *rank, " is not below ", l.size, "=", *size));
    }
    return RankInfo{*rank, *size, l.source};
  }
  return absl::NotFoundError(
      "no rank in the environment (CXLRT_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or "
      "RANK): pass the rank and size");
}

// Ends a wait early when a peer has died, was fenced, left or aborted, or
// when this host was fenced.
class Communicator::PeerWatch : public runtime::WaitWatch {
 public:
  explicit PeerWatch(Communicator& comm) : comm_(comm) {}
  absl::Status Check() override {
    Communicator& c = comm_;
    runtime::Membership& m = c.alloc_.membership();
    if (m.fenced()) {
      return absl::AbortedError(
          absl::StrCat("rank ", c.rank_, " of ", c.name_, ": this host was fenced from the pool"));
    }
    for (int j = 0; j < c.nranks_; ++j) {
      if (j == c.rank_) continue;
      const JoinLayout& peer = c.peers_[j];
      const auto state = static_cast<JoinState>(
          c.c_.LoadFlag(c.RankAt(j) + offsetof(RankLayout, join) + offsetof(JoinLayout, state)));
      if (state == JoinState::kAborted) {
        return absl::AbortedError(absl::StrCat("rank ", j, " aborted communicator ", c.name_));
      }
      if (state == JoinState::kLeft) {
        return absl::AbortedError(absl::StrCat("rank ", j, " left communicator ", c.name_));
      }
      auto host = m.Host(peer.host_slot);
      const bool alive = host.ok() && host->record.epoch == peer.host_epoch &&
                         (host->liveness == runtime::Liveness::kAlive ||
                          host->liveness == runtime::Liveness::kSelf);
      if (!alive) {
        return absl::AbortedError(absl::StrCat(
            "rank ", j, " of ", c.name_, " (host slot ", peer.host_slot, ", pid ", peer.pid,
            ") is ", host.ok() ? runtime::LivenessName(host->liveness) : "unreadable",
            host.ok() && host->record.epoch != peer.host_epoch ? " (restarted)" : ""));
      }
    }
    return absl::OkStatus();
  }

 private:
  Communicator& comm_;
};

Communicator::Communicator(allocator::Allocator& alloc, std::string name, int nranks, int rank,
                           const CommOptions& options)
    : alloc_(alloc),
      pool_(alloc.pool()),
      c_(alloc.pool().coherence()),
      name_(std::move(name)),
      nranks_(nranks),
      rank_(rank),
      options_(options) {
  const runtime::Config& cfg = runtime::GetConfig();
  if (options_.timeout <= absl::ZeroDuration()) {
    options_.timeout = absl::Milliseconds(cfg.comm_timeout_ms);
  }
  if (options_.slot_bytes == 0) options_.slot_bytes = cfg.comm_slot_bytes;
  if (options_.p2p_bytes == 0) options_.p2p_bytes = cfg.comm_p2p_bytes;
  if (options_.oneshot_max == 0) options_.oneshot_max = cfg.allreduce_oneshot_max;
  options_.slot_bytes = RoundUp(options_.slot_bytes, 64);
  options_.p2p_bytes = RoundUp(options_.p2p_bytes, 64);
  watch_ = std::make_unique<PeerWatch>(*this);
  // More ranks than cores (emulated hosts on one machine): a waiter that
  // spins holds the core its peer needs, so it yields almost at once.
  if (static_cast<unsigned>(nranks) > std::max(1u, std::thread::hardware_concurrency())) {
    spins_ = 50;
  }
  posts_.resize(nranks);
  sent_.assign(nranks, 0);
  received_.assign(nranks, 0);
}

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
  if (nranks < 1 || nranks > 1024 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", nranks, " ranks: need 0 <= rank < size <= 1024"));
  }
  std::unique_ptr<Communicator> comm(
      new Communicator(alloc, absl::StrCat("comm/", name), nranks, rank, options));
  absl::Status joined = comm->Join();
  if (!joined.ok()) {
    // Nothing to leave; a block this rank made for nobody goes.
    comm->destroyed_ = true;
    comm->FreeSlots();
    if (comm->made_block_) {
      // Ranks may still wait for this block: unpublish it before it goes, so
      // none joins memory the allocator hands to someone else.
      comm->c_.PublishObject(comm->block_, CommHeaderLayout{});
      (void)alloc.FreeNamed(comm->name_);
    }
    return joined;
  }
  return comm;
}

absl::Status Communicator::Join() {
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
    if (!ValidBufferBytes(options_.slot_bytes) || !ValidBufferBytes(options_.p2p_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator ", name_, ": slot_bytes ", options_.slot_bytes,
                       " and p2p_bytes ", options_.p2p_bytes, " must each be in [64, 1 GiB]"));
    }
    const Plan plan = PlanFor(nranks_, options_.p2p_bytes);
    // A host is alive while this process sees its heartbeat move within its
    // lease, so a creator watched for less than a lease may be dead already
    // (a job re-run right after one that crashed): look again until a whole
    // lease has passed (within the deadline) before calling it in use.
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
            settled = self ? absl::Now() : std::min(absl::Now() + lease + kYieldFor, deadline);
          }
          if (absl::Now() < settled) {
            absl::SleepFor(kYieldFor);
            continue;
          }
          return absl::AlreadyExistsError(absl::StrCat("communicator ", name_,
                                                       " is in use: host slot ", old->creator_slot,
                                                       " made it and is alive"));
        }
        // Left behind by a dead job: its block is ours to reuse.
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
    if (!ValidBufferBytes(h.slot_bytes) || !ValidBufferBytes(h.p2p_bytes)) {
      return absl::DataLossError(absl::StrCat("communicator ", name_, "'s header has slot_bytes ",
                                              h.slot_bytes, " and p2p_bytes ", h.p2p_bytes,
                                              ": each must be a multiple of 64 in [64, 1 GiB]"));
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
  CXLRT_RETURN_IF_ERROR(AllocateSlots());

  JoinLayout me = {};
  me.instance = instance_;
  me.host_slot = m.slot();
  me.host_epoch = m.epoch();
  me.pid = static_cast<uint32_t>(getpid());
  me.slots[0] = my_slots_[0];
  me.slots[1] = my_slots_[1];
  PublishBody(RankAt(rank_), &me, sizeof(me));
  c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kJoined));

  peers_.assign(nranks_, JoinLayout{});
  peers_[rank_] = me;
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    absl::Status s = runtime::WaitUntil(
        [&] {
          // Joined, or joined and already gone (aborted or left: the first
          // wait of a call reports it).
          if (c_.LoadFlag(RankAt(j)) == static_cast<uint64_t>(JoinState::kNone)) return false;
          peers_[j] = c_.FetchObject<JoinLayout>(RankAt(j));
          return peers_[j].instance == instance_;
        },
        deadline, "every rank to join");
    if (s.ok()) {
      for (uint64_t slot : peers_[j].slots) {
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
  return absl::OkStatus();
}

Communicator::~Communicator() {
  if (!destroyed_) {
    absl::Status s = Destroy();
    if (!s.ok()) {
      CXLRT_LOG(kWarning) << "destroying communicator " << name_ << ": " << s;
    }
  }
}

absl::Status Communicator::Destroy() {
  if (destroyed_) return absl::FailedPreconditionError(name_ + " is already destroyed");
  const bool failed_before = !failed_.ok();
  const absl::Status barrier = failed_before ? absl::OkStatus() : Barrier();
  destroyed_ = true;
  for (PoolOffset b : buffers_) (void)alloc_.Free(b);
  buffers_.clear();
  FreeSlots();  // after the barrier: nobody reads them any more
  if (failed_.ok()) c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kLeft));
  if (rank_ == 0) {
    // The block goes only when no rank can write it any more: each rank has
    // left or aborted (its last write), or its host is dead by the
    // membership lease or restarted. A peer's departure says nothing about
    // the others (issue 13, defect 3).
    CXLRT_RETURN_IF_ERROR(AwaitEveryRankGone());
    CommHeaderLayout h = {};
    c_.PublishObject(block_, h);  // no magic: nobody joins a freed block
    CXLRT_RETURN_IF_ERROR(alloc_.FreeNamed(name_));
  }
  // The call that failed before Destroy reported its error; a barrier that
  // fails here is reported here.
  return barrier;
}

absl::Status Communicator::AwaitEveryRankGone() {
  runtime::Membership& m = alloc_.membership();
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (int j = 1; j < nranks_; ++j) {
    const JoinLayout& peer = peers_[j];
    auto gone = [&] {
      const auto state = static_cast<JoinState>(c_.LoadFlag(RankAt(j)));
      if (state == JoinState::kLeft || state == JoinState::kAborted) return true;
      auto host = m.Host(peer.host_slot);
      if (!host.ok()) return false;  // unreadable: keep waiting, within the deadline
      return host->record.epoch != peer.host_epoch || host->liveness == runtime::Liveness::kDead ||
             host->liveness == runtime::Liveness::kFenced ||
             host->liveness == runtime::Liveness::kFree;
    };
    absl::Status s = runtime::WaitUntil(gone, deadline, "a rank to leave", nullptr, kYieldFor);
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

void Communicator::PublishBody(PoolOffset line, const void* obj, size_t size) {
  // Bytes after the flag word; Publish drops a stale copy of the flag line
  // first (the block may be a reused one), so the whole-line write-back
  // carries the pool's flag, not one of a previous instance.
  c_.Publish(line + sizeof(uint64_t), static_cast<const uint8_t*>(obj) + sizeof(uint64_t),
             size - sizeof(uint64_t));
}

absl::Status Communicator::AllocateSlots() {
  const uint32_t devices = pool_.devices().count();
  for (int p = 0; p < 2; ++p) {
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

void Communicator::FreeSlots() {
  for (PoolOffset& s : my_slots_) {
    if (s != 0) (void)alloc_.Free(s);
    s = 0;
  }
}

void Communicator::Abort(absl::string_view why) {
  if (failed_.ok()) {
    failed_ = absl::AbortedError(absl::StrCat(name_, " rank ", rank_, ": ", why));
  }
  c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kAborted));
}

absl::Status Communicator::Fail(absl::Status s) {
  if (failed_.ok()) {
    failed_ = s;
    c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kAborted));
  }
  return s;
}

std::string Communicator::Describe(const CallDesc& d) const {
  const auto kind = static_cast<CollKind>(d.kind);
  std::string s = absl::StrCat(CollKindName(kind), "(count=", d.count);
  if (kind != CollKind::kBarrier) {
    absl::StrAppend(&s, ", ", DataTypeName(static_cast<DataType>(d.type)));
  }
  if (kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
      kind == CollKind::kReduceScatter) {
    absl::StrAppend(&s, ", ", RedOpName(static_cast<RedOp>(d.op)));
  }
  if (d.root >= 0) absl::StrAppend(&s, ", root=", d.root);
  absl::StrAppend(&s, ") [call ", d.call, "]");
  return s;
}

std::optional<PoolOffset> Communicator::InPool(const void* p, size_t len) const {
  const uint8_t* base = pool_.backend().base();
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < base || b >= base + pool_.size() ||
      len > static_cast<uint64_t>(base + pool_.size() - b)) {
    return std::nullopt;
  }
  return static_cast<PoolOffset>(b - base);
}

std::optional<PoolOffset> Communicator::ZeroCopyAt(const void* p, size_t len) const {
  auto at = InPool(p, len);
  if (at && *at % SizeOf(static_cast<DataType>(desc_.type)) != 0) return std::nullopt;
  return at;
}

absl::Status Communicator::Begin(CollKind kind, DataType type, RedOp op, size_t count, int root) {
  if (destroyed_) return absl::FailedPreconditionError(name_ + " was destroyed");
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " was aborted by an earlier error: ", failed_.message()));
  }
  if (root >= nranks_ || (root < 0 && (kind == CollKind::kBroadcast || kind == CollKind::kReduce ||
                                       kind == CollKind::kGather || kind == CollKind::kScatter))) {
    return absl::InvalidArgumentError(
        absl::StrCat(CollKindName(kind), ": root ", root, " is not a rank of ", nranks_));
  }
  if (static_cast<int>(type) >= kNumDataTypes || static_cast<int>(op) >= kNumRedOps) {
    return absl::InvalidArgumentError(absl::StrCat(CollKindName(kind), ": unknown type or op"));
  }
  desc_ = {};
  desc_.kind = static_cast<uint8_t>(kind);
  desc_.type = static_cast<uint8_t>(type);
  desc_.op = static_cast<uint8_t>(op);
  desc_.root = root;
  desc_.count = count;
  desc_.call = ++calls_;
  deadline_ = absl::Now() + options_.timeout;
  return absl::OkStatus();
}

absl::Status Communicator::WaitSlotFree(uint64_t round) {
  // Round k reuses the slot and post line of round k - 2: every peer must be
  // done reading them.
  if (round <= 2) return absl::OkStatus();
  return AwaitPeersDone(round - 2);
}

absl::Status Communicator::AwaitPeersDone(uint64_t round) {
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    const PoolOffset done = RankAt(j) + offsetof(RankLayout, done);
    if (c_.LoadFlag(done) >= round) continue;
    absl::Status s =
        runtime::WaitUntil([&] { return c_.LoadFlag(done) >= round; }, deadline_,
                           "a peer to finish reading", watch_.get(), kYieldFor, spins_);
    if (!s.ok()) {
      return Fail(
          absl::Status(s.code(), absl::StrCat(name_, " rank ", rank_, " in ", Describe(desc_),
                                              ": waiting for rank ", j, ": ", s.message())));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckPost(int j, uint64_t round) {
  posts_[j] = c_.FetchObject<PostLayout>(PostAt(j, round));
  const PostLayout& p = posts_[j];
  if (p.instance != instance_) {
    return absl::DataLossError(absl::StrCat("rank ", j, " of ", name_, " posted round ", p.round,
                                            " for communicator instance ", absl::Hex(p.instance),
                                            ", not this one (", absl::Hex(instance_), ")"));
  }
  if (p.round == round && p.desc == desc_) {
    // Every post fits a slot (chunks follow the slot size, in place too);
    // its bytes lie in the pool before anyone reads them.
    if (p.len > kInlineBytes &&
        (p.len > slot_bytes_ || p.data > pool_.size() || p.len > pool_.size() - p.data ||
         p.data % SizeOf(static_cast<DataType>(desc_.type)) != 0)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", j, " of ", name_, " posted ", p.len, " bytes at 0x", absl::Hex(p.data),
          ": outside the pool, larger than a slot or not aligned to its elements"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      posts_[j].round != round
          ? absl::StrCat("rank ", rank_, " of ", name_, " is at round ", round, " of ",
                         Describe(desc_), " but rank ", j, " is at round ", posts_[j].round, " (",
                         Describe(posts_[j].desc), ")")
          : absl::StrCat("rank ", rank_, " called ", Describe(desc_), " but rank ", j, " called ",
                         Describe(posts_[j].desc), " on ", name_));
}

absl::Status Communicator::WaitPosted(uint64_t round) {
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    const PoolOffset at = PostAt(j, round);
    auto ready = [&] { return c_.LoadFlag(at) >= round; };
    if (!ready()) {
      absl::Status s =
          runtime::WaitUntil(ready, deadline_, "a peer's post", watch_.get(), kYieldFor, spins_);
      if (!s.ok()) {
        // A peer that saw a mismatched call aborts; a rank waiting on another
        // peer meanwhile reports the mismatch too when the posts show it.
        for (int k = 0; k < nranks_; ++k) {
          if (k == rank_ || c_.LoadFlag(PostAt(k, round)) != round) continue;
          if (absl::Status m = CheckPost(k, round); !m.ok()) return Fail(m);
        }
        return Fail(
            absl::Status(s.code(), absl::StrCat(name_, " rank ", rank_, " in ", Describe(desc_),
                                                ": waiting for rank ", j, ": ", s.message())));
      }
    }
    if (absl::Status m = CheckPost(j, round); !m.ok()) return Fail(m);
  }
  return absl::OkStatus();
}

absl::Status Communicator::Exchange(const std::vector<Piece>& pieces) {
  const uint64_t round = round_ + 1;
  CXLRT_RETURN_IF_ERROR(WaitSlotFree(round));
  PostLayout post = {};
  post.instance = instance_;
  post.desc = desc_;
  size_t len = 0;
  for (const Piece& p : pieces) len = std::max(len, (p.at == kNext ? len : p.at) + p.len);
  post.len = len;
  if (len > std::max<size_t>(slot_bytes_, kInlineBytes)) {
    return Fail(absl::InternalError(absl::StrCat("a round of ", len, " bytes > the slot")));
  }
  uint8_t* inline_at = len <= kInlineBytes ? post.inline_bytes : nullptr;
  const PoolOffset slot = SlotAt(rank_, round);
  size_t at = 0;
  for (const Piece& p : pieces) {
    if (p.at != kNext) at = p.at;
    if (p.len && inline_at) std::memcpy(inline_at + at, p.data, p.len);
    if (p.len && !inline_at) c_.CopyToPool(slot + at, p.data, p.len);
    at += p.len;
  }
  if (!inline_at) post.data = slot;
  const PoolOffset line = PostAt(rank_, round);
  PublishBody(line, &post, sizeof(post));
  CXLRT_FAULT_POINT("coll.round.posted");
  c_.StoreFlag(line, round);
  return WaitPosted(round);
}

absl::Status Communicator::ExchangeInPlace(PoolOffset at, size_t len) {
  const uint64_t round = round_ + 1;
  CXLRT_RETURN_IF_ERROR(WaitSlotFree(round));
  PostLayout post = {};
  post.instance = instance_;
  post.desc = desc_;
  post.len = len;
  post.data = at;
  if (len <= kInlineBytes) {
    c_.Fetch(post.inline_bytes, at, len);
    post.data = 0;
  } else {
    // The caller wrote its buffer with plain stores: write them back before
    // the post makes them visible (a fence in the hardware domain).
    c_.Flush(at, len);
  }
  const PoolOffset line = PostAt(rank_, round);
  PublishBody(line, &post, sizeof(post));
  CXLRT_FAULT_POINT("coll.round.posted");
  c_.StoreFlag(line, round);
  return WaitPosted(round);
}

absl::StatusOr<const uint8_t*> Communicator::PeerBytes(int j, size_t need) {
  const PostLayout& p = posts_[j];
  if (need > p.len) {
    // Every rank runs the same call (CheckPost compared them), so a peer
    // that posted fewer bytes than the call implies wrote a corrupt post:
    // reading on would read past its data (issue 13, defect 7).
    return Fail(absl::DataLossError(absl::StrCat("rank ", j, " of ", name_, " posted ", p.len,
                                                 " bytes in ", Describe(desc_), " but rank ", rank_,
                                                 " needs ", need, " of them")));
  }
  if (p.len <= kInlineBytes) return p.inline_bytes;
  return c_.BeginRead(p.data, p.len);
}

void Communicator::EndRound() {
  ++round_;
  c_.StoreFlag(RankAt(rank_) + offsetof(RankLayout, done), round_);
}

// --- Collectives ---
//
// Each is a loop over chunks, one or two rounds a chunk. A chunk's bytes
// from one rank fit its slot; in-place (pool-resident) buffers need no slot
// and go in one chunk.

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     RedOp op) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kAllReduce, type, op, count, -1));
  const size_t es = SizeOf(type);
  const size_t bytes = count * es;
  auto* out = static_cast<uint8_t*>(recv);
  const auto* in = static_cast<const uint8_t*>(send);
  std::vector<const void*> srcs(nranks_);
  // The send buffer's offset when it lies in the pool (posted in place).
  const PoolOffset zc_in = send != recv ? ZeroCopyAt(send, bytes).value_or(kNotInPool) : kNotInPool;
  const bool zc = zc_in != kNotInPool;
  if (bytes <= options_.oneshot_max || nranks_ == 1) {
    // One-shot: every rank reads every rank's chunk and reduces, in rank
    // order (so every rank gets the same bits).
    // Chunks follow the slot size on every rank, in place or not: ranks
    // choose in-place posting each for itself, and must still run the same
    // rounds.
    const size_t chunk = slot_bytes_ / es * es;
    for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
      const size_t len = std::min(chunk, bytes - at);
      if (zc) {
        CXLRT_RETURN_IF_ERROR(ExchangeInPlace(zc_in + at, len));
      } else {
        CXLRT_RETURN_IF_ERROR(Exchange({{in + at, len}}));
      }
      for (int j = 0; j < nranks_; ++j) {
        if (j == rank_) {
          srcs[j] = in + at;
        } else {
          CXLRT_ASSIGN_OR_RETURN(srcs[j], PeerBytes(j, len));
        }
      }
      collectives::Reduce(type, op, out + at, srcs.data(), nranks_, len / es, nranks_);
      EndRound();
    }
    if (zc) CXLRT_RETURN_IF_ERROR(AwaitPeersDone(round_));
    return absl::OkStatus();
  }
  // Two-shot: round A posts the chunk (in place when the send buffer lies in
  // the pool), and each rank reduces its shard of it from every rank; round
  // B posts the reduced shard through the slot, and each rank copies the
  // others'. A rank's own shard never goes through the pool. Round B always
  // copies: a peer that reads lines this core has just written pulls them
  // out of its cache, which is slower here than reading them from memory
  // after non-temporal stores.
  const size_t chunk_elems = std::max<size_t>(1, slot_bytes_ / es);  // same on every rank
  for (size_t first = 0; first < count; first += chunk_elems) {
    const size_t m = std::min(chunk_elems, count - first);
    const size_t lo = m * rank_ / nranks_, hi = m * (rank_ + 1) / nranks_;
    if (zc) {
      CXLRT_RETURN_IF_ERROR(ExchangeInPlace(zc_in + first * es, m * es));
    } else {
      // Peers read every shard but ours: ours stays out of the pool.
      const uint8_t* chunk = in + first * es;
      CXLRT_RETURN_IF_ERROR(
          Exchange({{chunk, lo * es, 0}, {chunk + hi * es, (m - hi) * es, hi * es}}));
    }
    for (int j = 0; j < nranks_; ++j) {
      if (j == rank_) {
        srcs[j] = in + (first + lo) * es;
      } else {
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, PeerBytes(j, hi * es));
        srcs[j] = peer + lo * es;
      }
    }
    uint8_t* mine = out + (first + lo) * es;
    collectives::Reduce(type, op, mine, srcs.data(), nranks_, hi - lo, nranks_);
    EndRound();
    CXLRT_RETURN_IF_ERROR(Exchange({{mine, (hi - lo) * es}}));
    for (int j = 0; j < nranks_; ++j) {
      if (j == rank_) continue;
      const size_t jlo = m * j / nranks_, jhi = m * (j + 1) / nranks_;
      if (jhi == jlo) continue;
      CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, PeerBytes(j, (jhi - jlo) * es));
      runtime::CopyBytes(out + (first + jlo) * es, peer, (jhi - jlo) * es);
    }
    EndRound();
  }
  // Every peer posted its last round B after reading our last chunk in
  // round A: the send buffer is ours again without a further wait.
  return absl::OkStatus();
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                         DataType type, RedOp op) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kReduceScatter, type, op, recvcount, -1));
  const size_t es = SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t per = std::max<size_t>(1, slot_bytes_ / es / nranks_);
  std::vector<const void*> srcs(nranks_);
  std::vector<Piece> pieces(nranks_);
  for (size_t k = 0, first = 0; k < Chunks(recvcount, per); ++k, first += per) {
    const size_t m = std::min(per, recvcount - first);
    // Piece j at j * m in the slot; ours stays out of the pool.
    pieces.clear();
    for (int j = 0; j < nranks_; ++j) {
      if (j != rank_) pieces.push_back({in + (j * recvcount + first) * es, m * es, j * m * es});
    }
    CXLRT_RETURN_IF_ERROR(Exchange(pieces));
    for (int j = 0; j < nranks_; ++j) {
      if (j == rank_) {
        srcs[j] = in + (rank_ * recvcount + first) * es;
      } else {
        CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, PeerBytes(j, (rank_ + 1) * m * es));
        srcs[j] = peer + rank_ * m * es;
      }
    }
    collectives::Reduce(type, op, out + first * es, srcs.data(), nranks_, m, nranks_);
    EndRound();
  }
  return absl::OkStatus();
}

absl::Status Communicator::AllGather(const void* send, void* recv, size_t sendcount,
                                     DataType type) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kAllGather, type, RedOp::kSum, sendcount, -1));
  const size_t es = SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = sendcount * es;
  const auto zc = ZeroCopyAt(send, bytes);
  const size_t chunk = slot_bytes_ / es * es;  // same on every rank, in place or not
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    if (zc) {
      CXLRT_RETURN_IF_ERROR(ExchangeInPlace(*zc + at, len));
    } else {
      CXLRT_RETURN_IF_ERROR(Exchange({{in + at, len}}));
    }
    for (int j = 0; j < nranks_; ++j) {
      uint8_t* dst = out + j * bytes + at;
      const uint8_t* src = in + at;
      if (j != rank_) {
        CXLRT_ASSIGN_OR_RETURN(src, PeerBytes(j, len));
      }
      if (len && dst != src) runtime::CopyBytes(dst, src, len);
    }
    EndRound();
  }
  if (zc) CXLRT_RETURN_IF_ERROR(AwaitPeersDone(round_));
  return absl::OkStatus();
}

absl::Status Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type,
                                     int root) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kBroadcast, type, RedOp::kSum, count, root));
  const size_t es = SizeOf(type);
  const size_t bytes = count * es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const bool is_root = rank_ == root;
  const auto zc = is_root ? ZeroCopyAt(send, bytes) : std::nullopt;
  // Every rank runs the same chunks: the root's choice of in-place is
  // not known to the others, so chunks follow the slot size.
  const size_t chunk = slot_bytes_ / es * es;
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    if (is_root && zc) {
      CXLRT_RETURN_IF_ERROR(ExchangeInPlace(*zc + at, len));
    } else {
      CXLRT_RETURN_IF_ERROR(
          Exchange(is_root ? std::vector<Piece>{{in + at, len}} : std::vector<Piece>{}));
    }
    if (!is_root && len) {
      CXLRT_ASSIGN_OR_RETURN(const uint8_t* src, PeerBytes(root, len));
      runtime::CopyBytes(out + at, src, len);
    }
    if (is_root && len && out != in) runtime::CopyBytes(out + at, in + at, len);
    EndRound();
  }
  if (zc) CXLRT_RETURN_IF_ERROR(AwaitPeersDone(round_));
  return absl::OkStatus();
}

absl::Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType type,
                                  RedOp op, int root) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kReduce, type, op, count, root));
  const size_t es = SizeOf(type);
  const size_t bytes = count * es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  std::vector<const void*> srcs(nranks_);
  const size_t chunk = slot_bytes_ / es * es;
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(
        Exchange(rank_ == root ? std::vector<Piece>{} : std::vector<Piece>{{in + at, len}}));
    if (rank_ == root) {
      for (int j = 0; j < nranks_; ++j) {
        if (j == rank_) {
          srcs[j] = in + at;
        } else {
          CXLRT_ASSIGN_OR_RETURN(srcs[j], PeerBytes(j, len));
        }
      }
      collectives::Reduce(type, op, out + at, srcs.data(), nranks_, len / es, nranks_);
    }
    EndRound();
  }
  return absl::OkStatus();
}

absl::Status Communicator::Gather(const void* send, void* recv, size_t sendcount, DataType type,
                                  int root) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kGather, type, RedOp::kSum, sendcount, root));
  const size_t es = SizeOf(type);
  const size_t bytes = sendcount * es;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t chunk = slot_bytes_ / es * es;
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    CXLRT_RETURN_IF_ERROR(
        Exchange(rank_ == root ? std::vector<Piece>{} : std::vector<Piece>{{in + at, len}}));
    if (rank_ == root) {
      for (int j = 0; j < nranks_; ++j) {
        uint8_t* dst = out + j * bytes + at;
        const uint8_t* src = in + at;
        if (j != rank_) {
          CXLRT_ASSIGN_OR_RETURN(src, PeerBytes(j, len));
        }
        if (len && dst != src) runtime::CopyBytes(dst, src, len);
      }
    }
    EndRound();
  }
  return absl::OkStatus();
}

absl::Status Communicator::Scatter(const void* send, void* recv, size_t recvcount, DataType type,
                                   int root) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kScatter, type, RedOp::kSum, recvcount, root));
  const size_t es = SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t per = std::max<size_t>(1, slot_bytes_ / es / nranks_);
  std::vector<Piece> pieces;
  for (size_t k = 0, first = 0; k < Chunks(recvcount, per); ++k, first += per) {
    const size_t m = std::min(per, recvcount - first);
    pieces.clear();
    if (rank_ == root) {
      for (int j = 0; j < nranks_; ++j) {
        if (j != rank_) pieces.push_back({in + (j * recvcount + first) * es, m * es, j * m * es});
      }
    }
    CXLRT_RETURN_IF_ERROR(Exchange(pieces));
    uint8_t* dst = out + first * es;
    const uint8_t* src = in + (rank_ * recvcount + first) * es;
    if (rank_ != root) {
      CXLRT_ASSIGN_OR_RETURN(src, PeerBytes(root, (rank_ + 1) * m * es));
      src += rank_ * m * es;
    }
    if (m && dst != src) runtime::CopyBytes(dst, src, m * es);
    EndRound();
  }
  return absl::OkStatus();
}

absl::Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType type) {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kAllToAll, type, RedOp::kSum, count, -1));
  const size_t es = SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t per = std::max<size_t>(1, slot_bytes_ / es / nranks_);
  std::vector<Piece> pieces(nranks_);
  for (size_t k = 0, first = 0; k < Chunks(count, per); ++k, first += per) {
    const size_t m = std::min(per, count - first);
    pieces.clear();
    for (int j = 0; j < nranks_; ++j) {
      if (j != rank_) pieces.push_back({in + (j * count + first) * es, m * es, j * m * es});
    }
    CXLRT_RETURN_IF_ERROR(Exchange(pieces));
    // In place, our own piece for us is already where it belongs; the
    // others' pieces land over ones we posted (copied into the slot).
    if (m && out != in) {
      runtime::CopyBytes(out + (rank_ * count + first) * es, in + (rank_ * count + first) * es,
                         m * es);
    }
    for (int j = 0; j < nranks_; ++j) {
      if (j == rank_ || m == 0) continue;
      CXLRT_ASSIGN_OR_RETURN(const uint8_t* peer, PeerBytes(j, (rank_ + 1) * m * es));
      runtime::CopyBytes(out + (j * count + first) * es, peer + rank_ * m * es, m * es);
    }
    EndRound();
  }
  return absl::OkStatus();
}

absl::Status Communicator::Barrier() {
  CXLRT_RETURN_IF_ERROR(Begin(CollKind::kBarrier, DataType::kUint8, RedOp::kSum, 0, -1));
  CXLRT_RETURN_IF_ERROR(Exchange({}));
  EndRound();
  return absl::OkStatus();
}

absl::Status Communicator::Send(const void* buf, size_t count, DataType type, int peer) {
  if (!failed_.ok() || destroyed_) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send to rank ", peer, " from rank ", rank_, " of ", nranks_));
  }
  deadline_ = absl::Now() + options_.timeout;
  const size_t bytes = count * SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(buf);
  const PoolOffset line = P2pAt(rank_, peer);
  const PoolOffset consumed = line + offsetof(P2pLayout, consumed);
  for (size_t k = 0, at = 0; k < Chunks(bytes, p2p_bytes_); ++k, at += p2p_bytes_) {
    const size_t len = std::min<size_t>(p2p_bytes_, bytes - at);
    const uint64_t seq = ++sent_[peer];
    absl::Status s = runtime::WaitUntil([&] { return c_.LoadFlag(consumed) + 1 >= seq; }, deadline_,
                                        "the receiver", watch_.get(), kYieldFor, spins_);
    if (!s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("Send from rank ", rank_, " to rank ", peer,
                                                      " of ", name_, ": ", s.message())));
    }
    c_.CopyToPool(P2pBufferAt(rank_, peer), in + at, len);
    P2pLayout p = {};
    p.bytes = len;
    p.total = count;
    p.type = static_cast<uint64_t>(type);
    p.instance = instance_;
    PublishBody(line, &p, offsetof(P2pLayout, pad0));
    c_.StoreFlag(line, seq);
  }
  return absl::OkStatus();
}

absl::Status Communicator::Recv(void* buf, size_t count, DataType type, int peer) {
  if (!failed_.ok() || destroyed_) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recv from rank ", peer, " at rank ", rank_, " of ", nranks_));
  }
  deadline_ = absl::Now() + options_.timeout;
  const size_t bytes = count * SizeOf(type);
  auto* out = static_cast<uint8_t*>(buf);
  const PoolOffset line = P2pAt(peer, rank_);
  for (size_t k = 0, at = 0; k < Chunks(bytes, p2p_bytes_); ++k, at += p2p_bytes_) {
    const size_t len = std::min<size_t>(p2p_bytes_, bytes - at);
    const uint64_t seq = ++received_[peer];
    absl::Status s = runtime::WaitUntil([&] { return c_.LoadFlag(line) >= seq; }, deadline_,
                                        "the sender", watch_.get(), kYieldFor, spins_);
    if (!s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("Recv at rank ", rank_, " from rank ", peer,
                                                      " of ", name_, ": ", s.message())));
    }
    const P2pLayout p = c_.FetchObject<P2pLayout>(line);
    if (p.instance != instance_ || p.bytes > p2p_bytes_) {
      return Fail(absl::DataLossError(absl::StrCat(
          "Recv at rank ", rank_, " from rank ", peer, " of ", name_, ": the channel holds ",
          p.bytes, " bytes of communicator instance ", absl::Hex(p.instance), " (this one is ",
          absl::Hex(instance_), ", buffers of ", p2p_bytes_, " bytes)")));
    }
    if (p.total != count || p.type != static_cast<uint64_t>(type) || p.bytes != len) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " called Recv(count=", count, ", ", DataTypeName(type),
                       ") but rank ", peer, " called Send(count=", p.total, ", ",
                       p.type < kNumDataTypes ? DataTypeName(static_cast<DataType>(p.type)) : "?",
                       ") on ", name_)));
    }
    if (len) c_.CopyFromPool(out + at, P2pBufferAt(peer, rank_), len);
    c_.StoreFlag(P2pAt(peer, rank_) + offsetof(P2pLayout, consumed), seq);
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> Communicator::Allocate(size_t bytes) {
  CXLRT_ASSIGN_OR_RETURN(PoolOffset off,
                         alloc_.Allocate(std::max<size_t>(bytes, 1), {.alignment = 4096}));
  buffers_.push_back(off);
  return static_cast<void*>(pool_.backend().base() + off);
}

absl::Status Communicator::Free(void* p) {
  auto off = InPool(p, 1);
  auto it = off ? std::find(buffers_.begin(), buffers_.end(), *off) : buffers_.end();
  if (it == buffers_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Free: ", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                     " is not a buffer this communicator allocated"));
  }
  buffers_.erase(it);
  return alloc_.Free(*off);
}

}  // namespace cxlrt::collectives
