// A communicator across pods (docs/collectives.md, "Beyond one pool").
//
// Inside a pod the ranks share a pool communicator (collectives::
// Communicator in the pod's pool); between pods an InterPodEngine (Open
// MPI, or the pool engine over an interconnect pool) moves the bytes, one
// "rail" per local index: the ranks with local index l, one per pod that
// has one. Every collective is composed level by level: all-reduce is a
// reduce-scatter in the pod, an all-reduce of each shard over the rails,
// and an all-gather in the pod; the others are written down in the docs.
// Every collective but all-to-all(v) and barrier runs as a pipeline of
// chunks: the engine's step of chunk k runs while the pod steps of chunks
// k + 1 and k - 1 do (all-to-all(v) runs its two tiers at once instead). Pods may differ in size.
// With one pod every call goes straight to the pool communicator and the engine is never called.
//
// Over Open MPI, CreateOverMpi (mpi_communicator.h, library cxlrt_pods_mpi)
// makes the engine and the communicator in one call.
//
// Ranks are pod-major (layout.h): pod 0's ranks first. Buffers are host
// memory (the engine's and the pool communicator's CPU path).
//
// Errors: those of the pool communicator and the engine. Any error aborts
// both tiers on this rank, so that every rank of every pod sees kAborted
// (or the engine's error, or kDeadlineExceeded) within its deadline rather
// than waiting, and destroys the engines before the call returns (so no
// engine operation still writes the caller's buffers: with the pool
// engine that waits for its running operation, so an error can take up to
// about twice the timeout to return); after an error every call is
// kFailedPrecondition.
//
// Thread-safety: one thread at a time, like collectives::Communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/pods/inter_pod.h"
#include "cxlrt/pods/layout.h"

namespace cxlrt::pods {

using collectives::CommOptions;

struct PodOptions {
  // Bytes of a pipeline chunk (of the call's buffer for AllReduce,
  // Broadcast and Reduce; chunk_bytes / size() of every rank's block for
  // ReduceScatter, AllGather, Gather and Scatter); a call of at most one
  // chunk runs in one piece. 0: 4 MiB. Every rank must pass the same value:
  // Create all-gathers it across pods and refuses (kInvalidArgument, on
  // every rank) values that differ.
  uint64_t chunk_bytes = 0;
};

// Where a rank's time went in the calls since the last ResetTierTimes
// (for benchmarks): its pod steps, and the time it waited for the engine
// beyond what overlapped its pod steps.
struct TierTimes {
  absl::Duration pod;
  absl::Duration engine_wait;
  uint64_t engine_ops = 0;
};

class MultiPodCommunicator {
 public:
  // Learns the layout over `world` (every rank of the job), creates the
  // pod's pool communicator "pods/NAME" in the pool of `pod_alloc`, and
  // splits this rank's rail from `world`. Waits up to options.timeout
  // (unset: CXLRT_COMM_TIMEOUT_MS, as the pool communicator).
  // `options` are the pool communicator's (its timeout is also every
  // engine wait's). Errors: the engine's or the pool communicator's.
  // REQUIRES: `pod_alloc` outlives the communicator.
  static absl::StatusOr<std::unique_ptr<MultiPodCommunicator>> Create(
      allocator::Allocator& pod_alloc, absl::string_view name,
      std::unique_ptr<InterPodEngine> world, const CommOptions& options = {},
      const PodOptions& pod_options = {});
  ~MultiPodCommunicator();
  MultiPodCommunicator(const MultiPodCommunicator&) = delete;
  MultiPodCommunicator& operator=(const MultiPodCommunicator&) = delete;

  int rank() const;  // pod-major
  int size() const;
  int pod() const;
  int npods() const;
  int local_rank() const;
  int pod_size() const;
  const PodLayout& layout() const;

  // NCCL's argument conventions and in-place rules, as collectives::
  // Communicator's (communicator.h), over every rank of every pod.
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
  // Counts and displacements in elements, one per rank (zeros allowed).
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DataType type);
  absl::Status Barrier();
  // Between any two ranks: through the pod's pool inside a pod, through
  // the world engine between pods. Messages to one peer arrive in order.
  absl::Status Send(const void* buf, size_t count, DataType type, int peer);
  absl::Status Recv(void* buf, size_t count, DataType type, int peer);

  // Leaves both tiers (the pool communicator's Destroy, then the engines').
  absl::Status Destroy();
  // Aborts both tiers on this rank, then destroys the engines, which waits
  // for an engine operation still running (at most the timeout), so that
  // no engine writes a buffer of the application after this returns.
  void Abort(absl::string_view why = "aborted by the application");

  TierTimes tier_times() const;
  void ResetTierTimes();

 private:
  struct Impl;
  explicit MultiPodCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlrt::pods
