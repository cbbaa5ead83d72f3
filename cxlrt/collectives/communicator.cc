#include "cxlrt/collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/stream_proxy.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives {
namespace {

using runtime::PoolOffset;

constexpr uint64_t kAlign = 4096;

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
// [64, 1 GiB], and for p2p buffers of 64 x kP2pSlots, so that each chunk
// slot is whole lines (rank 0 rounds what it is given up to that).
constexpr uint64_t kP2pAlign = 64 * kP2pSlots;
bool ValidBufferBytes(uint64_t v) { return v >= 64 && v <= (1ull << 30) && v % 64 == 0; }
bool ValidP2pBytes(uint64_t v) { return ValidBufferBytes(v) && v % kP2pAlign == 0; }

// Send/Recv channels when neither the options nor CXLRT_COMM_P2P_BYTES say:
// the largest power of two in [64 KiB, 1 MiB] whose n x n channels take at
// most 1/16 of the pool. Chunks of 64-256 KiB (a quarter of it) beat the
// 16 KiB of 64 KiB channels by up to 1.5x from 1 MiB messages up
// (docs/collectives.md, "Send / Recv"); a pool shared by many ranks keeps
// its room for data.
uint64_t DefaultP2pBytes(uint64_t pool_size, int n) {
  uint64_t b = uint64_t{1} << 20;
  while (b > (64u << 10) && b * n * n > pool_size / 16) b /= 2;
  return b;
}
bool ValidDepth(uint64_t d) { return d >= kMinDepth && d <= kMaxDepth; }

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
      options_{.timeout = options.timeout.value_or(absl::Milliseconds(kCommTimeoutMs.Get())),
               .slot_bytes = options.slot_bytes.value_or(kCommSlotBytes.Get()),
               .depth = options.depth.value_or(kCommDepth.Get()),
               .chunk_bytes = options.chunk_bytes.value_or(kCommChunkBytes.Get()),
               .p2p_bytes = options.p2p_bytes.value_or(kCommP2pBytes.Get()),
               .oneshot_max = options.oneshot_max.value_or(kAllreduceOneshotMax.Get()),
               .engine = options.engine,
               .asynchronous = options.asynchronous} {
  // Slots set nowhere: on a machine with a GPU, those that make ChunkBytes
  // cut GPU-sized chunks (rank 0's choice holds for every rank).
  if (!options.slot_bytes && !kCommSlotBytes.IsSet() && gpu::GpuAvailable()) {
    options_.slot_bytes = algorithms::kDeviceSlotBytes;
  }
  if (options_.p2p_bytes == 0) options_.p2p_bytes = DefaultP2pBytes(pool_.size(), nranks);
  options_.slot_bytes = RoundUp(options_.slot_bytes, 64);
  options_.p2p_bytes = RoundUp(options_.p2p_bytes, kP2pAlign);
  watch_ = std::make_unique<PeerWatch>(*this);
  cpu_engine_ = MakeCpuEngine(c_);
  // More ranks than cores (emulated hosts on one machine): a waiter that
  // spins holds the core its peer needs, so it yields almost at once.
  if (static_cast<unsigned>(nranks) > std::max(1u, std::thread::hardware_concurrency())) {
    spins_ = 50;
  }
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
  if (options.timeout && *options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("communicator ", name, ": timeout ",
                                                   absl::FormatDuration(*options.timeout),
                                                   " must be positive (or unset: the knob)"));
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
    if (!ValidBufferBytes(options_.slot_bytes) || !ValidP2pBytes(options_.p2p_bytes) ||
        !ValidDepth(options_.depth)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator ", name_, ": slot_bytes ", options_.slot_bytes, " and p2p_bytes ",
          options_.p2p_bytes, " must each be in [64, 1 GiB], depth ", options_.depth, " in [",
          kMinDepth, ", ", kMaxDepth, "]"));
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
            settled = self ? absl::Now() : std::min(absl::Now() + lease + kDataPathYield, deadline);
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
  transport_ = std::make_unique<Transport>(Transport::Setup{
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
      .spins = spins_,
      .drain = [this] { return DrainEngines(absl::Now() + options_.timeout); },
  });
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
    for (PoolOffset b : buffers_) (void)alloc_.Free(b);
    FreeSlots();
  } else {
    kept = absl::Status(kept.code(),
                        absl::StrCat(kept.message(), "; its ", my_slots_.size(), " data slots and ",
                                     buffers_.size(), " pool buffers are kept, not freed"));
    CXLRT_LOG(kWarning) << kept;
    for (PoolOffset& slot : my_slots_) slot = 0;
  }
  buffers_.clear();
  if (failed().ok()) c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kLeft));
  if (rank_ == 0) {
    // An engine that may still write post lines into the block keeps it.
    if (!drained.ok()) return kept;
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
  return kept.ok() ? barrier : kept;
}

bool Communicator::HostGone(const JoinLayout& peer) const {
  auto host = alloc_.membership().Host(peer.host_slot);
  if (!host.ok()) return false;  // unreadable: keep waiting, within the deadline
  return host->record.epoch != peer.host_epoch || host->liveness == runtime::Liveness::kDead ||
         host->liveness == runtime::Liveness::kFenced || host->liveness == runtime::Liveness::kFree;
}

absl::Status Communicator::AwaitEveryRankGone() {
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

absl::Status Communicator::AwaitReadersDone(absl::Time deadline) {
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

absl::Status Communicator::AwaitStaleRanksGone(PoolOffset block, uint64_t size,
                                               const CommHeaderLayout& old, absl::Time deadline) {
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

absl::Status Communicator::DrainEngines(absl::Time deadline) {
  for (CopyEngine* e : {options_.engine, static_cast<CopyEngine*>(device_engine_.get())}) {
    if (e == nullptr) continue;
    if (absl::Status s = e->Drain(deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", rank_, " of ", name_, ": the ", e->name(),
                                                 " copy engine: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::SettleAfterError(CopyEngine& engine, absl::Status error) {
  // The caller may reuse or free its buffers once the call returns: copies
  // into them (and out of them) end first, as they do before an OK return.
  absl::Status s = engine.Drain(absl::Now() + options_.timeout);
  if (s.ok()) return error;
  return absl::Status(error.code(), absl::StrCat(error.message(), " (and the ", engine.name(),
                                                 " copy engine: ", s.message(),
                                                 ": its copies may still write the buffers)"));
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

void Communicator::FreeSlots() {
  for (PoolOffset& s : my_slots_) {
    if (s != 0) (void)alloc_.Free(s);
    s = 0;
  }
}

void Communicator::Abort(absl::string_view why) {
  Quiesce();
  (void)Fail(absl::AbortedError(absl::StrCat(name_, " rank ", rank_, ": ", why)));
}

absl::Status Communicator::Fail(absl::Status s) { return transport_->Fail(std::move(s)); }

const absl::Status& Communicator::failed() const { return transport_->failed(); }

runtime::WaitWatch* Communicator::watch() const { return watch_.get(); }

std::optional<PoolOffset> Communicator::InPool(const void* p, size_t len) const {
  return algorithms::PoolOffsetOf(pool_.backend().base(), pool_.size(), p, len);
}

absl::StatusOr<CopyEngine*> Communicator::EngineFor(const char* what,
                                                    std::initializer_list<const void*> buffers,
                                                    void* stream, bool start) {
  if (options_.engine) return options_.engine;
  // Pool buffers are reachable by either engine; the others decide.
  const void* device = nullptr;
  const void* host = nullptr;
  for (const void* b : buffers) {
    if (b == nullptr || InPool(b, 1)) continue;
    (gpu::KindOf(b) == runtime::MemoryKind::kGpu ? device : host) = b;
  }
  if (device == nullptr) {
    if (stream != nullptr) CXLRT_RETURN_IF_ERROR(gpu::StreamSynchronize(stream));
    return cpu_engine_.get();
  }
  if (host != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " on rank ", rank_, " of ", name_, ": buffer ",
        absl::Hex(reinterpret_cast<uintptr_t>(device)), " is GPU memory but ",
        absl::Hex(reinterpret_cast<uintptr_t>(host)),
        " is host memory outside the pool; give a call's buffers in one kind (or host buffers "
        "from Allocate)"));
  }
  if (!device_engine_) {
    auto e = MakeGpuCopyEngine(c_, pool_.backend().base(), pool_.size());
    if (!e.ok()) {
      return absl::Status(e.status().code(),
                          absl::StrCat(what, " on rank ", rank_, " of ", name_,
                                       " with GPU buffers: ", e.status().message()));
    }
    device_engine_ = *std::move(e);
  }
  if (start) CXLRT_RETURN_IF_ERROR(device_engine_->StartAfter(stream));
  return device_engine_.get();
}

absl::Status Communicator::EndOnStream(CopyEngine* engine, void* stream) {
  GpuCopyEngine* dev = DeviceOf(engine);
  return dev ? dev->FinishBefore(stream) : absl::OkStatus();
}

absl::StatusOr<algorithms::Call> Communicator::Begin(CollKind kind, DataType type, RedOp op,
                                                     size_t count, int root, CopyEngine& engine) {
  if (root >= nranks_ || (root < 0 && (kind == CollKind::kBroadcast || kind == CollKind::kReduce ||
                                       kind == CollKind::kGather || kind == CollKind::kScatter))) {
    return absl::InvalidArgumentError(
        absl::StrCat(CollKindName(kind), ": root ", root, " is not a rank of ", nranks_));
  }
  if (static_cast<int>(type) >= kNumDataTypes || static_cast<int>(op) >= kNumRedOps) {
    return absl::InvalidArgumentError(absl::StrCat(CollKindName(kind), ": unknown type or op"));
  }
  CallDesc d;
  d.kind = static_cast<uint8_t>(kind);
  d.type = static_cast<uint8_t>(type);
  d.op = static_cast<uint8_t>(op);
  d.root = root;
  d.count = count;
  d.call = ++calls_;
  transport_->BeginCall(d, absl::Now() + options_.timeout, &engine);
  return algorithms::Call{.t = *transport_,
                          .e = engine,
                          .type = type,
                          .es = SizeOf(type),
                          .coherence = c_,
                          .pool_base = pool_.backend().base(),
                          .pool_size = pool_.size(),
                          .chunk_override = options_.chunk_bytes,
                          .oneshot_max = options_.oneshot_max};
}

absl::Status Communicator::Usable() const { return UsableAfter(failed()); }

absl::Status Communicator::UsableAfter(const absl::Status& failure) const {
  if (destroyed_) return absl::FailedPreconditionError(name_ + " was destroyed");
  if (!failure.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " was aborted by an earlier error: ", failure.message()));
  }
  return absl::OkStatus();
}

void Communicator::Quiesce() {
  if (proxy_) (void)proxy_->Drain();
}

absl::Status Communicator::Synchronize() {
  if (!proxy_) return absl::OkStatus();
  return proxy_->Drain();
}

absl::Status Communicator::AsyncError() const {
  return proxy_ ? proxy_->error() : absl::OkStatus();
}

template <typename Algorithm>
absl::Status Communicator::Run(CollKind kind, DataType type, RedOp op, size_t count, int root,
                               const void* send, const void* recv, void* stream,
                               Algorithm algorithm) {
  if (options_.asynchronous) {
    // The caller's thread: the checks that need no transport (the proxy
    // owns it), the engine, a mark on the stream; the proxy runs the call
    // (docs/gpu.md, "Streams").
    CXLRT_RETURN_IF_ERROR(UsableAfter(AsyncError()));
    CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine,
                           EngineFor(CollKindName(kind), {send, recv}, stream, /*start=*/false));
    GpuCopyEngine* dev = DeviceOf(engine);
    uint64_t mark = 0;
    if (dev) {
      CXLRT_ASSIGN_OR_RETURN(mark, dev->Mark(stream));
    }
    if (!proxy_) {
      proxy_ = std::make_unique<StreamProxy>([this](uint64_t seq) {
        if (GpuCopyEngine* d = device_done_.load(std::memory_order_acquire)) d->SetDone(seq);
      });
    }
    if (dev) device_done_.store(dev, std::memory_order_release);
    const uint64_t seq = proxy_->Enqueue([=, this]() -> absl::Status {
      CXLRT_RETURN_IF_ERROR(Usable());
      if (dev) CXLRT_RETURN_IF_ERROR(dev->StartAfterMark(mark));
      CXLRT_ASSIGN_OR_RETURN(algorithms::Call c, Begin(kind, type, op, count, root, *engine));
      absl::Status s = algorithm(c);
      return s.ok() ? s : SettleAfterError(*engine, std::move(s));
    });
    return dev ? dev->WaitDoneOn(stream, seq) : absl::OkStatus();
  }
  return RunNow(kind, type, op, count, root, send, recv, stream, algorithm);
}

template <typename Algorithm>
absl::Status Communicator::RunNow(CollKind kind, DataType type, RedOp op, size_t count, int root,
                                  const void* send, const void* recv, void* stream,
                                  Algorithm algorithm) {
  CXLRT_RETURN_IF_ERROR(Usable());
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor(CollKindName(kind), {send, recv}, stream));
  CXLRT_ASSIGN_OR_RETURN(algorithms::Call c, Begin(kind, type, op, count, root, *engine));
  if (absl::Status s = algorithm(c); !s.ok()) return SettleAfterError(*engine, std::move(s));
  return EndOnStream(engine, stream);
}

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     RedOp op, void* stream) {
  return Run(CollKind::kAllReduce, type, op, count, -1, send, recv, stream,
             [=](algorithms::Call& c) { return algorithms::AllReduce(c, send, recv, count, op); });
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                         DataType type, RedOp op, void* stream) {
  return Run(
      CollKind::kReduceScatter, type, op, recvcount, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::ReduceScatter(c, send, recv, recvcount, op); });
}

absl::Status Communicator::AllGather(const void* send, void* recv, size_t sendcount, DataType type,
                                     void* stream) {
  return Run(CollKind::kAllGather, type, RedOp::kSum, sendcount, -1, send, recv, stream,
             [=](algorithms::Call& c) { return algorithms::AllGather(c, send, recv, sendcount); });
}

absl::Status Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type,
                                     int root, void* stream) {
  return Run(
      CollKind::kBroadcast, type, RedOp::kSum, count, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Broadcast(c, send, recv, count, root); });
}

absl::Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType type,
                                  RedOp op, int root, void* stream) {
  return Run(
      CollKind::kReduce, type, op, count, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Reduce(c, send, recv, count, op, root); });
}

absl::Status Communicator::Gather(const void* send, void* recv, size_t sendcount, DataType type,
                                  int root, void* stream) {
  return Run(
      CollKind::kGather, type, RedOp::kSum, sendcount, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Gather(c, send, recv, sendcount, root); });
}

absl::Status Communicator::Scatter(const void* send, void* recv, size_t recvcount, DataType type,
                                   int root, void* stream) {
  return Run(
      CollKind::kScatter, type, RedOp::kSum, recvcount, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Scatter(c, send, recv, recvcount, root); });
}

absl::Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType type,
                                    void* stream) {
  return Run(CollKind::kAllToAll, type, RedOp::kSum, count, -1, send, recv, stream,
             [=](algorithms::Call& c) { return algorithms::AllToAll(c, send, recv, count); });
}

absl::Status Communicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                     absl::Span<const size_t> send_displs, void* recv,
                                     absl::Span<const size_t> recv_counts,
                                     absl::Span<const size_t> recv_displs, DataType type,
                                     void* stream) {
  const size_t n = static_cast<size_t>(nranks_);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", rank_, " of ", name_, ": counts and displacements need ",
                     n, " entries each, got ", send_counts.size(), ", ", send_displs.size(), ", ",
                     recv_counts.size(), ", ", recv_displs.size()));
  }
  // The extents each buffer is read or written in.
  const size_t es = SizeOf(type);
  auto extent = [](absl::Span<const size_t> counts, absl::Span<const size_t> displs) {
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t j = 0; j < counts.size(); ++j) {
      if (counts[j] == 0) continue;
      lo = std::min(lo, displs[j]);
      hi = std::max(hi, displs[j] + counts[j]);
    }
    return std::pair(lo, hi);
  };
  const auto [slo, shi] = extent(send_counts, send_displs);
  const auto [rlo, rhi] = extent(recv_counts, recv_displs);
  const auto* sb = static_cast<const uint8_t*>(send);
  const auto* rb = static_cast<const uint8_t*>(recv);
  if (slo < shi && rlo < rhi && sb + slo * es < rb + rhi * es && rb + rlo * es < sb + shi * es) {
    // A peer's piece would overwrite bytes this rank has yet to post.
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", rank_, " of ", name_,
                     ": the send and receive buffers overlap (in place is not supported)"));
  }
  // Copies: an asynchronous call runs after the caller's spans are gone.
  std::vector<size_t> sc(send_counts.begin(), send_counts.end()),
      sd(send_displs.begin(), send_displs.end()), rc(recv_counts.begin(), recv_counts.end()),
      rd(recv_displs.begin(), recv_displs.end());
  return Run(
      CollKind::kAllToAllV, type, RedOp::kSum, 0, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::AllToAllV(c, send, sc, sd, recv, rc, rd); });
}

absl::Status Communicator::Barrier() {
  Quiesce();
  return RunNow(CollKind::kBarrier, DataType::kUint8, RedOp::kSum, 0, -1, nullptr, nullptr, nullptr,
                [](algorithms::Call& c) { return algorithms::Barrier(c); });
}

absl::StatusOr<void*> Communicator::Allocate(size_t bytes) {
  Quiesce();
  CXLRT_ASSIGN_OR_RETURN(PoolOffset off,
                         alloc_.Allocate(std::max<size_t>(bytes, 1), {.alignment = 4096}));
  buffers_.push_back(off);
  return static_cast<void*>(pool_.backend().base() + off);
}

absl::Status Communicator::Free(void* p) {
  Quiesce();
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
