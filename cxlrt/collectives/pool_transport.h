// The transport of a communicator whose ranks share one pool (transport.h
// is the interface): posts, waits and read marks through the pool's lines,
// above the coherence layer. docs/collectives.md, "Transport", is the
// protocol.
//
// Post s of rank r uses r's slot and post line s % depth (comm_layout.h,
// RankLayout); rank r may post s only once every peer's done counter has
// reached s - depth.
//
// A post's bytes may still be in flight in a copy engine when it is
// handed to Publish: it is published (post line, then its flag) only once
// the engine's tickets behind it have completed. Pending posts are
// published in order, by every later call into the transport and by every
// wait it runs. An engine that publishes posts itself (a GPU's copy
// engine under CXLRT_CUDA_DOORBELL=copy) is handed the line at once, to
// write behind those tickets; the post then stays pending only until they
// and the line have completed.
//
// Thread-safety: one thread at a time (the communicator's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/collectives/transport.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::runtime {
class Membership;
}  // namespace cxlrt::runtime

namespace cxlrt::collectives {

class PoolTransport final : public Transport {
 public:
  struct Setup {
    runtime::Coherence* coherence;
    uint64_t pool_size;
    std::string name;  // the communicator's block name, for messages
    int nranks, rank;
    PoolOffset block;
    uint64_t instance;
    uint64_t slot_bytes;
    uint32_t depth;
    std::vector<RingLayout> rings;  // every rank's slots, as joined
    runtime::WaitWatch* watch;      // ends waits when a peer dies or leaves
    // This host's membership: each post checks its lease before it writes
    // the slot (docs/membership.md, "Leases").
    runtime::Membership* membership;
    int spins;  // spins before a wait yields; -1: CXLRT_WAIT_SPINS
    // Drains every engine of the communicator (Fail runs it before the
    // peers see this rank aborted); null: nothing to drain.
    std::function<absl::Status()> drain;
  };
  explicit PoolTransport(Setup setup);

  // The last post whose bytes lie in this rank's slots or pool buffers (not
  // inline) that peers may have seen: published by this host, or handed to
  // an engine that writes the line itself (it may have, even if its ticket
  // never completes). Peers read this rank's memory only for posts up to
  // it.
  uint64_t published() const;

  absl::Status EndCall(bool in_place) override;
  absl::StatusOr<uint64_t> Stage() override;
  // This rank's slot for post `s`.
  PoolOffset SlotOf(uint64_t s) const override { return rings_[rank_].slot[s % depth_]; }
  absl::Status Publish(uint64_t s, const Bytes& bytes, bool in_place,
                       std::vector<CopyEngine::Ticket> after) override;
  // The bytes ride inside the post line.
  absl::Status PublishInline(uint64_t s, const void* bytes, size_t len, size_t stride) override;
  absl::Status WaitPosted(uint64_t s) override;
  absl::StatusOr<const uint8_t*> PeerBytes(int j, uint64_t s, size_t offset, size_t n) override;
  absl::StatusOr<const uint8_t*> PeerPiece(int j, uint64_t s, int piece, size_t n) override;
  void Done(uint64_t s) override;
  // Waits until every peer has read this rank's posts up to `s`.
  absl::Status AwaitPeersDone(uint64_t s);

  // Records the first error, marks this rank aborted for the peers, and
  // returns `s`. The mark is this rank's last write to the block (rank 0
  // frees it once every rank is marked), so the engines drain first: their
  // copies may still write it (Send's chunks, post lines an engine
  // publishes). An engine that does not drain by the deadline leaves the
  // mark unset, and the peers' waits run into their deadlines instead.
  absl::Status Fail(absl::Status s) override;

  // Pool offsets of rank r's lines.
  PoolOffset RankAt(int r) const {
    return block_ + sizeof(CommHeaderLayout) + uint64_t(r) * sizeof(RankLayout);
  }
  PoolOffset PostAt(int r, uint64_t s) const {
    return RankAt(r) + offsetof(RankLayout, post) + (s % depth_) * sizeof(PostLayout);
  }
  PoolOffset DoneAt(int r) const { return RankAt(r) + offsetof(RankLayout, done); }

 private:
  struct Pending {
    uint64_t s;
    PostLayout post;
    bool in_place;
    Bytes bytes;
    std::vector<CopyEngine::Ticket> after;
    bool by_engine = false;  // the engine publishes it (PublishLine): only waited for
  };
  // Publishes pending posts whose tickets have completed, in order; waits
  // for the tickets of those numbered up to `through` (0: none).
  absl::Status Progress(uint64_t through);
  // Publishes `p` now when nothing is queued and its tickets completed,
  // else queues it.
  absl::Status Enqueue(Pending&& p);
  void PublishPost(const Pending& p);
  // The post line of post `s`, then its number.
  void PublishLine(uint64_t s, const PostLayout& post);
  absl::Status CheckPost(int j, uint64_t s);
  // Runs a wait of the protocol: progresses pending posts while it waits.
  template <typename Ready>
  absl::Status Await(Ready&& ready, const char* what);
  absl::Status WaitFailed(absl::Status s, int j, const char* what);
  // A peer that posted its buffer in place and then failed the call (at
  // its deadline, say) hands the buffer back to its caller, who may write
  // it while this rank still reads it: bytes read from it are not to be
  // trusted once the peer is marked aborted. Fail marks a rank aborted
  // before the call returns to its caller, so a mark loaded after this
  // rank's reads completed covers every write of that caller they saw.
  absl::Status CheckWritersInPlace();

  runtime::Coherence& c_;
  const uint64_t pool_size_;
  const std::string name_;
  const PoolOffset block_;
  const uint64_t instance_;
  const std::vector<RingLayout> rings_;
  runtime::WaitWatch* const watch_;
  runtime::Membership* const membership_;
  const int spins_;
  const std::function<absl::Status()> drain_;

  uint64_t published_ = 0;  // published(), but of lines this host wrote or the engine completed
  std::deque<Pending> pending_;
  std::vector<PostLayout> posts_;    // [j * depth + s % depth]: peers' posts as read
  std::vector<uint64_t> peer_done_;  // each peer's done counter as last loaded
  // Peers of the call in progress whose posts this rank read in place (in
  // their own pool buffers, not their slots): EndCall checks that none of
  // them gave up on the call while this rank read (CheckWritersInPlace).
  std::vector<uint8_t> read_in_place_;
};

}  // namespace cxlrt::collectives
