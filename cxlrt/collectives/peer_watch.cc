// The peer watch: ends a communicator's waits when a peer dies, is fenced,
// leaves or aborts, or when this host is fenced.
#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/runtime/membership.h"

namespace cxlrt::collectives {

absl::Status Communicator::Impl::PeerWatch::Check() {
  Impl& c = comm_;
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
    const bool alive =
        host.ok() && host->record.epoch == peer.host_epoch &&
        (host->liveness == runtime::Liveness::kAlive || host->liveness == runtime::Liveness::kSelf);
    if (!alive) {
      return absl::AbortedError(absl::StrCat(
          "rank ", j, " of ", c.name_, " (host slot ", peer.host_slot, ", pid ", peer.pid, ") is ",
          host.ok() ? runtime::LivenessName(host->liveness) : "unreadable",
          host.ok() && host->record.epoch != peer.host_epoch ? " (restarted)" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::collectives
