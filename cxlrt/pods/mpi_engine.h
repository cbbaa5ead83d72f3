// The engine between pods over Open MPI (docs/collectives.md, "Beyond one pool"): an
// InterPodEngine (inter_pod.h) on a duplicate of an MPI communicator.
//
// Who owns MPI: when the program has not initialised MPI, World()
// initialises it (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) and
// cxlrt finalises it at process exit (std::atexit), unless an engine of
// this process broke (a deadline, an abort, an MPI error): MPI_Finalize
// synchronises with every process of the job, which a dead one never
// joins, so the process then exits without it. A program that initialised
// MPI itself keeps full control: cxlrt never finalises it, and only frees
// what it made (its communicators, and nothing else, when an engine is
// destroyed cleanly).
//
// World() ignores SIGPIPE when it is at its default disposition: Open
// MPI's TCP transport writes to a dead peer's socket without MSG_NOSIGNAL,
// and the signal would kill this rank before it could report the error.
//
// Every operation is nonblocking (MPI_I*); Wait polls MPI_Test with backoff
// until the ticket is complete or the deadline passes, so a dead member in
// another pod never hangs a rank. Open MPI progresses a nonblocking
// collective only inside MPI calls: when MPI_THREAD_MULTIPLE is provided,
// the engine runs a progress thread while it has operations in flight (it
// calls MPI_Iprobe on MPI_COMM_SELF, never MPI_Test on the caller's
// requests), so the inter-pod step of one chunk moves while the
// caller works in the pool; otherwise operations progress in Wait only.
//
// Abort notices: an engine that aborts (Abort, or the error path of the
// communicator over it) tells every member of its world on a communicator
// of their own, without waiting for them; every engine of that world
// (World's and its splits) polls for a notice in Wait and fails with
// kAborted when one arrives, so a rank that gave up fails the other pods'
// ranks at once rather than at their deadline (Open MPI 4.1 has no revoke).
//
// After an error (a deadline, MPI's, an Abort) the engine is broken: every
// later call returns that error. Its MPI communicator and the requests in
// flight are left as they are (MPI can neither cancel a collective nor free
// a communicator with one pending), so MPI may still write the receive
// buffers of operations not waited for: end the job (exit, MPI_Abort)
// rather than reuse them.
//
// Thread-safety: one thread at a time calls an engine (inter_pod.h);
// Abort() may be called from any thread.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "cxlrt/pods/inter_pod.h"

namespace cxlrt::pods {

struct MpiEngineOptions {
  // Progress operations on a thread of the engine while any is in flight.
  // nullopt: when MPI provides MPI_THREAD_MULTIPLE. true without it is
  // kFailedPrecondition.
  std::optional<bool> progress_thread;
  // Largest element count of one MPI call: a longer AllReduce, Broadcast,
  // Reduce, Send or Recv is cut into calls of at most this many elements
  // (MPI counts are int); the others refuse a count above it. 0: INT_MAX.
  // Tests set it small to reach the cutting path.
  size_t max_count_per_call = 0;
};

class MpiEngine {
 public:
  // An engine over a duplicate of `comm` (MPI_COMM_WORLD when the caller has
  // none), with MPI_ERRORS_RETURN set on the duplicate. Initialises MPI
  // when the program has not (see above). Collective over `comm` (its
  // MPI_Comm_dup blocks until every member has called it).
  // Returns kUnavailable when MPI cannot be initialised or was finalised,
  // kFailedPrecondition for a progress thread without MPI_THREAD_MULTIPLE,
  // kInvalidArgument for MPI_COMM_NULL.
  static absl::StatusOr<std::unique_ptr<InterPodEngine>> World(
      MPI_Comm comm = MPI_COMM_WORLD, const MpiEngineOptions& options = {});

  // Whether this process's MPI provides MPI_THREAD_MULTIPLE (false before
  // MPI is initialised).
  static bool ThreadMultiple();
};

}  // namespace cxlrt::pods
