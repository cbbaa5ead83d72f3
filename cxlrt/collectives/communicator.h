// Communicators and NCCL-shaped collectives over the pool (CPU data path).
//
// A communicator is (pool, name, nranks, rank). Rank 0 makes its block in
// the pool under the name "comm/NAME"; the others find it and join. There is
// no network bootstrap. Every collective runs as a pipeline of chunks
// (cxlrt/collectives/algorithms/): per chunk each rank posts its bytes (inline in
// its post line when tiny, else in its slot, or in place when its buffer
// already lies in the pool) with a descriptor of the call, waits for every
// peer's post of the same chunk, checks the descriptors, reads what it
// needs, and marks the post read (cxlrt/collectives/transport.h). Each rank has a
// ring of slots, so it copies chunk k+1 in while its peers read chunk k.
// Bytes move through a copy engine (cxlrt/collectives/copy_engine.h).
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

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/collectives/gpu_engine.h"
#include "cxlrt/collectives/transport.h"
#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::collectives {

using runtime::PoolOffset;

class StreamProxy;  // cxlrt/collectives/stream_proxy.h

// A field left nullopt takes its knob (cxlrt/collectives/comm_knobs.h), read
// once per process; README.md lists the knobs and their defaults.
struct CommOptions {
  // Every wait of a call gives up after this (kDeadlineExceeded); must be
  // positive. nullopt: CXLRT_COMM_TIMEOUT_MS, else 60 s.
  std::optional<absl::Duration> timeout;
  // Bytes of each of a rank's data slots (the most one post of a rank holds
  // when it is not posted in place). nullopt: CXLRT_COMM_SLOT_BYTES, else
  // 1 MiB (4 MiB on a machine with a GPU). Rank 0's value wins, as for depth.
  std::optional<uint64_t> slot_bytes;
  // Slots per rank, 2 to 8: a rank posts up to depth - 1 chunks ahead of
  // its slowest peer. nullopt: CXLRT_COMM_DEPTH, else 4.
  std::optional<uint32_t> depth;
  // Bytes of a chunk of a rank's contribution (capped by the slot); 0: the
  // measured table of docs/collectives.md. nullopt: CXLRT_COMM_CHUNK_BYTES,
  // else 0. Every rank must pass the same value.
  std::optional<uint64_t> chunk_bytes;
  // Bytes of each Send/Recv channel (one per ordered pair of ranks, a ring
  // of kP2pSlots chunks; rounded up to 256 B); 0: the largest power of two
  // in [64 KiB, 1 MiB] whose n x n channels take at most 1/16 of the pool.
  // nullopt: CXLRT_COMM_P2P_BYTES, else 0. Rank 0's value wins.
  std::optional<uint64_t> p2p_bytes;
  // All-reduces up to this many bytes run one-shot, larger ones two-shot.
  // nullopt: CXLRT_ALLREDUCE_ONESHOT_MAX, else 64 KiB.
  std::optional<uint64_t> oneshot_max;
  // Moves the bytes of every collective, Send and Recv. Null: the CPU
  // engine, or the CUDA engine for calls with GPU buffers. Not owned; must
  // outlive the communicator.
  CopyEngine* engine = nullptr;
  // NCCL's model: a collective is queued and returns at once; a proxy
  // thread of the communicator runs the calls in order. A device call's
  // stream waits (on the GPU) for it; host buffers are the caller's again
  // after Synchronize. Errors reach the next call and Synchronize /
  // AsyncError. Barrier, Send, Recv, Allocate, Free, Abort and Destroy
  // first wait for the queued calls. Local to this rank (docs/gpu.md).
  bool asynchronous = false;
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
  //
  // Buffers may be GPU memory (cxlrt/collectives/gpu_engine.h, docs/gpu.md): the call
  // then moves them with the CUDA engine (DMA to and from the pool,
  // reductions on the GPU). Every non-pool buffer of one call must be of
  // one kind; ranks may differ. `stream` (a cudaStream_t; null: the legacy
  // default stream) orders a device call: it starts after the work enqueued
  // on the stream before it, and work enqueued after it sees the result.
  // The protocol runs on the calling thread, which returns once the result
  // is in place (docs/gpu.md, "Streams"). With host buffers a non-null
  // stream is synchronised before the call.
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                         void* stream = nullptr);
  absl::Status ReduceScatter(const void* send, void* recv, size_t recvcount, DataType type,
                             RedOp op, void* stream = nullptr);
  absl::Status AllGather(const void* send, void* recv, size_t sendcount, DataType type,
                         void* stream = nullptr);
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                         void* stream = nullptr);
  absl::Status Reduce(const void* send, void* recv, size_t count, DataType type, RedOp op, int root,
                      void* stream = nullptr);
  absl::Status Gather(const void* send, void* recv, size_t sendcount, DataType type, int root,
                      void* stream = nullptr);
  absl::Status Scatter(const void* send, void* recv, size_t recvcount, DataType type, int root,
                       void* stream = nullptr);
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType type,
                        void* stream = nullptr);
  // Uneven all-to-all (MPI_Alltoallv): this rank sends send_counts[j]
  // elements from send + send_displs[j] to rank j, and receives
  // recv_counts[j] elements from rank j at recv + recv_displs[j] (counts and
  // displacements in elements, one per rank; zeros allowed). Rank i's
  // send_counts[j] must equal rank j's recv_counts[i]: the ranks exchange
  // their counts first, so a mismatch is kInvalidArgument naming both ranks,
  // on every rank. One round more than AllToAll (the counts); pieces are
  // copied through the slots (never posted in place).
  // kInvalidArgument: spans not of size() entries, or send and recv overlap.
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DataType type, void* stream = nullptr);
  absl::Status Barrier();
  // Asynchronous mode: waits until every queued call has run; returns the
  // first error one of them met (OK in synchronous mode).
  absl::Status Synchronize();
  // Asynchronous mode: the first error a queued call met so far, without
  // waiting (ncclCommGetAsyncError); OK in synchronous mode.
  absl::Status AsyncError() const;
  // Point to point: a Send must meet a Recv of the same count and type.
  // Sends to one peer arrive in order. Send returns once its bytes are in
  // the pool. Buffers and streams as for the collectives.
  absl::Status Send(const void* buf, size_t count, DataType type, int peer, void* stream = nullptr);
  absl::Status Recv(void* buf, size_t count, DataType type, int peer, void* stream = nullptr);
  // Probes of the channels that never wait, for a caller that drives many
  // Sends and Recvs from one thread without blocking on a peer (the torch
  // backend's progress thread). SendFits: a Send of `bytes` to `peer` now
  // would post every chunk without waiting for the receiver (its channel
  // ring has room for all of them). RecvReady: the first chunk of the next
  // Send from `peer` is posted; a Recv of it then waits only for a sender
  // that is already posting (when that Send fitted). False for a bad peer.
  bool SendFits(int peer, size_t bytes) const;
  bool RecvReady(int peer) const;

  // A buffer in the pool that collectives use in place (zero-copy). Freed
  // with Free or when the communicator is destroyed.
  absl::StatusOr<void*> Allocate(size_t bytes);
  absl::Status Free(void* p);

  // Leaves: a barrier, then rank 0 frees the communicator's block once
  // every rank has left (or died). The destructor calls it. Frees this
  // rank's slots and buffers only once its engines have drained and, after
  // a failure, every peer has read its posts (or aborted, left or died);
  // otherwise keeps them and returns kDeadlineExceeded saying so.
  absl::Status Destroy();
  // Marks the communicator aborted for every rank, now; no wait.
  void Abort(absl::string_view why = "aborted by the application");

  // Posts made so far (for tests and benchmarks).
  uint64_t posts() const { return transport_->staged(); }
  // Bytes of each Send/Recv channel, as rank 0 chose them.
  uint64_t p2p_bytes() const { return p2p_bytes_; }
  // Where this rank's data slots lie in the pool (diagnostics, tests).
  const std::vector<PoolOffset>& slots() const { return my_slots_; }

 private:
  class PeerWatch;

  Communicator(allocator::Allocator& alloc, std::string name, int nranks, int rank,
               const CommOptions& options);
  absl::Status Join();
  // Allocates this rank's slots (striped over the pool's devices).
  absl::Status AllocateSlots();
  void FreeSlots();

  PoolOffset RankAt(int r) const {
    return block_ + sizeof(CommHeaderLayout) + uint64_t(r) * sizeof(RankLayout);
  }
  // Channel s -> d (comm_layout.h, P2pLayout): chunk q's header line and
  // bytes, and the receiver's consumed counter.
  PoolOffset P2pAt(int s, int d) const {
    return block_ + p2p_offset_ + (uint64_t(s) * nranks_ + d) * sizeof(P2pLayout);
  }
  PoolOffset P2pChunkAt(int s, int d, uint64_t q) const {
    return P2pAt(s, d) + (q - 1) % kP2pSlots * sizeof(P2pChunkLayout);
  }
  PoolOffset P2pConsumedAt(int s, int d) const {
    return P2pAt(s, d) + offsetof(P2pLayout, consumed);
  }
  uint64_t p2p_chunk_bytes() const { return p2p_bytes_ / kP2pSlots; }  // a slot of the ring
  // The chunks a Send or Recv of `bytes` is cut into (p2p.cc).
  size_t P2pChunkFor(size_t bytes) const;
  PoolOffset P2pBufferAt(int s, int d, uint64_t q) const {
    return block_ + p2p_buffers_offset_ + (uint64_t(s) * nranks_ + d) * p2p_bytes_ +
           (q - 1) % kP2pSlots * p2p_chunk_bytes();
  }

  // Starts a collective: checks the communicator is usable and the
  // arguments, picks the engine for its buffers, numbers the call, and
  // hands the algorithm its context.
  absl::StatusOr<algorithms::Call> Begin(CollKind kind, DataType type, RedOp op, size_t count,
                                         int root, CopyEngine& engine);
  // OK, or why no call may start (destroyed, aborted).
  absl::Status Usable() const;
  // The same, with `failure` as the communicator's first error.
  absl::Status UsableAfter(const absl::Status& failure) const;
  // Asynchronous mode: waits for the queued calls before a call that runs
  // on the caller's thread.
  void Quiesce();
  // Runs `algorithm` as collective `kind` over buffers send and recv (either
  // may be null) ordered on `stream`.
  template <typename Algorithm>
  absl::Status Run(CollKind kind, DataType type, RedOp op, size_t count, int root, const void* send,
                   const void* recv, void* stream, Algorithm algorithm);
  // Run without the asynchronous queue: on the caller's thread.
  template <typename Algorithm>
  absl::Status RunNow(CollKind kind, DataType type, RedOp op, size_t count, int root,
                      const void* send, const void* recv, void* stream, Algorithm algorithm);
  // The engine for a call over `buffers`: the options' engine, else the
  // CUDA engine when one of them is device memory (made on first use), else
  // the CPU engine. Orders a device engine after `stream`.
  absl::StatusOr<CopyEngine*> EngineFor(const char* what,
                                        std::initializer_list<const void*> buffers, void* stream,
                                        bool start = true);
  // `engine` as the device engine, or null when it is another.
  GpuCopyEngine* DeviceOf(CopyEngine* engine) const {
    return engine != nullptr && engine == device_engine_.get() ? device_engine_.get() : nullptr;
  }
  // After a call on `engine`: orders `stream` after it.
  absl::Status EndOnStream(CopyEngine* engine, void* stream);
  // Publishes the bytes of a flag line after its flag word (see .cc).
  void PublishBody(runtime::PoolOffset line, const void* obj, size_t size);
  // Rank 0's Destroy: waits until no rank can write the block any more.
  absl::Status AwaitEveryRankGone();
  // Whether the host of a rank that joined as `peer` is dead, fenced, free
  // or restarted (its process can write the pool no more).
  bool HostGone(const JoinLayout& peer) const;
  // Destroy after a failure: waits until every peer has read this rank's
  // published posts, or left, aborted or died (a peer may still be reading
  // one from its slots). kDeadlineExceeded naming the peer at `deadline`.
  absl::Status AwaitReadersDone(absl::Time deadline);
  // Join, rank 0, before it takes the stale block [block, block+size)
  // whose header is `old`: waits until each rank of that instance has
  // left, aborted or died. kAlreadyExists naming a rank alive at `deadline`.
  absl::Status AwaitStaleRanksGone(PoolOffset block, uint64_t size, const CommHeaderLayout& old,
                                   absl::Time deadline);
  // Drains every engine this communicator used (CopyEngine::Drain).
  absl::Status DrainEngines(absl::Time deadline);
  // After a call failed with `error` on `engine`: drains the engine (its
  // copies write the caller's buffers) and returns `error`, noting a drain
  // that ran out.
  absl::Status SettleAfterError(CopyEngine& engine, absl::Status error);
  // Records the first error, tells the peers, returns it.
  absl::Status Fail(absl::Status s);
  // OK, or the first error (the communicator is then aborted).
  const absl::Status& failed() const;
  // Ends waits when a peer dies, leaves or aborts.
  runtime::WaitWatch* watch() const;
  // The pool offset of [p, p+len) when it lies in the pool.
  std::optional<PoolOffset> InPool(const void* p, size_t len) const;

  allocator::Allocator& alloc_;
  runtime::Pool& pool_;
  runtime::Coherence& c_;
  const std::string name_;  // the block's name: "comm/" + the user's name
  const int nranks_, rank_;
  // CommOptions with every knob resolved (the constructor's work).
  struct Settings {
    absl::Duration timeout;
    uint64_t slot_bytes;
    uint32_t depth;
    uint64_t chunk_bytes, p2p_bytes, oneshot_max;
    CopyEngine* engine;
    bool asynchronous;
  };
  Settings options_;
  PoolOffset block_ = 0;
  uint64_t slot_bytes_ = 0, p2p_bytes_ = 0;
  uint64_t p2p_offset_ = 0, p2p_buffers_offset_ = 0;
  uint32_t depth_ = 0;
  std::vector<PoolOffset> my_slots_;  // allocated by this rank, depth_ of them
  uint64_t instance_ = 0;
  std::vector<JoinLayout> peers_;  // as joined
  std::unique_ptr<PeerWatch> watch_;
  int spins_ = -1;  // spins before a wait yields; -1: CXLRT_WAIT_SPINS
  std::unique_ptr<CopyEngine> cpu_engine_;
  std::unique_ptr<GpuCopyEngine> device_engine_;  // on the first call with device buffers
  std::unique_ptr<Transport> transport_;         // after Join

  uint64_t calls_ = 0;
  absl::Time deadline_;                    // of the current Send or Recv
  std::vector<uint64_t> sent_, received_;  // p2p chunks per peer
  std::vector<PoolOffset> buffers_;        // from Allocate
  bool destroyed_ = false;
  // Asynchronous mode: the proxy thread (made on the first call). Declared
  // last: it is joined before the engines and the transport go.
  std::atomic<GpuCopyEngine*> device_done_{nullptr};  // the engine the proxy reports to
  std::unique_ptr<StreamProxy> proxy_;
  bool made_block_ = false;  // rank 0 made the block (frees it if joining fails)
};

}  // namespace cxlrt::collectives
