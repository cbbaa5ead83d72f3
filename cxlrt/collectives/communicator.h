// Communicators and NCCL-shaped collectives over the pool (CPU data path).
//
// A communicator is (pool, name, nranks, rank). Rank 0 makes its block in
// the pool under the name "comm/NAME"; the others find it and join. There is
// no network bootstrap. Every collective runs as a pipeline of chunks
// (cxlrt/collectives/algorithms/): per chunk each rank posts its bytes (inline in
// its post line when tiny, else in its slot, or in place when its buffer
// already lies in the pool) with a descriptor of the call, waits for every
// peer's post of the same chunk, checks the descriptors, reads what it
// needs, and marks the post read (the transport, transport.h). Each rank has
// a ring of slots, so it copies chunk k+1 in while its peers read chunk k.
// Bytes move through a copy engine (copy_engine.h). docs/collectives.md is
// the protocol and the algorithms. The state lives behind an Impl
// (communicator_impl.h), so none of those headers is installed.
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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::collectives {

using runtime::PoolOffset;

class CopyEngine;  // copy_engine.h (not installed: engines are made in the tree)

// A field left nullopt takes its knob (cxlrt/collectives/comm_knobs.h), read
// once per process; README.md lists the knobs and their defaults. A value,
// 0 included, is taken as given, with the meaning the knob's value would
// have (before issue 26, 0 meant "the environment"; now only nullopt does).
struct CommOptions {
  // Every wait of a call gives up after this (kDeadlineExceeded); must be
  // positive. nullopt: CXLRT_COMM_TIMEOUT_MS, else 60 s.
  std::optional<absl::Duration> timeout;
  // Bytes of each of a rank's data slots (the most one post of a rank holds
  // when it is not posted in place). nullopt: CXLRT_COMM_SLOT_BYTES, else
  // 1 MiB (4 MiB on a machine with a GPU). Rank 0's value wins, as for depth.
  std::optional<uint64_t> slot_bytes;
  // Slots per rank, kMinDepth to kMaxDepth (2 to 8, types.h): a rank posts
  // up to depth - 1 chunks ahead of its slowest peer. nullopt: CXLRT_COMM_DEPTH, else 4.
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
  // thread of the communicator runs the calls in order. A GPU call's
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

  bool destroyed() const;
  int rank() const;
  int size() const;
  // The block's name: "comm/" + the name it was created with.
  const std::string& name() const;

  // Collectives, NCCL's argument conventions: counts in elements; in place
  // when send == recv (for AllGather: send == recv + rank * count; for
  // ReduceScatter: recv == send + rank * recvcount). Buffers that lie in the
  // pool (from Allocate) are read in place instead of copied in.
  //
  // Buffers may be GPU memory (cxlrt/collectives/gpu_engine.h, docs/gpu.md): the call
  // then moves them with the CUDA engine (DMA to and from the pool,
  // reductions on the GPU). Every non-pool buffer of one call must be of
  // one kind; ranks may differ. `stream` (a cudaStream_t; null: the legacy
  // default stream) orders a GPU call: it starts after the work enqueued
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
  // on every rank. One round more than AllToAll (the counts). A send buffer
  // from Allocate is posted in place (peers read it where it is; it is the
  // caller's again when the call has run); ranks may differ in that.
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
  uint64_t posts() const;
  // Bytes of each Send/Recv channel, as rank 0 chose them.
  uint64_t p2p_bytes() const;
  // Where this rank's data slots lie in the pool (diagnostics, tests).
  const std::vector<PoolOffset>& slots() const;

 private:
  struct Impl;  // communicator_impl.h

  explicit Communicator(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlrt::collectives
