// Communicators and NCCL-shaped collectives over the pool (CPU data path).
//
// A communicator is (pool, name, nranks, rank). Rank 0 makes its block in
// the pool under the name "comm/NAME"; the others find it and join. There is
// no network bootstrap. Every collective runs as rounds: in a round each
// rank posts its bytes (inline in its post line when tiny, else in its slot,
// or in place when its buffer already lies in the pool) with a descriptor
// of the call, waits for every peer's post of the same round, checks the
// descriptors, reads what it needs, and marks the round done. Slots are
// double-buffered, so a rank runs up to one round ahead of the slowest.
// docs/collectives.md is the protocol and the algorithms.
//
// Errors: a mismatched call is kInvalidArgument naming both ranks and both
// calls, on every rank; a dead, fenced or aborting peer is kAborted naming
// it; a wait past the deadline is kDeadlineExceeded. After any error the
// communicator is aborted on every rank (its peers see it within their
// next wait): later calls return kFailedPrecondition; Destroy it and
// create a new one.
//
// Thread-safety: a Communicator is used by one thread at a time (like an
// NCCL communicator on one stream). Several may live in one process and in
// one pool.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/allocator.h"
#include "collectives/comm_layout.h"
#include "collectives/types.h"
#include "runtime/pool.h"
#include "runtime/wait.h"

namespace cxlrt::collectives {

using runtime::PoolOffset;

enum class CollKind : uint8_t {
  kAllReduce = 1,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
};
const char* CollKindName(CollKind k);

struct CommOptions {
  // Every wait of a call gives up after this (kDeadlineExceeded).
  // 0: CXLRT_COMM_TIMEOUT_MS, else 60 s.
  absl::Duration timeout = absl::ZeroDuration();
  // Bytes of each of a rank's two data slots. 0: CXLRT_COMM_SLOT_BYTES,
  // else 1 MiB. Rank 0's value wins; others must agree or pass 0.
  uint64_t slot_bytes = 0;
  // Bytes of each point-to-point buffer. 0: CXLRT_COMM_P2P_BYTES, else 64 KiB.
  uint64_t p2p_bytes = 0;
  // All-reduces up to this many bytes run one-shot, larger ones two-shot.
  // 0: CXLRT_ALLREDUCE_ONESHOT_MAX, else 64 KiB.
  uint64_t oneshot_max = 0;
};

// Rank and size as the launcher set them: cxlrt run (CXLRT_RANK /
// CXLRT_WORLD_SIZE), mpirun (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE),
// srun (SLURM_PROCID / SLURM_NTASKS), torchrun (RANK / WORLD_SIZE).
// kNotFound when none is set; kInvalidArgument when malformed.
struct RankInfo {
  int rank = 0;
  int nranks = 1;
  std::string source;  // which variables
};
absl::StatusOr<RankInfo> RankFromEnvironment();

class Communicator {
 public:
  // Creates or joins communicator `name` as `rank` of `nranks` (both -1:
  // from the environment). Waits up to the timeout for every rank.
  // kInvalidArgument: bad rank/size, or a size other than the one rank 0
  // made; kAlreadyExists: a live communicator of that name already runs;
  // kDeadlineExceeded: a rank did not come.
  // REQUIRES: `alloc` (and its pool and membership) outlive the Communicator.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(allocator::Allocator& alloc,
                                                              absl::string_view name,
                                                              int nranks = -1, int rank = -1,
                                                              const CommOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  bool destroyed() const { return destroyed_; }
  int rank() const { return rank_; }
  int size() const { return nranks_; }
  const std::string& name() const { return name_; }

  // Collectives, NCCL's argument conventions: counts in elements; in place
  // when send == recv (for AllGather: send == recv + rank * count; for
  // ReduceScatter: recv == send + rank * recvcount). Buffers that lie in the
  // pool (from Allocate) are read in place instead of copied in.
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, RedOp op);
  absl::Status ReduceScatter(const void* send, void* recv, size_t recvcount, DataType type,
                             RedOp op);
  absl::Status AllGather(const void* send, void* recv, size_t sendcount, DataType type);
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root);
  absl::Status Reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                      int root);
  absl::Status Gather(const void* send, void* recv, size_t sendcount, DataType type, int root);
  absl::Status Scatter(const void* send, void* recv, size_t recvcount, DataType type, int root);
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType type);
  absl::Status Barrier();
  // Point to point: a Send must meet a Recv of the same count and type.
  // Sends to one peer arrive in order. Send returns once its bytes are in
  // the pool.
  absl::Status Send(const void* buf, size_t count, DataType type, int peer);
  absl::Status Recv(void* buf, size_t count, DataType type, int peer);

  // A buffer in the pool that collectives use in place (zero-copy). Freed
  // with Free or when the communicator is destroyed.
  absl::StatusOr<void*> Allocate(size_t bytes);
  absl::Status Free(void* p);

  // Leaves: a barrier, then rank 0 frees the communicator's block once
  // every rank has left (or died). The destructor calls it.
  absl::Status Destroy();
  // Marks the communicator aborted for every rank, now; no wait.
  void Abort(absl::string_view why = "aborted by the application");

  // Rounds run so far (for tests and benchmarks).
  uint64_t rounds() const { return round_; }
  // Where this rank's two data slots lie in the pool (diagnostics, tests).
  std::pair<PoolOffset, PoolOffset> slots() const { return {my_slots_[0], my_slots_[1]}; }

 private:
  class PeerWatch;
  // Bytes a rank posts: `len` bytes from `data`, at byte `at` of the post
  // (kNext: right after the previous piece).
  static constexpr size_t kNext = ~size_t{0};
  struct Piece {
    const void* data;
    size_t len;
    size_t at = kNext;
  };

  Communicator(allocator::Allocator& alloc, std::string name, int nranks, int rank,
               const CommOptions& options);
  absl::Status Join();
  // Allocates this rank's two slots (striped over the pool's devices).
  absl::Status AllocateSlots();
  void FreeSlots();

  PoolOffset RankAt(int r) const {
    return block_ + sizeof(CommHeaderLayout) + uint64_t(r) * sizeof(RankLayout);
  }
  PoolOffset PostAt(int r, uint64_t round) const {
    return RankAt(r) + offsetof(RankLayout, post) + (round & 1) * sizeof(PostLayout);
  }
  PoolOffset SlotAt(int r, uint64_t round) const { return peers_[r].slots[round & 1]; }
  PoolOffset P2pAt(int s, int d) const {
    return block_ + p2p_offset_ + (uint64_t(s) * nranks_ + d) * sizeof(P2pLayout);
  }
  PoolOffset P2pBufferAt(int s, int d) const {
    return block_ + p2p_buffers_offset_ + (uint64_t(s) * nranks_ + d) * p2p_bytes_;
  }

  // Starts a call: checks the communicator is usable, numbers the call.
  absl::Status Begin(CollKind kind, DataType type, RedOp op, size_t count, int root);
  // One round: posts `pieces` (copied into this rank's slot, or inline), or
  // the pool range [zc, zc+len) in place, and waits for every peer's post.
  absl::Status Exchange(const std::vector<Piece>& pieces);
  absl::Status ExchangeInPlace(PoolOffset at, size_t len);
  // Peer j's posted bytes (valid until EndRound).
  // The bytes rank j posted this round; the caller reads the first `need`.
  // kDataLoss (and the communicator fails) when j posted fewer.
  absl::StatusOr<const uint8_t*> PeerBytes(int j, size_t need);
  // Publishes the bytes of a flag line after its flag word (see .cc).
  void PublishBody(runtime::PoolOffset line, const void* obj, size_t size);
  // Rank 0's Destroy: waits until no rank can write the block any more.
  absl::Status AwaitEveryRankGone();
  void EndRound();
  // Waits until every peer has finished round `round` (their reads of this
  // rank's in-place buffers are over).
  absl::Status AwaitPeersDone(uint64_t round);
  // Records the first error, tells the peers, returns it.
  absl::Status Fail(absl::Status s);
  std::string Describe(const CallDesc& d) const;
  // The pool offset of [p, p+len) when it lies in the pool.
  std::optional<PoolOffset> InPool(const void* p, size_t len) const;
  // Where [p, p+len) may be posted in place: in the pool and aligned to the
  // call's elements (a peer refuses a post that is not).
  std::optional<PoolOffset> ZeroCopyAt(const void* p, size_t len) const;
  absl::Status WaitPosted(uint64_t round);
  // Reads peer j's post of `round`: kInvalidArgument naming both calls when
  // it is another call.
  absl::Status CheckPost(int j, uint64_t round);
  absl::Status WaitSlotFree(uint64_t round);

  allocator::Allocator& alloc_;
  runtime::Pool& pool_;
  runtime::Coherence& c_;
  const std::string name_;  // the block's name: "comm/" + the user's name
  const int nranks_, rank_;
  CommOptions options_;
  PoolOffset block_ = 0;
  uint64_t slot_bytes_ = 0, p2p_bytes_ = 0;
  uint64_t p2p_offset_ = 0, p2p_buffers_offset_ = 0;
  PoolOffset my_slots_[2] = {0, 0};  // allocated by this rank
  uint64_t instance_ = 0;
  std::vector<JoinLayout> peers_;  // as joined
  std::unique_ptr<PeerWatch> watch_;
  int spins_ = -1;  // spins before a wait yields; -1: CXLRT_WAIT_SPINS

  uint64_t round_ = 0;  // rounds finished; the next one is round_ + 1
  uint64_t calls_ = 0;
  CallDesc desc_;
  absl::Time deadline_;
  std::vector<PostLayout> posts_;          // peers' posts of the current round
  std::vector<uint64_t> sent_, received_;  // p2p chunks per peer
  std::vector<PoolOffset> buffers_;        // from Allocate
  absl::Status failed_;
  bool destroyed_ = false;
  bool made_block_ = false;  // rank 0 made the block (frees it if joining fails)
};

}  // namespace cxlrt::collectives
