// The engine between pods (docs/collectives.md, "Beyond one pool").
//
// A pod is the set of ranks that map one pool; inside it the pool
// communicator (cxlrt/collectives/communicator.h) moves the bytes. Between
// pods an existing engine does: Open MPI (mpi_engine.h), or a second pool
// that every pod can map (pool_engine.h: emulated pods on one machine, and
// the tests' engine where MPI is not wanted). cxlrt never grows a network
// transport of its own.
//
// An InterPodEngine is one group of ranks with a rank and a size: the
// "world" (every rank of the job, for the layout exchange and for Send/Recv
// between pods), and, split from it, one "rail" per local index (the ranks
// that hold local index l in their pods, one per pod, ordered by pod).
//
// Operations start and return at once with a Ticket; Wait completes one,
// giving up at a deadline. Every member of a group starts the same
// operations in the same order (MPI's rule for collectives); Send/Recv
// between two members match in order per (peer, tag). Buffers belong to the
// engine from the start until Wait returns OK for its ticket; after an
// error (of the operation, a deadline, an Abort) the engine is unusable and
// the caller must not reuse the buffers of operations not waited for
// before the engine is destroyed.
//
// Errors: kDeadlineExceeded when Wait's deadline passes (a dead member in
// another pod shows this way when the engine cannot tell death from
// slowness); kAborted when the engine knows a member died or Abort was
// called; kInvalidArgument for a bad argument (count, peer, root, type the
// engine cannot reduce); kUnavailable when the engine cannot be made.
//
// Thread-safety: one thread at a time calls an engine; an implementation
// may progress its operations on a thread of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/collectives/types.h"

namespace cxlrt::pods {

using collectives::DataType;
using collectives::RedOp;

class InterPodEngine {
 public:
  using Ticket = uint64_t;

  virtual ~InterPodEngine() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi", "pool": names the engine in messages.
  virtual const char* name() const = 0;

  // A new group of the members that pass the same `color` (>= 0), ranked by
  // `key` then by rank (MPI_Comm_split). Collective over this group; blocks
  // until every member has called it or the deadline passes.
  virtual absl::StatusOr<std::unique_ptr<InterPodEngine>> Split(int color, int key,
                                                                absl::Time deadline) = 0;

  // Collectives of the group, counts in elements. `op` is kSum, kProd, kMin
  // or kMax (kAvg is the caller's: it sums and divides once). In place when
  // send == recv (AllGather: send == recv + rank * count).
  virtual absl::StatusOr<Ticket> AllReduce(const void* send, void* recv, size_t count,
                                           DataType type, RedOp op) = 0;
  virtual absl::StatusOr<Ticket> ReduceScatter(const void* send, void* recv, size_t recvcount,
                                               DataType type, RedOp op) = 0;
  virtual absl::StatusOr<Ticket> AllGather(const void* send, void* recv, size_t count,
                                           DataType type) = 0;
  virtual absl::StatusOr<Ticket> Broadcast(void* buf, size_t count, DataType type, int root) = 0;
  virtual absl::StatusOr<Ticket> Reduce(const void* send, void* recv, size_t count, DataType type,
                                        RedOp op, int root) = 0;
  // MPI_Alltoallv in bytes: send_counts[j] bytes from send + send_displs[j]
  // to member j; recv_counts[j] bytes from member j at recv +
  // recv_displs[j]. Spans of size() entries; zeros allowed.
  virtual absl::StatusOr<Ticket> AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                           absl::Span<const size_t> send_displs, void* recv,
                                           absl::Span<const size_t> recv_counts,
                                           absl::Span<const size_t> recv_displs) = 0;
  virtual absl::StatusOr<Ticket> Barrier() = 0;
  // Point to point in bytes; `tag` >= 0. A Send matches the Recv of the
  // same (peer, tag) in order, and their sizes must be equal.
  virtual absl::StatusOr<Ticket> Send(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual absl::StatusOr<Ticket> Recv(void* buf, size_t bytes, int peer, int tag) = 0;

  // Completes `ticket` (and every operation started before it), or gives
  // up at `deadline`.
  virtual absl::Status Wait(Ticket ticket, absl::Time deadline) = 0;
  // Makes every later call and every pending Wait fail with kAborted; tells
  // the other members where the engine can (they may see it only as their
  // deadline). Never blocks.
  virtual void Abort(absl::string_view why) = 0;
};

}  // namespace cxlrt::pods
