// Membership: a process attaches to a pool as a host, heartbeats from a
// background thread, sees the other hosts alive or dead, fences dead ones,
// and detaches. docs/membership.md is the protocol.
//
// - Attach claims a host slot: it holds the slot's local index lock (so no
//   other process of this machine uses the index), takes the pool lock
//   (bakery) as that participant, bumps the slot's epoch and marks it
//   attached. No cross-host read-modify-write is used.
// - Heartbeat: a counter in the host's own owner line, +1 per period.
//   Clocks of hosts are not compared: each observer notes, on its own
//   monotonic clock, when it last saw a host's counter change, and declares
//   the host dead once that is longer ago than DeadAfter(its lease).
// - Lease (self-fencing): each beat that finds the host's own epoch
//   unchanged grants it the right to write pool metadata until
//   beat time + lease - LeaseMargin(lease), on its own clock. Every metadata
//   write path calls CheckLease() (one clock read) first; a lapsed lease
//   renews (beat, fence, re-read the slot) or fails with kAborted.
// - Fence: a survivor bumps a dead host's epoch under the pool lock. A
//   fenced slot is recovered only once Quiet(): its beat stood still for
//   DeadAfter(lease) as seen after the fence, so the fenced host holds no
//   lease. docs/membership.md, "Leases that fence themselves", has the
//   argument and the one window left.
//
// Thread-safety: all methods are thread-safe. Destroying a Membership
// detaches it (errors logged); it must not outlive its Pool.
#pragma once

#include <time.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/bakery_lock.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::runtime {

struct AttachOptions {
  // Slot to attach as. nullopt: the first free slot, among those of
  // `host_id` when it is set.
  std::optional<uint32_t> slot;
  // This process's host (machine, or emulated host): its processes take
  // slots [host_id * slots_per_host, +slots_per_host). nullopt:
  // CXLRT_HOST_ID / CXLRT_SLOTS_PER_HOST; -1: any free slot.
  std::optional<int> host_id;
  std::optional<uint32_t> slots_per_host;
  // nullopt: CXLRT_LEASE_MS, CXLRT_HEARTBEAT_MS, CXLRT_LOCK_TIMEOUT_MS.
  std::optional<absl::Duration> lease;
  std::optional<absl::Duration> heartbeat;
  std::optional<absl::Duration> lock_timeout;
};

// The part of a lease a host does not use: it writes metadata only while
// more than this is left of its lease (lease / 4).
absl::Duration LeaseMargin(absl::Duration lease);
// How long a host's heartbeat must stand still before others call it dead:
// its lease, the margin, and a bound on the two clocks' rate difference
// (1000 ppm of the lease).
absl::Duration DeadAfter(absl::Duration lease);

namespace membership_internal {
// clock_gettime, called in the vDSO directly when it has one (2 ns a read
// here, against 4 through libc's wrapper: every allocation reads it).
extern int (*clock_gettime_fn)(clockid_t, timespec*);
}  // namespace membership_internal

// The clock of leases: CLOCK_MONOTONIC_COARSE in nanoseconds (a couple of
// ns to read; it lags the precise clock by up to its resolution, which the
// lease check adds).
inline int64_t LeaseClockNs() {
  timespec t;
  membership_internal::clock_gettime_fn(CLOCK_MONOTONIC_COARSE, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

enum class Liveness {
  kFree,    // no host in the slot
  kSelf,    // this process
  kAlive,   // attached, heartbeat moved within its lease
  kDead,    // attached, heartbeat still for longer than DeadAfter(lease)
  kFenced,  // fenced by a survivor, not yet released
};

const char* LivenessName(Liveness l);

struct HostView {
  HostRecord record;
  Liveness liveness = Liveness::kFree;
  // How long ago this process last saw the heartbeat move.
  absl::Duration since_heartbeat;
  absl::Duration lease;
};

class Membership {
 public:
  // Attaches this process to `pool` as a host. Returns kResourceExhausted
  // when every slot is taken, kFailedPrecondition when the requested slot is
  // held by a live host, kDeadlineExceeded when the pool lock cannot be had
  // in time, kInvalidArgument for bad options.
  // REQUIRES: `pool` outlives the Membership; at most one Membership per Pool.
  static absl::StatusOr<std::unique_ptr<Membership>> Attach(Pool& pool,
                                                            const AttachOptions& options = {});

  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Leaves the pool: marks the slot free and stops the heartbeat. Returns
  // kAborted when this host had been fenced (nothing is written then).
  absl::Status Detach();

  uint32_t slot() const { return slot_; }
  uint64_t epoch() const { return epoch_; }
  absl::Duration lease() const { return lease_; }
  absl::Duration heartbeat_period() const { return heartbeat_; }
  Pool& pool() const { return pool_; }

  // True once this host learned that it was fenced.
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }
  // OK, or kAborted when this host was fenced, kFailedPrecondition when it
  // has detached; renews a lapsed lease (CheckLease).
  absl::Status CheckSelf();

  // Whether this host may write pool metadata now: attached, not fenced,
  // and more than LeaseMargin of its lease left. One clock read.
  bool LeaseHeld() const {
    return LeaseClockNs() + lease_clock_slack_ns_ < lease_end_ns_.load(std::memory_order_acquire);
  }
  // OK when the lease is held; else renews it (RenewLease). Every metadata
  // write path calls this (or LeaseHeld, then this) before its stores.
  absl::Status CheckLease() { return LeaseHeld() ? absl::OkStatus() : RenewLease(); }
  // CheckLease, then this host's control line read from the pool: kAborted
  // when a survivor fenced it. For calls that can afford one pool read
  // (a KV put, a collective call, the allocator's slow paths): a host whose
  // clock did not count a pause (a VM's kvm-clock stops while the VM is
  // paused, by design) passes the lease check, not this one.
  absl::Status ConfirmLease();
  // Beats, fences (store before load), re-reads this host's slot: kAborted
  // when a survivor fenced it (then for good), kFailedPrecondition when not
  // attached; else the lease runs to the beat's time + lease - margin.
  absl::Status RenewLease();

  // Every slot that is not free, as this host sees it now.
  absl::StatusOr<std::vector<HostView>> Hosts();
  // One slot. kInvalidArgument when out of range.
  absl::StatusOr<HostView> Host(uint32_t slot);

  // Fences host `slot`: bumps its epoch, marks it fenced. REQUIRES it is
  // seen dead here (kFailedPrecondition otherwise) unless `force`.
  absl::Status Fence(uint32_t slot, bool force = false);
  // Whether fenced slot `slot` may be recovered: it is fenced and its
  // heartbeat has stood still for DeadAfter(its lease), read after the
  // fence is visible, so its host holds no lease and cannot renew one.
  // false for a slot not fenced. Survivors recover only quiet slots.
  absl::StatusOr<bool> Quiet(uint32_t slot);
  // Frees a fenced slot once its resources have been recovered; with
  // `epoch` (not 0), only while the slot is still at that epoch (the
  // incarnation that was recovered), else kFailedPrecondition.
  absl::Status Release(uint32_t slot, uint64_t epoch = 0);

  // A watch that ends a wait with kAborted when one of `peers` dies, is
  // fenced or leaves, or when this host is fenced. Peers' epochs are taken
  // now: a peer that restarts later counts as gone.
  std::unique_ptr<WaitWatch> Watch(const std::vector<uint32_t>& peers);

  // Runs `fn` holding the pool lock (for rare cross-host metadata changes).
  // Returns the lock's error or fn's status.
  absl::Status WithPoolLock(const std::function<absl::Status()>& fn);

 private:
  class Liveness_;  // BakeryLiveness over this host's observations
  class PeerWatch;
  struct Observation {
    uint64_t heartbeat = 0;
    // When this process saw it change, on its monotonic clock (ns; a step
    // of the wall clock must not make a live host look dead). 0: never.
    int64_t changed_ns = 0;
  };

  Membership(Pool& pool, uint32_t slot, absl::Duration lease, absl::Duration heartbeat,
             absl::Duration lock_timeout);

  // Claims the slot this Membership holds the local index of.
  absl::Status Claim(bool explicit_slot);
  void WriteOwnerLine(uint64_t epoch);
  void WriteControl(uint32_t slot, uint64_t epoch, SlotState state, uint32_t pid);
  void HeartbeatLoop();
  // Sets fenced() and ends the lease, for good.
  void MarkFenced();
  absl::Status FencedError() const;
  // Stores the next heartbeat value. REQUIRES: renew_mu_ held.
  void Beat();
  void StopHeartbeat();
  // Samples slot `j`'s heartbeat and returns for how long it has not moved
  // (the counter only; a fence or a new epoch does not restart it: a new
  // incarnation beats before it claims).
  absl::Duration Observe(uint32_t j);
  absl::Duration LeaseOf(const HostRecord& r) const;
  // The lease slot `j`'s owner line states, of whichever epoch (a fenced
  // incarnation's too); ours when the line is not valid.
  absl::Duration PublishedLease(uint32_t j) const;
  // Claim of a slot that `prior`, of an earlier boot of this machine,
  // holds: waits until its heartbeat has stood still for its lease (or the
  // slot changed); kFailedPrecondition when it still moves past the lease
  // and the lock timeout.
  absl::Status AwaitEarlierBoot(const HostRecord& prior);
  absl::StatusOr<HostView> ViewOf(const HostRecord& r);

  Pool& pool_;
  const uint32_t slot_;
  const absl::Duration lease_;
  const absl::Duration heartbeat_;
  const absl::Duration lock_timeout_;
  std::string hostname_;
  uint64_t epoch_ = 0;
  std::mutex renew_mu_;     // one beat-and-check at a time
  uint64_t beat_base_ = 0;  // the counter's value when this process took the slot
  uint64_t beats_ = 0;      // guarded by renew_mu_
  // The lease, on LeaseClockNs: metadata may be written before this. 0:
  // none (not attached yet, fenced, or detached).
  std::atomic<int64_t> lease_end_ns_{0};
  const int64_t lease_clock_slack_ns_;
  std::atomic<bool> fenced_{false};
  std::atomic<bool> leaving_{false};  // Detach is freeing the slot (its own epoch bump)
  std::atomic<bool> attached_{false};

  std::unique_ptr<Liveness_> liveness_;
  std::unique_ptr<BakeryLock> lock_;
  std::mutex lock_mu_;  // serialises pool-lock holders of this process

  std::mutex obs_mu_;
  std::map<uint32_t, Observation> observations_;  // guarded by obs_mu_

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;  // guarded by hb_mu_
  std::thread hb_thread_;
};

}  // namespace cxlrt::runtime
