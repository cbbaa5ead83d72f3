// The chunk protocol of a communicator: posts, waits and read marks over
// the pool, below the algorithms (cxlrt/collectives/algorithms/) and above the
// coherence layer. docs/collectives.md, "Transport", is the protocol.
//
// Every chunk a rank contributes is one post, numbered over the
// communicator's life from 1 (post numbers are monotonic flags, never
// reset). Post s of rank r uses r's slot and post line s % depth, so rank
// r may post s only once every peer has read its post s - depth: a rank
// runs up to depth - 1 posts ahead of the slowest peer, which is what lets
// an algorithm copy chunk k+1 into the pool while the peers read chunk k.
// Every rank posts every chunk of every call (empty when it has nothing
// for the others), in the same order, so post s is the same chunk of the
// same call on every rank, and every rank checks every peer's call
// descriptor in every post.
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
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::collectives {

using runtime::PoolOffset;

// Data-path waits yield (rather than sleep) this long: a peer is normally
// microseconds away, and a sleep overshoots by tens of them.
inline constexpr absl::Duration kDataPathYield = absl::Milliseconds(20);

class Transport {
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
    int spins;                      // spins before a wait yields; -1: CXLRT_WAIT_SPINS
    // Drains every engine of the communicator (Fail runs it before the
    // peers see this rank aborted); null: nothing to drain.
    std::function<absl::Status()> drain;
  };
  explicit Transport(Setup setup);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  uint32_t depth() const { return depth_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  const CallDesc& desc() const { return desc_; }
  absl::Time deadline() const { return deadline_; }
  CopyEngine& engine() { return *engine_; }
  // The last post number handed out by Stage (posts so far).
  uint64_t staged() const { return staged_; }
  // The last post whose bytes lie in this rank's slots or pool buffers (not
  // inline) that peers may have seen: published by this host, or handed to
  // an engine that writes the line itself (it may have, even if its ticket
  // never completes). Peers read this rank's memory only for posts up to
  // it.
  uint64_t published() const;

  // Starts a call: its descriptor (checked against every peer's), its
  // deadline, and the engine that moves its bytes.
  void BeginCall(const CallDesc& desc, absl::Time deadline, CopyEngine* engine);
  // Ends a call: every pending post published; when `in_place`, also waits
  // until every peer has read every post of the call (a caller's
  // pool-resident buffer is posted in place and is the caller's again only
  // then).
  absl::Status EndCall(bool in_place);

  // Numbers the next post and waits until its slot and post line are free
  // (every peer has read post s - depth). Returns s.
  absl::StatusOr<uint64_t> Stage();
  // This rank's slot for post `s`: slot_bytes() bytes in the pool.
  PoolOffset SlotOf(uint64_t s) const { return rings_[rank_].slot[s % depth_]; }

  // What a post carries: `pieces` pieces of `piece_len` bytes, piece j at
  // data + j * stride in the pool.
  struct Bytes {
    PoolOffset data = 0;
    size_t piece_len = 0;
    size_t stride = 0;
    int pieces = 1;
    size_t extent() const { return pieces == 0 ? 0 : (pieces - 1) * stride + piece_len; }
  };
  // Publishes post `s` (the oldest staged and not yet published) once the
  // tickets in `after` have completed. `in_place`: the bytes are the
  // caller's pool-resident buffer, written by its plain stores, and are
  // written back first.
  absl::Status Publish(uint64_t s, const Bytes& bytes, bool in_place,
                       std::vector<CopyEngine::Ticket> after = {});
  // Publishes post `s` with `len` <= kInlineBytes bytes inside its post
  // line (pieces `stride` bytes apart).
  absl::Status PublishInline(uint64_t s, const void* bytes, size_t len, size_t stride = 0);

  // Publishes this rank's own post `s` (waiting for its tickets: a rank
  // may overwrite the bytes it posts from only after its post is out, as
  // all-to-all in place does), then waits until every peer has published
  // post `s` and checks that each runs the same call. kInvalidArgument
  // naming both calls on a mismatch.
  absl::Status WaitPosted(uint64_t s);
  // Where `n` bytes from byte `offset` of peer j's post `s` can be read
  // (after WaitPosted(s), until Done(s)); kDataLoss when the post holds
  // fewer bytes than the call needs.
  absl::StatusOr<const uint8_t*> PeerBytes(int j, uint64_t s, size_t offset, size_t n);
  // Piece `piece` of peer j's post `s`, `n` bytes.
  absl::StatusOr<const uint8_t*> PeerPiece(int j, uint64_t s, int piece, size_t n);
  // This rank has read every peer's posts up to `s`. REQUIRES: in order.
  void Done(uint64_t s);
  // Waits until every peer has read this rank's posts up to `s`.
  absl::Status AwaitPeersDone(uint64_t s);

  // Records the first error, marks this rank aborted for the peers, and
  // returns `s`. The mark is this rank's last write to the block (rank 0
  // frees it once every rank is marked), so the engines drain first: their
  // copies may still write it (Send's chunks, post lines an engine
  // publishes). An engine that does not drain by the deadline leaves the
  // mark unset, and the peers' waits run into their deadlines instead.
  absl::Status Fail(absl::Status s);
  const absl::Status& failed() const { return failed_; }
  // Describes a call: "AllReduce(count=4, float32, sum) [call 3]".
  std::string Describe(const CallDesc& d) const;

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

  runtime::Coherence& c_;
  const uint64_t pool_size_;
  const std::string name_;
  const int nranks_, rank_;
  const PoolOffset block_;
  const uint64_t instance_, slot_bytes_;
  const uint32_t depth_;
  const std::vector<RingLayout> rings_;
  runtime::WaitWatch* const watch_;
  const int spins_;
  const std::function<absl::Status()> drain_;

  CallDesc desc_;
  absl::Time deadline_;
  CopyEngine* engine_ = nullptr;
  uint64_t staged_ = 0;     // last post number staged
  uint64_t published_ = 0;  // published(), but of lines this host wrote or the engine completed
  uint64_t call_first_ = 1;
  std::deque<Pending> pending_;
  std::vector<PostLayout> posts_;    // [j * depth + s % depth]: peers' posts as read
  std::vector<uint64_t> peer_done_;  // each peer's done counter as last loaded
  absl::Status failed_;
};

// Runs a call's posts 0..n-1 as a pipeline: post(i) stages and publishes
// item i, consume(i) waits for it, reads it and marks it done. Item i is
// posted up to `ahead` items before it is consumed, so its bytes move
// while the peers still read earlier items; `ready(i)` holds an item back
// until what it posts exists (two-shot post B carries a shard that the
// consume of post A computes).
// REQUIRES: ahead < transport depth; ready(i) once items before i are
// consumed.
template <typename Post, typename Consume, typename Ready>
absl::Status RunPipeline(size_t n, size_t ahead, Post&& post, Consume&& consume, Ready&& ready) {
  size_t posted = 0;
  for (size_t i = 0; i < n; ++i) {
    for (; posted < n && posted <= i + ahead && ready(posted); ++posted) {
      CXLRT_RETURN_IF_ERROR(post(posted));
    }
    CXLRT_RETURN_IF_ERROR(consume(i));
  }
  return absl::OkStatus();
}
template <typename Post, typename Consume>
absl::Status RunPipeline(size_t n, size_t ahead, Post&& post, Consume&& consume) {
  return RunPipeline(n, ahead, post, consume, [](size_t) { return true; });
}

}  // namespace cxlrt::collectives
