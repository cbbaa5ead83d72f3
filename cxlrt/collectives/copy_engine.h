// Copy engines: the one way bytes of a collective move. An algorithm asks
// an engine to copy into the pool, out of it, between its caller's buffers,
// or to reduce several sources into one; each request returns a ticket and
// completes later (a CPU engine may finish it before returning; a GPU copy
// engine finishes when its DMA does). The transport publishes a post only
// after every ticket behind its bytes has completed, and an algorithm
// marks a post read only after the tickets that read it have completed.
//
// Contract of every engine:
// - Tickets complete in any order. An operation that consumes another's
//   output (a copy of a reduced shard) is submitted after Wait on it.
// - ToPool complete: the bytes are in the pool for every host (the
//   coherence domain's publish, non-temporal stores or write-back done).
// - FromPool and Reduce read pool bytes through the address the transport
//   returned for them (already invalidated); they read until they complete,
//   so the caller keeps the post unread-marked until then.
// - Caller buffers may be the engine's kind of memory (host memory for the
//   CPU engine; host or device memory for the CUDA engine of
//   cxlrt/collectives/cuda/).
//
// Thread-safety: an engine belongs to one communicator, used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::collectives {

class CopyEngine {
 public:
  // 0 is the ticket of an operation that had nothing to do (complete).
  using Ticket = uint64_t;

  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  // Whether the caller's buffers are host memory the algorithm may read
  // itself (to post a tiny chunk inline in its post line). False for the
  // CUDA engine: device buffers are reached only through the engine.
  virtual bool host_buffers() const { return true; }

  // Copies [src, src+n) into the pool at `dst`.
  virtual Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) = 0;
  // Copies n published pool bytes at `pool_src` (from Transport::PeerBytes)
  // to `dst`.
  virtual Ticket FromPool(void* dst, const void* pool_src, size_t n) = 0;
  // Copies between caller buffers. REQUIRES: no overlap.
  virtual Ticket Copy(void* dst, const void* src, size_t n) = 0;
  // out = srcs[0] op ... op srcs[n-1] (collectives::Reduce's contract);
  // sources may be pool addresses from PeerBytes, caller buffers, or, for
  // a peer's post inline in its post line, the transport's private copy
  // of those bytes (host memory even in a call of device buffers).
  virtual Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n,
                        size_t count, int avg_divisor) = 0;

  // Whether the engine writes post lines itself (PublishLine): a GPU's
  // copy engine queues the line and its flag behind the copies of the
  // post's bytes, so the host does not wait for those copies to publish.
  virtual bool publishes_posts() const { return false; }
  // Queues the publication of a post line: `image[8, n)` to the pool at
  // `line + 8`, then its flag, `image[0, 8)`, to `line`, once the tickets in
  // `after` have completed. Complete: the line and flag are in the pool
  // for every host. REQUIRES: publishes_posts(); the engine may keep
  // `image` until post seq + 64 is published (seq: image's first 8 bytes).
  virtual Ticket PublishLine(runtime::PoolOffset line, const uint8_t* image, size_t n,
                             const Ticket* after, size_t n_after) {
    (void)line, (void)image, (void)n, (void)after, (void)n_after;
    return 0;
  }

  // True once `t` has completed.
  virtual bool Poll(Ticket t) = 0;
  // OK, or the error that made the engine unusable: no ticket completes
  // after it (Poll stays false, Wait returns it).
  virtual absl::Status failure() const { return absl::OkStatus(); }
  // Waits until `t` has completed: OK, or kDeadlineExceeded (the engine is
  // then unusable and the communicator fails).
  virtual absl::Status Wait(Ticket t, absl::Time deadline) = 0;

  // Waits until no operation of the engine runs any more: every ticket
  // completed, or the engine failed (then none ever runs: failure()).
  // kDeadlineExceeded when operations may still run at `deadline`. A
  // communicator drains before it frees what they write (its slots) and
  // before a failed call returns (they write the caller's buffers).
  virtual absl::Status Drain(absl::Time deadline) {
    (void)deadline;
    return absl::OkStatus();
  }

  // Whether `t` has completed: polled, or with `wait` waited for (then
  // true unless it fails). A failed engine's error is returned either way:
  // a caller that polls while it waits for a peer (which may be waiting for
  // this rank) ends the call at once rather than at its deadline.
  absl::StatusOr<bool> Settle(Ticket t, bool wait, absl::Time deadline) {
    if (t == 0 || Poll(t)) return true;
    if (absl::Status s = wait ? Wait(t, deadline) : failure(); !s.ok()) return s;
    return wait;
  }
};

// The CPU engine: vector copies (runtime::CopyBytes), non-temporal stores
// into the pool (the domain's CopyToPool), the vectorised reduction
// kernels. Every operation completes before it returns.
std::unique_ptr<CopyEngine> MakeCpuEngine(runtime::Coherence& c);

}  // namespace cxlrt::collectives
