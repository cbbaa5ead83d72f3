// An InterPodEngine over a second pool that every rank maps (the
// "interconnect pool"): emulated pods on one machine, or a slower shared
// pool that spans a rack. A real engine, not a test fake: each group is a
// collectives::Communicator of its members in that pool, so it moves bytes
// with the pool's protocol and fails the way a communicator fails (a dead
// member is kAborted through the pool's membership; a slow one is
// kDeadlineExceeded).
//
// Operations: the engine queues each call on a worker thread of its own,
// which runs them in order on a synchronous communicator; the call returns
// a Ticket at once, and Wait(t) waits for the worker to finish call t. So
// an engine operation overlaps whatever the caller does meanwhile (the
// pod's own collectives in MultiPodCommunicator's pipeline). Not the
// communicator's asynchronous mode: its Synchronize waits for every queued
// call with no deadline of its own and no completion per call, and its
// Abort first drains the queue, where Wait needs a deadline per ticket and
// Abort must not block.
//
// Send/Recv: the communicator has no tags and matches a pair's messages in
// order, so the engine sends a 16-byte header (tag, bytes) before each
// message and a Recv whose tag or size differs from the header it meets is
// kInvalidArgument (the engine is then unusable), never wrong bytes. They
// run on the worker in order with the collectives: a Recv blocks every
// later operation of this engine until its Send comes. A Send returns (on
// the worker) once its bytes fit in the pair's channel (CommOptions::
// p2p_bytes); a larger one waits for the receiver, as MPI_Send may. So two
// members that both Send a message larger than the channel to each other
// before either Recvs deadlock until the deadline, as with MPI; the
// hierarchical communicator never does that (docs/collectives.md, "Beyond
// one pool").
//
// Abort: Wait and later calls fail with kAborted at once; the worker aborts
// the communicator (so its members see kAborted) when the operation it is
// running ends, which takes at most the communicator's timeout.
//
// Thread-safety: one thread at a time calls an engine (inter_pod.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/pods/inter_pod.h"

namespace cxlrt::pods {

// Makes (rank 0) or joins the engine `name` of `nranks` members in the pool
// of `alloc`, as `rank`. Waits up to options.timeout for every member.
// `options.asynchronous` is ignored (the engine has its own worker).
// Errors as collectives::Communicator::Create.
// REQUIRES: `alloc` outlives the engine and every engine split from it.
absl::StatusOr<std::unique_ptr<InterPodEngine>> MakePoolEngine(
    allocator::Allocator& alloc, absl::string_view name, int nranks, int rank,
    const collectives::CommOptions& options = {});

}  // namespace cxlrt::pods
