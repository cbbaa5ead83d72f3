// The collectives' copy engine for GPU buffers: a CopyEngine built on the
// gpu/ layer's DMA engine (cxlrt/gpu/dma_engine.h), adding what only
// collectives need: reductions as kernels (their sources read through the
// mapped pool or staged in GPU memory), copies between a call's buffers,
// post lines written by the copy engine behind the post's bytes
// (CXLRT_CUDA_DOORBELL=copy), and the stream ordering of a call. Tickets,
// streams and the engine's error are the DMA engine's. docs/gpu.md
// describes the data path. The same header with or without CUDA in the
// build (cxlrt/collectives/no_gpu_engine.cc: MakeGpuCopyEngine says why
// there is none).
//
// Thread-safety: as CopyEngine (one communicator, one thread), except
// Mark and WaitDoneOn (see there).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::collectives {

// Caller buffers may be GPU memory or lie in the pool; private host memory
// is not reachable, except a reduction's small sources, which it stages.
// The stream calls are gpu::DmaEngine's (cxlrt/gpu/dma_engine.h says what
// each does).
class GpuCopyEngine : public CopyEngine {
 public:
  virtual absl::Status StartAfter(void* stream) = 0;
  virtual absl::Status FinishBefore(void* stream) = 0;
  // Asynchronous calls (CommOptions::asynchronous): Mark and WaitDoneOn
  // are the caller's thread's, StartAfterMark and SetDone the proxy's.
  virtual absl::StatusOr<uint64_t> Mark(void* stream) = 0;
  virtual absl::Status StartAfterMark(uint64_t mark) = 0;
  virtual absl::Status WaitDoneOn(void* stream, uint64_t seq) = 0;
  virtual void SetDone(uint64_t seq) = 0;
};

// An engine over the pool mapping [base, base+size) that `c` covers, on the
// calling thread's current GPU (gpu::MakeDmaEngine's contract and errors).
absl::StatusOr<std::unique_ptr<GpuCopyEngine>> MakeGpuCopyEngine(runtime::Coherence& c,
                                                                 uint8_t* base, uint64_t size);

}  // namespace cxlrt::collectives
