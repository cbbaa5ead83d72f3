#include "cxlrt/runtime/membership.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::runtime {

int (*membership_internal::clock_gettime_fn)(clockid_t, timespec*) = &clock_gettime;

namespace {

// The knobs AttachOptions' unset fields take.
const Knob<int> kHostId(
    {"CXLRT_HOST_ID", "-1",
     "Id of this (emulated) host; its processes attach in host slots [id*k, id*k+k) with k = "
     "CXLRT_SLOTS_PER_HOST. -1: any free slot. Give each machine its own id when several "
     "machines share a dax pool; `cxlrt run` sets it."},
    -1, [](const char* name, const std::string& text) -> absl::StatusOr<int> {
      int id = 0;
      if (!absl::SimpleAtoi(text, &id) || id < -1 || id > 1023) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "='", text, "' is not -1 or a host id in [0, 1023]"));
      }
      return id;
    });
const Knob<uint32_t> kSlotsPerHost({"CXLRT_SLOTS_PER_HOST", "8",
                                    "Host slots reserved for each CXLRT_HOST_ID."},
                                   8, UintIn(1, 1024));
const Knob<uint32_t> kLeaseMs(
    {"CXLRT_LEASE_MS", "2000",
     "Lease of this host: it writes to the pool only while more than a quarter of its lease is "
     "left since its last confirmed beat; others declare it dead when its heartbeat stops for "
     "the lease and a quarter (docs/membership.md, Leases)."},
    2000, UintIn(10, 3600000));
const Knob<uint32_t> kHeartbeatMs({"CXLRT_HEARTBEAT_MS", "100",
                                   "Period of this host's heartbeat (must be < lease / 2)."},
                                  100, UintIn(1, 600000));
const Knob<uint32_t> kLockTimeoutMs({"CXLRT_LOCK_TIMEOUT_MS", "10000",
                                     "Deadline for taking the pool's metadata (bakery) lock."},
                                    10000, UintIn(1, 3600000));
const KnobRule kHeartbeatBelowHalfTheLease([](const Getenv& getenv) -> absl::Status {
  absl::StatusOr<uint32_t> lease = kLeaseMs.Parse(getenv);
  absl::StatusOr<uint32_t> heartbeat = kHeartbeatMs.Parse(getenv);
  if (!lease.ok() || !heartbeat.ok() || *heartbeat * 2 <= *lease) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("CXLRT_HEARTBEAT_MS=", *heartbeat,
                                                 " must be below half of CXLRT_LEASE_MS=", *lease,
                                                 ", or live hosts would be declared dead"));
});

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string Describe(const HostRecord& r) {
  if (!r.owner_current) return absl::StrCat("host slot ", r.slot);
  return absl::StrCat("host slot ", r.slot, " (pid ", r.pid, " on ", r.hostname, ")");
}

using ClockGettime = int (*)(clockid_t, timespec*);

// The vDSO's own clock_gettime, when the process has a vDSO (dlopen with
// RTLD_NOLOAD finds the one the kernel mapped; nothing is loaded).
ClockGettime VdsoClockGettime() {
  void* vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (vdso == nullptr) return nullptr;
  auto fn = reinterpret_cast<ClockGettime>(dlsym(vdso, "__vdso_clock_gettime"));
  timespec t;
  return fn != nullptr && fn(CLOCK_MONOTONIC_COARSE, &t) == 0 ? fn : nullptr;
}

// Replaces libc's clock_gettime with the vDSO's before main.
[[maybe_unused]] const bool kVdsoClock = [] {
  if (ClockGettime fn = VdsoClockGettime()) membership_internal::clock_gettime_fn = fn;
  return true;
}();

int64_t LeaseClockResolutionNs() {
  timespec r;
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) return 10'000'000;  // 10 ms: HZ=100
  return int64_t{r.tv_sec} * 1000000000 + r.tv_nsec;
}

}  // namespace

absl::Duration LeaseMargin(absl::Duration lease) { return lease / 4; }

absl::Duration DeadAfter(absl::Duration lease) { return lease + LeaseMargin(lease) + lease / 1000; }

const char* LivenessName(Liveness l) {
  switch (l) {
    case Liveness::kFree:
      return "free";
    case Liveness::kSelf:
      return "self";
    case Liveness::kAlive:
      return "alive";
    case Liveness::kDead:
      return "dead";
    case Liveness::kFenced:
      return "fenced";
  }
  return "?";
}

// Decides, for the bakery, whether a participant in the way is dead.
class Membership::Liveness_ : public BakeryLiveness {
 public:
  explicit Liveness_(Membership* m) : m_(m) {}

  bool Dead(uint32_t j) override {
    Pool& pool = m_->pool_;
    auto owner = pool.coherence().FetchObject<HostOwnerLineLayout>(pool.OwnerLineOffset(j));
    const bool owner_ok = owner.checksum == OwnerLineChecksum(owner);
    // Same machine: if nobody here holds index j, its process is gone. Keep
    // holding the index so it cannot come back until Unlock.
    if (owner_ok && owner.machine == MachineId()) {
      auto got = pool.backend().TryLockLocalIndex(j);
      if (got.ok() && *got) {
        held_.push_back(j);
        return true;
      }
    }
    return m_->Observe(j) > DeadAfter(m_->PublishedLease(j));
  }

  void ReleaseSkipped() override {
    for (uint32_t j : held_) m_->pool_.backend().UnlockLocalIndex(j);
    held_.clear();
  }

 private:
  Membership* m_;
  std::vector<uint32_t> held_;
};

class Membership::PeerWatch : public WaitWatch {
 public:
  PeerWatch(Membership* m, std::map<uint32_t, uint64_t> epochs) : m_(m), epochs_(epochs) {}

  absl::Status Check() override {
    CXLRT_RETURN_IF_ERROR(m_->CheckSelf());
    for (const auto& [slot, epoch] : epochs_) {
      auto v = m_->Host(slot);
      if (!v.ok()) return absl::AbortedError(v.status().message());
      const HostRecord& r = v->record;
      if (r.epoch != epoch || r.state != SlotState::kAttached) {
        return absl::AbortedError(absl::StrCat(
            Describe(r), " is gone: it was ", r.state == SlotState::kFenced ? "fenced" : "detached",
            " (epoch ", epoch, " -> ", r.epoch, ")"));
      }
      if (v->liveness == Liveness::kDead) {
        return absl::AbortedError(absl::StrCat(Describe(r), " is dead: no heartbeat for ",
                                               absl::FormatDuration(v->since_heartbeat), " (lease ",
                                               absl::FormatDuration(v->lease), ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  Membership* m_;
  std::map<uint32_t, uint64_t> epochs_;
};

Membership::Membership(Pool& pool, uint32_t slot, absl::Duration lease, absl::Duration heartbeat,
                       absl::Duration lock_timeout)
    : pool_(pool),
      slot_(slot),
      lease_(lease),
      heartbeat_(heartbeat),
      lock_timeout_(lock_timeout),
      hostname_(Hostname()),
      lease_clock_slack_ns_(LeaseClockResolutionNs()),
      liveness_(std::make_unique<Liveness_>(this)),
      lock_(std::make_unique<BakeryLock>(pool, slot, liveness_.get())) {}

Membership::~Membership() {
  if (attached_.load()) {
    if (absl::Status s = Detach(); !s.ok()) {
      CXLRT_LOG(kWarning) << "detach of host slot " << slot_ << " failed: " << s;
    }
  }
  StopHeartbeat();
  pool_.backend().UnlockLocalIndex(slot_);
}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Attach(Pool& pool,
                                                               const AttachOptions& options) {
  const absl::Duration lease = options.lease.value_or(absl::Milliseconds(kLeaseMs.Get()));
  const absl::Duration heartbeat =
      options.heartbeat.value_or(absl::Milliseconds(kHeartbeatMs.Get()));
  const absl::Duration lock_timeout =
      options.lock_timeout.value_or(absl::Milliseconds(kLockTimeoutMs.Get()));
  if (heartbeat <= absl::ZeroDuration() || heartbeat * 2 > lease) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat ", absl::FormatDuration(heartbeat),
                                                   " must be positive and at most half the "
                                                   "lease ",
                                                   absl::FormatDuration(lease)));
  }
  const std::optional<uint32_t> wanted = options.slot;
  const int host_id = options.host_id.value_or(kHostId.Get());
  const uint32_t per_host = options.slots_per_host.value_or(kSlotsPerHost.Get());
  uint32_t first = 0, end = pool.host_slots();
  if (host_id >= 0 && !wanted) {
    first = static_cast<uint32_t>(host_id) * per_host;
    end = std::min<uint64_t>(uint64_t{first} + per_host, pool.host_slots());
    if (first >= pool.host_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("host id ", host_id, " needs slots [", first,
                                                     ", ", uint64_t{first} + per_host, ") but ",
                                                     pool.name(), " has ", pool.host_slots(),
                                                     " (lower CXLRT_SLOTS_PER_HOST or create the "
                                                     "pool with more hosts=)"));
    }
  }

  auto try_slot = [&](uint32_t i,
                      bool explicit_slot) -> absl::StatusOr<std::unique_ptr<Membership>> {
    CXLRT_ASSIGN_OR_RETURN(bool mine, pool.backend().TryLockLocalIndex(i));
    if (!mine) {
      if (!explicit_slot) return std::unique_ptr<Membership>();
      return absl::FailedPreconditionError(absl::StrCat(
          "host slot ", i, " of ", pool.name(), " is held by another process on this machine"));
    }
    std::unique_ptr<Membership> m(new Membership(pool, i, lease, heartbeat, lock_timeout));
    CXLRT_RETURN_IF_ERROR(m->Claim(explicit_slot));
    if (!m->attached_) return std::unique_ptr<Membership>();  // taken meanwhile
    return m;
  };

  if (wanted) {
    if (*wanted >= pool.host_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("host slot ", *wanted, " is out of range (",
                                                     pool.name(), " has ", pool.host_slots(),
                                                     " slots)"));
    }
    return try_slot(*wanted, true);
  }
  int attached = 0, fenced = 0;
  for (uint32_t i = first; i < end; ++i) {
    CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool.ReadHost(i));
    if (r.state != SlotState::kFree) {
      (r.state == SlotState::kFenced ? fenced : attached)++;
      continue;
    }
    CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<Membership> m, try_slot(i, false));
    if (m) return m;
  }
  // None free: a slot an earlier boot of this machine left attached is this
  // host's own, dead by the reboot; Claim takes it once its heartbeat has
  // stood still for its lease (docs/membership.md, "Reboots").
  for (uint32_t i = first; i < end && host_id >= 0; ++i) {
    CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool.ReadHost(i));
    if (r.state != SlotState::kAttached || !r.owner_current || r.machine == MachineId() ||
        !SameMachine(r.machine, MachineId())) {
      continue;
    }
    auto m = try_slot(i, true);
    if (m.ok() && *m) return m;
    if (!m.ok()) {
      CXLRT_LOG(kWarning) << m.status();
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "all ", end - first, " host slots of ", pool.name(),
      host_id >= 0 ? absl::StrCat(" for host id ", host_id, " [", first, ", ", end, ")") : "",
      " are taken (", attached, " attached, ", fenced, " fenced)"));
}

void Membership::WriteOwnerLine(uint64_t epoch) {
  HostOwnerLineLayout l = {};
  l.epoch = epoch;
  l.attach_unix_ns = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  l.pid = static_cast<uint32_t>(getpid());
  l.lease_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(lease_));
  l.heartbeat_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(heartbeat_));
  l.machine = MachineId();
  std::memcpy(l.hostname, hostname_.data(), std::min(hostname_.size(), sizeof(l.hostname) - 1));
  l.checksum = OwnerLineChecksum(l);
  // Everything but the heartbeat word, which the heartbeat thread owns.
  pool_.coherence().Publish(pool_.OwnerLineOffset(slot_) + 8,
                            reinterpret_cast<const uint8_t*>(&l) + 8, sizeof(l) - 8);
}

void Membership::WriteControl(uint32_t slot, uint64_t epoch, SlotState state, uint32_t pid) {
  HostControlLineLayout l = {};
  l.epoch = epoch;
  l.state = static_cast<uint32_t>(state);
  l.changed_by = slot_;
  l.changed_unix_ns = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  l.owner_pid = pid;
  l.checksum = ControlLineChecksum(l);
  pool_.coherence().Publish(pool_.ControlLineOffset(slot), &l, sizeof(l));
}

absl::Status Membership::Claim(bool explicit_slot) {
  // Who owned the slot, read before this process's owner line replaces it:
  // an explicit claim of an attached slot is a restart only when the owner
  // ran on this machine (whose local lock this process now holds).
  auto prior = pool_.ReadHost(slot_);
  const bool other_kernel = prior.ok() && prior->state == SlotState::kAttached &&
                            prior->owner_current && prior->machine != MachineId();
  const bool remote_owner = other_kernel && !SameMachine(prior->machine, MachineId());
  if (explicit_slot && other_kernel && !remote_owner) {
    // An earlier boot of this machine: its process is dead by the reboot,
    // but nothing here proves it (the local index lock is the new
    // kernel's). Take the slot once its heartbeat has stood still for its
    // lease, before writing anything (this owner line's heartbeat word is
    // the same counter); the epoch bump below fences the old incarnation.
    CXLRT_RETURN_IF_ERROR(AwaitEarlierBoot(*prior));
  }
  if (explicit_slot && remote_owner) {
    // Before writing anything: the owner line is the other machine's.
    return absl::FailedPreconditionError(absl::StrCat(
        "host slot ", slot_, " of ", pool_.name(), " is attached by pid ", prior->pid, " on ",
        prior->hostname, " (another machine); give each machine its own CXLRT_HOST_ID"));
  }
  // Beat before competing for the lock, so others see a live participant.
  // The counter never counts backwards across incarnations.
  beat_base_ = pool_.coherence().LoadFlag(pool_.OwnerLineOffset(slot_));
  WriteOwnerLine(0);
  hb_thread_ = std::thread([this] { HeartbeatLoop(); });

  std::lock_guard<std::mutex> guard(lock_mu_);
  CXLRT_RETURN_IF_ERROR(lock_->Lock(absl::Now() + lock_timeout_));
  auto unlock = [this] { lock_->Unlock(); };
  CXLRT_FAULT_POINT("membership.claim.locked");
  auto r = pool_.ReadHost(slot_);
  if (!r.ok()) {
    unlock();
    return r.status();
  }
  bool take = false;
  switch (r->state) {
    case SlotState::kFree:
      take = true;
      break;
    case SlotState::kFenced:
      // A restart into a slot a survivor fenced: only when asked for.
      take = explicit_slot;
      break;
    case SlotState::kAttached:
      // This process holds the slot's local index lock, so no process of
      // this machine holds the slot: a predecessor here crashed.
      take = explicit_slot;
      break;
  }
  if (!take) {
    unlock();
    return absl::OkStatus();  // attached_ stays false: try another slot
  }
  if (r->state != SlotState::kFree) {
    CXLRT_LOG(kWarning) << "host slot " << slot_ << " of " << pool_.name() << " taken over from "
                        << (r->state == SlotState::kFenced ? "a fenced" : "a crashed")
                        << " incarnation at epoch " << r->epoch;
  }
  epoch_ = r->epoch + 1;
  WriteControl(slot_, epoch_, SlotState::kAttached, static_cast<uint32_t>(getpid()));
  CXLRT_FAULT_POINT("membership.claim.after_control");
  WriteOwnerLine(epoch_);
  attached_ = true;
  // Break the tickets of dead participants: fence the attached ones.
  for (uint32_t j : lock_->skipped()) {
    auto dead = pool_.ReadHost(j);
    if (dead.ok() && dead->state == SlotState::kAttached) {
      CXLRT_LOG(kWarning) << "fencing " << Describe(*dead)
                          << ": it died holding a pool lock ticket";
      WriteControl(j, dead->epoch + 1, SlotState::kFenced, dead->owner_pid);
    }
  }
  pool_.coherence().FenceStoresBeforeLoads();  // the fences before any later load (Quiet)
  unlock();
  // The first lease: a beat that finds the new epoch in place.
  CXLRT_RETURN_IF_ERROR(RenewLease());
  CXLRT_LOG(kInfo) << "attached to " << pool_.name() << " as host slot " << slot_ << " at epoch "
                   << epoch_;
  return absl::OkStatus();
}

absl::Status Membership::WithPoolLock(const std::function<absl::Status()>& fn) {
  std::lock_guard<std::mutex> guard(lock_mu_);
  CXLRT_RETURN_IF_ERROR(CheckSelf());
  CXLRT_RETURN_IF_ERROR(lock_->Lock(absl::Now() + lock_timeout_));
  for (uint32_t j : lock_->skipped()) {
    auto dead = pool_.ReadHost(j);
    if (dead.ok() && dead->state == SlotState::kAttached) {
      CXLRT_LOG(kWarning) << "fencing " << Describe(*dead)
                          << ": it died holding a pool lock ticket";
      WriteControl(j, dead->epoch + 1, SlotState::kFenced, dead->owner_pid);
    }
  }
  pool_.coherence().FenceStoresBeforeLoads();  // the fences before any later load (Quiet)
  // Re-check just before writing under the lock: a host that stalled past
  // its lease (a survivor may have skipped its ticket and fenced it) must
  // not change metadata. CheckSelf checks the lease.
  absl::Status s = CheckSelf();
  if (s.ok()) s = fn();
  lock_->Unlock();
  return s;
}

absl::Status Membership::Detach() {
  if (!attached_.load() && !fenced()) {
    return absl::FailedPreconditionError(
        absl::StrCat("host slot ", slot_, " of ", pool_.name(), " is not attached"));
  }
  absl::Status s = absl::OkStatus();
  if (!fenced()) {
    s = WithPoolLock([&]() -> absl::Status {
      CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool_.ReadHost(slot_));
      if (r.epoch != epoch_) {
        MarkFenced();
        return CheckSelf();
      }
      CXLRT_FAULT_POINT("membership.detach.locked");
      // Before the record changes: the heartbeat thread, still running,
      // must not take this host's own epoch bump for a fencing.
      leaving_.store(true);
      lease_end_ns_.store(0, std::memory_order_release);
      WriteControl(slot_, epoch_ + 1, SlotState::kFree, 0);
      CXLRT_FAULT_POINT("membership.detach.freed");
      return absl::OkStatus();
    });
  } else {
    s = CheckSelf();
  }
  attached_ = false;
  StopHeartbeat();
  pool_.backend().UnlockLocalIndex(slot_);
  return s;
}

absl::Status Membership::CheckSelf() {
  if (fenced()) return FencedError();
  if (!attached_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this host (slot ", slot_, " of ", pool_.name(), ") is not attached"));
  }
  return CheckLease();
}

absl::Status Membership::FencedError() const {
  return absl::AbortedError(
      absl::StrCat("this host (slot ", slot_, " of ", pool_.name(),
                   ") was fenced by a survivor (its lease lapsed: a stall or a pause longer than ",
                   absl::FormatDuration(lease_ - LeaseMargin(lease_)),
                   "); it writes nothing more to the pool: attach again"));
}

void Membership::MarkFenced() {
  // fenced_ first: a renewal that raises the lease after the store of 0
  // then sees fenced_ and ends it again (RenewLease).
  fenced_.store(true, std::memory_order_seq_cst);
  lease_end_ns_.store(0, std::memory_order_seq_cst);
}

absl::Status Membership::ConfirmLease() {
  CXLRT_RETURN_IF_ERROR(CheckLease());
  // The epoch is the control line's first word; only a fence, a detach or
  // a release changes it while this host holds the slot.
  const uint64_t epoch = pool_.coherence().LoadFlag(pool_.ControlLineOffset(slot_));
  if (epoch == epoch_ || leaving_.load()) return absl::OkStatus();
  MarkFenced();
  CXLRT_LOG(kError) << "this host (slot " << slot_ << " of " << pool_.name()
                    << ") finds itself fenced (epoch " << epoch_ << " -> " << epoch
                    << ") with its lease unexpired on its own clock: a pause its clock did not "
                       "count (a paused VM?); it stops writing to the pool";
  return FencedError();
}

void Membership::Beat() {
  pool_.coherence().StoreFlag(pool_.OwnerLineOffset(slot_), beat_base_ + ++beats_);
}

absl::Status Membership::RenewLease() {
  std::lock_guard<std::mutex> guard(renew_mu_);
  if (fenced()) return FencedError();
  if (!attached_.load() || leaving_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this host (slot ", slot_, " of ", pool_.name(), ") is not attached"));
  }
  // The lease counts from before the beat's store: others start their
  // count when they see the new value, never earlier.
  const int64_t t0 = LeaseClockNs();
  Beat();
  // A survivor fences with {store the fence; fence; load the beat}; this is
  // {store the beat; fence; load the record}: at least one of the two sees
  // the other's store. Without this fence x86 may satisfy the load below
  // before the beat leaves the store buffer, and both would miss.
  pool_.coherence().FenceStoresBeforeLoads();
  CXLRT_FAULT_POINT("membership.renew.checked");
  auto r = pool_.ReadHost(slot_);
  if (!r.ok()) return r.status();
  // leaving_ is read after the record (x86 keeps the loads in order, and
  // Detach sets it before its store): a new epoch with leaving_ set is this
  // host's own Detach, not a survivor's fencing.
  if (r->epoch != epoch_ && !leaving_.load()) {
    MarkFenced();
    CXLRT_LOG(kError) << "this host (slot " << slot_ << " of " << pool_.name()
                      << ") was fenced by slot " << r->changed_by << " (epoch " << epoch_ << " -> "
                      << r->epoch << "); it stops writing to the pool";
    return FencedError();
  }
  const int64_t end = t0 + absl::ToInt64Nanoseconds(lease_ - LeaseMargin(lease_));
  int64_t prior = lease_end_ns_.load(std::memory_order_relaxed);
  while (prior < end && !lease_end_ns_.compare_exchange_weak(prior, end)) {
  }
  // A fence found by another thread (ConfirmLease) or a Detach since the
  // record was read ended the lease: do not give it back.
  if (fenced_.load(std::memory_order_seq_cst) || leaving_.load(std::memory_order_seq_cst)) {
    lease_end_ns_.store(0, std::memory_order_seq_cst);
    if (fenced()) return FencedError();
    return absl::FailedPreconditionError(
        absl::StrCat("this host (slot ", slot_, " of ", pool_.name(), ") is detaching"));
  }
  return absl::OkStatus();
}

void Membership::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_stop_) {
    CXLRT_FAULT_POINT("membership.heartbeat");
    lock.unlock();
    if (attached_.load() && !leaving_.load()) {
      absl::Status s = RenewLease();
      if (fenced()) return;  // RenewLease logged it; the heartbeat stops
      if (!s.ok()) {
        CXLRT_LOG(kWarning) << "heartbeat of host slot " << slot_ << ": " << s;
      }
      // Sample everyone, so that death is seen about one beat after it is due.
      for (uint32_t j = 0; j < pool_.host_slots(); ++j) {
        if (j == slot_) continue;
        auto other = pool_.ReadHost(j);
        if (other.ok() && other->state == SlotState::kAttached) Observe(j);
      }
    } else {
      std::lock_guard<std::mutex> guard(renew_mu_);
      Beat();
    }
    lock.lock();
    hb_cv_.wait_for(lock, absl::ToChronoMilliseconds(heartbeat_), [this] { return hb_stop_; });
  }
}

void Membership::StopHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
}

absl::Status Membership::AwaitEarlierBoot(const HostRecord& prior) {
  const absl::Duration lease = LeaseOf(prior);
  const absl::Time deadline = absl::Now() + lease + lock_timeout_;
  const absl::Duration step = std::max(absl::Milliseconds(1), std::min(heartbeat_, lease / 10));
  for (;;) {
    auto now = pool_.ReadHost(slot_);
    CXLRT_RETURN_IF_ERROR(now.status());
    // Fenced, freed or re-claimed meanwhile: Claim decides on what it is now.
    if (now->state != SlotState::kAttached || now->epoch != prior.epoch) return absl::OkStatus();
    if (Observe(slot_) > DeadAfter(lease)) {
      CXLRT_LOG(kWarning) << "host slot " << slot_ << " of " << pool_.name()
                          << " is attached by pid " << prior.pid << " of an earlier boot of this "
                          << "machine, silent for its lease: taking it back";
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host slot ", slot_, " of ", pool_.name(), " is attached by pid ", prior.pid, " on ",
          prior.hostname, ", another boot of this machine, whose heartbeat still moved within ",
          absl::FormatDuration(lease + lock_timeout_),
          "; a second kernel with this machine's identity (a cloned /etc/machine-id and host "
          "name?) needs its own CXLRT_HOST_ID"));
    }
    absl::SleepFor(step);
  }
}

absl::Duration Membership::Observe(uint32_t j) {
  const uint64_t beat = pool_.coherence().LoadFlag(pool_.OwnerLineOffset(j));
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  std::lock_guard<std::mutex> lock(obs_mu_);
  Observation& o = observations_[j];
  if (o.changed_ns == 0 || o.heartbeat != beat) o = Observation{beat, now};
  return absl::Nanoseconds(now - o.changed_ns);
}

absl::Duration Membership::PublishedLease(uint32_t j) const {
  auto owner = pool_.coherence().FetchObject<HostOwnerLineLayout>(pool_.OwnerLineOffset(j));
  const bool ok = owner.checksum == OwnerLineChecksum(owner) && owner.lease_ms != 0;
  return ok ? absl::Milliseconds(owner.lease_ms) : lease_;
}

absl::Duration Membership::LeaseOf(const HostRecord& r) const {
  return r.owner_current && r.lease_ms ? absl::Milliseconds(r.lease_ms) : lease_;
}

absl::StatusOr<HostView> Membership::ViewOf(const HostRecord& r) {
  HostView v;
  v.record = r;
  v.lease = LeaseOf(r);
  switch (r.state) {
    case SlotState::kFree:
      v.liveness = Liveness::kFree;
      return v;
    case SlotState::kFenced:
      v.liveness = Liveness::kFenced;
      return v;
    case SlotState::kAttached:
      break;
  }
  if (r.slot == slot_ && r.epoch == epoch_) {
    v.liveness = Liveness::kSelf;
    return v;
  }
  v.since_heartbeat = Observe(r.slot);
  v.liveness = v.since_heartbeat > DeadAfter(v.lease) ? Liveness::kDead : Liveness::kAlive;
  return v;
}

absl::StatusOr<HostView> Membership::Host(uint32_t slot) {
  CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool_.ReadHost(slot));
  return ViewOf(r);
}

absl::StatusOr<std::vector<HostView>> Membership::Hosts() {
  std::vector<HostView> out;
  for (uint32_t i = 0; i < pool_.host_slots(); ++i) {
    CXLRT_ASSIGN_OR_RETURN(HostView v, Host(i));
    if (v.liveness != Liveness::kFree) out.push_back(std::move(v));
  }
  return out;
}

absl::Status Membership::Fence(uint32_t slot, bool force) {
  if (slot == slot_) {
    return absl::InvalidArgumentError(absl::StrCat("host slot ", slot, " cannot fence itself"));
  }
  CXLRT_ASSIGN_OR_RETURN(HostView v, Host(slot));
  switch (v.liveness) {
    case Liveness::kFree:
      return absl::FailedPreconditionError(
          absl::StrCat("host slot ", slot, " of ", pool_.name(), " is not attached"));
    case Liveness::kFenced:
      return absl::OkStatus();  // already done: fencing is idempotent
    case Liveness::kAlive:
      if (!force) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(v.record), " is alive: heartbeat seen ",
                         absl::FormatDuration(v.since_heartbeat), " ago, lease ",
                         absl::FormatDuration(v.lease)));
      }
      break;
    default:
      break;
  }
  return WithPoolLock([&]() -> absl::Status {
    CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool_.ReadHost(slot));
    if (r.epoch != v.record.epoch || r.state != SlotState::kAttached) {
      return absl::FailedPreconditionError(absl::StrCat("host slot ", slot,
                                                        " changed while being fenced (epoch ",
                                                        v.record.epoch, " -> ", r.epoch, ")"));
    }
    // Decided on a beat that may have moved since: re-observe under the lock.
    if (!force && Observe(slot) <= DeadAfter(v.lease)) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(v.record), " beat again while being fenced"));
    }
    CXLRT_FAULT_POINT("membership.fence.locked");
    WriteControl(slot, r.epoch + 1, SlotState::kFenced, r.owner_pid);
    // Before any later load of its beat (Quiet): see RenewLease.
    pool_.coherence().FenceStoresBeforeLoads();
    CXLRT_LOG(kInfo) << "fenced " << Describe(v.record) << " at epoch " << r.epoch + 1;
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> Membership::Quiet(uint32_t slot) {
  // This host's own fence stores, if any, before the loads below.
  pool_.coherence().FenceStoresBeforeLoads();
  CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool_.ReadHost(slot));
  if (r.state != SlotState::kFenced) return false;
  // The fenced incarnation's own lease, at least ours.
  const absl::Duration lease = std::max(lease_, PublishedLease(slot));
  // The beat is loaded after the fence was visible (the record load above
  // saw it): if it still reads the value that has stood still for
  // DeadAfter, the host's last lease has ended, and any renewal whose beat
  // this load missed will find the fence (RenewLease).
  return Observe(slot) > DeadAfter(lease);
}

absl::Status Membership::Release(uint32_t slot, uint64_t epoch) {
  return WithPoolLock([&]() -> absl::Status {
    CXLRT_ASSIGN_OR_RETURN(HostRecord r, pool_.ReadHost(slot));
    if (r.state != SlotState::kFenced) {
      return absl::FailedPreconditionError(
          absl::StrCat("host slot ", slot, " is not fenced; only fenced slots are released"));
    }
    if (epoch != 0 && r.epoch != epoch) {
      return absl::FailedPreconditionError(absl::StrCat("host slot ", slot, " is at epoch ",
                                                        r.epoch, ", not the recovered ", epoch));
    }
    WriteControl(slot, r.epoch + 1, SlotState::kFree, 0);
    return absl::OkStatus();
  });
}

std::unique_ptr<WaitWatch> Membership::Watch(const std::vector<uint32_t>& peers) {
  std::map<uint32_t, uint64_t> epochs;
  for (uint32_t p : peers) {
    auto r = pool_.ReadHost(p);
    epochs[p] = r.ok() ? r->epoch : 0;
  }
  return std::make_unique<PeerWatch>(this, std::move(epochs));
}

}  // namespace cxlrt::runtime
