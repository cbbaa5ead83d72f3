// The seam between the collective algorithms (cxlrt/collectives/algorithms/)
// and whatever carries their chunks to the peers: numbered posts, waits for
// the peers' posts, reads of their bytes and read marks. Today one
// transport implements it, through one pool (pool_transport.h); a transport
// between pools (another engine carrying the traffic between pods) plugs in
// beside it without changing an algorithm. docs/collectives.md,
// "Transport", is the protocol.
//
// Every chunk a rank contributes is one post, numbered over the
// communicator's life from 1 (post numbers only grow). A transport keeps a
// ring of `depth` posts per rank: a rank may stage post s only once every
// peer has read its post s - depth, so it runs up to depth - 1 posts ahead
// of the slowest peer, which is what lets an algorithm copy chunk k+1 in
// while the peers read chunk k. Every rank posts every chunk of every call
// (empty when it has nothing for the others), in the same order, so post s
// is the same chunk of the same call on every rank, and every rank checks
// every peer's call descriptor in every post.
//
// A post's bytes may still be in flight in a copy engine when it is handed
// to Publish: the transport makes it visible only once the engine's tickets
// behind it have completed.
//
// The shape of the communicator and the call in progress live in this base
// class (non-virtual: the algorithms read them in their inner loops); the
// protocol's steps are virtual.
//
// Thread-safety: one thread at a time (the communicator's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives {

using runtime::PoolOffset;

// Data-path waits yield (rather than sleep) this long: a peer is normally
// microseconds away, and a sleep overshoots by tens of them.
inline constexpr absl::Duration kDataPathYield = absl::Milliseconds(20);

class Transport {
 public:
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Posts in each rank's ring.
  uint32_t depth() const { return depth_; }
  // The most one post of this rank holds when it is staged (SlotOf).
  uint64_t slot_bytes() const { return slot_bytes_; }
  const CallDesc& desc() const { return desc_; }
  // The call's deadline: its timeout counted from the first time a wait
  // asks for it (a wait that ends at once does not). Reading the clock costs
  // more than a whole 8-byte all-reduce's protocol on some machines (absl::Now
  // through a VM's clock), so a call whose waits all end at once reads none.
  absl::Time deadline() const {
    if (deadline_ == absl::InfinitePast()) deadline_ = absl::Now() + timeout_;
    return deadline_;
  }
  CopyEngine& engine() { return *engine_; }
  // The last post number handed out by Stage (posts so far).
  uint64_t staged() const { return staged_; }
  // OK, or the first error (Fail): the communicator is then aborted.
  const absl::Status& failed() const { return failed_; }

  // Starts a call: its descriptor (checked against every peer's), its
  // timeout (deadline()), and the engine that moves its bytes.
  void BeginCall(const CallDesc& desc, absl::Duration timeout, CopyEngine* engine);
  // Ends a call: every pending post published; when `in_place`, also waits
  // until every peer has read every post of the call (a caller's
  // pool-resident buffer is posted in place and is the caller's again only
  // then).
  virtual absl::Status EndCall(bool in_place) = 0;

  // Numbers the next post and waits until its slot and post line are free
  // (every peer has read post s - depth). Returns s.
  virtual absl::StatusOr<uint64_t> Stage() = 0;
  // Where this rank stages the bytes of post `s` before Publish:
  // slot_bytes() bytes in the pool.
  virtual PoolOffset SlotOf(uint64_t s) const = 0;

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
  virtual absl::Status Publish(uint64_t s, const Bytes& bytes, bool in_place,
                               std::vector<CopyEngine::Ticket> after) = 0;
  // Publishes post `s` with `len` <= kInlineBytes bytes carried with the
  // post itself (pieces `stride` bytes apart; 0: one piece).
  virtual absl::Status PublishInline(uint64_t s, const void* bytes, size_t len, size_t stride) = 0;

  // Publishes this rank's own post `s` (waiting for its tickets: a rank
  // may overwrite the bytes it posts from only after its post is out, as
  // all-to-all in place does), then waits until every peer has published
  // post `s` and checks that each runs the same call. kInvalidArgument
  // naming both calls on a mismatch.
  virtual absl::Status WaitPosted(uint64_t s) = 0;
  // Where `n` bytes from byte `offset` of peer j's post `s` can be read
  // (after WaitPosted(s), until Done(s)); kDataLoss when the post holds
  // fewer bytes than the call needs.
  virtual absl::StatusOr<const uint8_t*> PeerBytes(int j, uint64_t s, size_t offset, size_t n) = 0;
  // Piece `piece` of peer j's post `s`, `n` bytes.
  virtual absl::StatusOr<const uint8_t*> PeerPiece(int j, uint64_t s, int piece, size_t n) = 0;
  // This rank has read every peer's posts up to `s`. REQUIRES: in order.
  virtual void Done(uint64_t s) = 0;

  // Records the first error (failed()), tells the peers this rank aborted,
  // and returns `s`.
  virtual absl::Status Fail(absl::Status s) = 0;
  // Describes a call: "AllReduce(count=4, float32, sum) [call 3]".
  std::string Describe(const CallDesc& d) const;

 protected:
  Transport(int nranks, int rank, uint32_t depth, uint64_t slot_bytes)
      : nranks_(nranks), rank_(rank), depth_(depth), slot_bytes_(slot_bytes) {}

  // Shared with the implementations, which read them on every post.
  const int nranks_, rank_;
  const uint32_t depth_;
  const uint64_t slot_bytes_;
  CallDesc desc_;  // of the call in progress (BeginCall)
  absl::Duration timeout_;
  mutable absl::Time deadline_ = absl::InfinitePast();  // InfinitePast: not yet read
  CopyEngine* engine_ = nullptr;
  uint64_t staged_ = 0;      // last post number staged
  uint64_t call_first_ = 1;  // the call's first post
  absl::Status failed_;      // set once, by Fail
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
