// A DMA engine between GPU memory and the pool: copies into the pool and
// out of it (one at a time or a batch of scattered buffers in one
// submission), each returning a ticket that completes later, and the
// stream ordering that ties them to a caller's CUDA stream (docs/gpu.md).
// The KV store's GPU batches use it directly; the collectives' GPU copy
// engine (cxlrt/collectives/gpu_engine.h) is built on it. The same header
// with or without CUDA in the build (cxlrt/gpu/no_gpu.cc: MakeDmaEngine
// says why there is none).
//
// Thread-safety: an engine is used by one thread at a time, except where a
// call says otherwise (Mark, WaitDoneOn).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::gpu {

// GPU -> pool DMA on one stream, pool -> GPU DMA on another (both copy
// engines of the GPU run at once). Tickets are CUDA events. Caller buffers
// may be GPU memory or lie in the pool (whose mapping the engine
// registered); private host memory is not reachable.
class DmaEngine {
 public:
  // 0 is the ticket of an operation that had nothing to do (complete).
  using Ticket = uint64_t;

  virtual ~DmaEngine() = default;

  // Copies [src, src+n) into the pool at `dst`. Complete: the bytes are in
  // the pool for every host.
  virtual Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) = 0;
  // Copies n pool bytes at `pool_src` (a host address in the mapping) to
  // `dst`.
  virtual Ticket FromPool(void* dst, const void* pool_src, size_t n) = 0;
  // Copies count buffers, dsts[i] <- srcs[i] of sizes[i] bytes, in one
  // submission (cudaMemcpyBatchAsync where the driver has it; SMs through
  // the mapped pool under CXLRT_CUDA_KV_COPY=kernel), into the pool
  // (`to_pool`: every dst lies in the pool) or out of it; one ticket for
  // them all. For scattered KV pages.
  virtual Ticket CopyBatch(bool to_pool, void* const* dsts, const void* const* srcs,
                           const size_t* sizes, size_t count) = 0;

  // True once `t` has completed.
  virtual bool Poll(Ticket t) = 0;
  // OK, or the error that made the engine unusable: no ticket completes
  // after it (Poll stays false, Wait returns it).
  virtual absl::Status failure() const = 0;
  // Waits until `t` has completed: OK, or kDeadlineExceeded (the engine is
  // then unusable).
  virtual absl::Status Wait(Ticket t, absl::Time deadline) = 0;
  // Waits until no operation of the engine runs any more: every ticket
  // completed, or the engine failed. kDeadlineExceeded when operations may
  // still run at `deadline`.
  virtual absl::Status Drain(absl::Time deadline) = 0;

  // Orders the engine's later operations after the work enqueued so far
  // on `stream` (a cudaStream_t; null: the legacy default stream).
  virtual absl::Status StartAfter(void* stream) = 0;
  // Orders `stream`'s later work after every operation of the engine so
  // far, without waiting on the host.
  virtual absl::Status FinishBefore(void* stream) = 0;

  // Asynchronous calls (CommOptions::asynchronous): the caller's thread
  // queues a call and returns; a proxy thread runs it on this engine.
  // Mark and WaitDoneOn are called by the caller's thread while the proxy
  // uses the engine: they touch only their own state and the caller's
  // stream. StartAfterMark and SetDone are the proxy's.
  //
  // Records the work enqueued on `stream` so far; returns its mark.
  virtual absl::StatusOr<uint64_t> Mark(void* stream) = 0;
  // Orders the engine's later operations after the work of `mark`.
  virtual absl::Status StartAfterMark(uint64_t mark) = 0;
  // Makes `stream` wait, on the GPU, until SetDone(v) with v >= seq
  // (cuStreamWaitValue64 on a page-locked word, or a one-thread kernel
  // that polls it where the driver lacks stream memory operations).
  virtual absl::Status WaitDoneOn(void* stream, uint64_t seq) = 0;
  // Publishes that every call up to `seq` has finished.
  virtual void SetDone(uint64_t seq) = 0;
};

// An engine over the pool mapping [base, base+size) that `c` covers, on the
// calling thread's current GPU, holding the mapping's registration
// (PoolRegistration::Get). kUnavailable when no GPU is available;
// kFailedPrecondition naming the CUDA error when the mapping cannot be
// registered.
absl::StatusOr<std::unique_ptr<DmaEngine>> MakeDmaEngine(runtime::Coherence& c, uint8_t* base,
                                                         uint64_t size);

}  // namespace cxlrt::gpu
