#include "cxlrt/runtime/bakery_lock.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::runtime {

BakeryLock::BakeryLock(const Pool& pool, uint32_t self, BakeryLiveness* liveness)
    : pool_(pool), self_(self), liveness_(liveness) {}

uint64_t BakeryLock::Ticket(uint32_t j) const {
  return pool_.coherence().LoadFlag(pool_.BakeryLineOffset(j));
}

void BakeryLock::SetTicket(uint64_t t) {
  pool_.coherence().StoreFlag(pool_.BakeryLineOffset(self_), t);
}

absl::Status BakeryLock::Lock(absl::Time deadline, WaitWatch* watch) {
  skipped_.clear();
  const uint32_t n = pool_.host_slots();
  // Doorway: announce choosing, take a number above every number seen.
  // Each ticket store is followed by a full fence: the bakery needs every
  // host to see "choosing" before it reads the others' numbers, and its
  // number before it reads their choosing bits. Without the fences x86's
  // store buffer lets two hosts each read the other's old ticket and both
  // enter (tests/models/bakery_tso.pml finds that run; bakery_lock_test
  // lost increments with it).
  SetTicket(1);
  pool_.coherence().FenceStoresBeforeLoads();
  CXLRT_FAULT_POINT("bakery.after_choosing");
  uint64_t max_number = 0;
  for (uint32_t j = 0; j < n; ++j) {
    if (j != self_) max_number = std::max(max_number, Number(Ticket(j)));
  }
  const uint64_t mine = max_number + 1;
  // Number set and choosing cleared in one store: a stronger order than
  // Lamport's two writes, and the same algorithm.
  SetTicket(mine << 1);
  pool_.coherence().FenceStoresBeforeLoads();

  for (uint32_t j = 0; j < n; ++j) {
    if (j == self_) continue;
    std::string what;
    auto in_the_way = [&] {
      const uint64_t t = Ticket(j);
      if (Choosing(t)) return true;
      const uint64_t nj = Number(t);
      return nj != 0 && (nj < mine || (nj == mine && j < self_));
    };
    if (!in_the_way()) continue;
    what = absl::StrCat("the pool lock (held or wanted first by host slot ", j, ")");
    bool dead = false;
    absl::Status s = WaitUntil(
        [&] {
          if (!in_the_way()) return true;
          if (liveness_ != nullptr && liveness_->Dead(j)) {
            dead = true;
            return true;
          }
          return false;
        },
        deadline, what, watch);
    if (!s.ok()) {
      SetTicket(0);
      if (liveness_ != nullptr) liveness_->ReleaseSkipped();
      return s;
    }
    if (dead) skipped_.push_back(j);
  }
  CXLRT_FAULT_POINT("bakery.locked");
  return absl::OkStatus();
}

void BakeryLock::Unlock() {
  SetTicket(0);
  if (liveness_ != nullptr) liveness_->ReleaseSkipped();
}

}  // namespace cxlrt::runtime
