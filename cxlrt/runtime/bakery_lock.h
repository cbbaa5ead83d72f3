// The pool lock: Lamport's bakery algorithm over the host slots' bakery
// lines, for the rare metadata changes that need mutual exclusion across
// hosts (claiming a host slot, fencing, directory entries). It uses only
// single-writer 64-bit registers: participant i writes only its own ticket
// (number << 1 | choosing); no cross-host read-modify-write anywhere.
//
// A participant is a host slot index, held exclusively by this process
// (MemoryBackend::TryLockLocalIndex); see docs/membership.md for why an index
// must be held before the lock can be taken.
//
// A participant that died holding a ticket would block everyone forever, so
// waits skip a participant that its Liveness says is dead, and the new lock
// holder can fence it (Membership does).
//
// Thread-safety: one BakeryLock per participant; Lock/Unlock from one
// thread at a time (Membership serialises its callers with a mutex).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::runtime {

class BakeryLiveness {
 public:
  virtual ~BakeryLiveness() = default;
  // True when participant `j` is dead and its ticket may be ignored. Called
  // repeatedly while `j` blocks the lock; the answer may change to true once
  // its lease has run out. May take local locks to keep a dead `j` from
  // coming back before ReleaseSkipped().
  virtual bool Dead(uint32_t j) = 0;
  // Called at Unlock: forget whatever Dead() held on to.
  virtual void ReleaseSkipped() {}
};

class BakeryLock {
 public:
  // REQUIRES: this process holds local index `self` of `pool`; `liveness`
  // outlives the lock.
  BakeryLock(const Pool& pool, uint32_t self, BakeryLiveness* liveness);

  // Takes the lock. Returns OK, kDeadlineExceeded naming the participant
  // still in the way, or the watch's status; on error the ticket is cleared.
  absl::Status Lock(absl::Time deadline, WaitWatch* watch = nullptr);
  void Unlock();

  // Participants whose tickets this holder skipped as dead, in the last Lock.
  const std::vector<uint32_t>& skipped() const { return skipped_; }

  static uint64_t Number(uint64_t ticket) { return ticket >> 1; }
  static bool Choosing(uint64_t ticket) { return ticket & 1; }

 private:
  uint64_t Ticket(uint32_t j) const;
  void SetTicket(uint64_t t);

  const Pool& pool_;
  const uint32_t self_;
  BakeryLiveness* const liveness_;
  std::vector<uint32_t> skipped_;
};

}  // namespace cxlrt::runtime
