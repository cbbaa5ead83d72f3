// The CUDA DMA engine (cxlrt/gpu/dma_engine.h) as a class, for the engines
// built on it: the collectives' GPU copy engine (cxlrt/collectives/cuda/)
// queues its kernels and post lines on this engine's streams and takes its
// tickets from it, so one ticket space and one error cover both. Internal
// to cxlrt's CUDA sources; not installed.
//
// Thread-safety: as DmaEngine.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "cxlrt/gpu/cuda/driver.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/registration.h"

namespace cxlrt::gpu::cuda {

class CudaDmaEngine final : public DmaEngine {
 public:
  // Events in flight at most; an older ticket's event is waited for before
  // it is reused (in practice tickets are long complete by then).
  static constexpr size_t kEvents = 512;

  // REQUIRES: GpuAvailable().
  static absl::StatusOr<std::unique_ptr<CudaDmaEngine>> Make(runtime::Coherence& c, uint8_t* base,
                                                             uint64_t size);
  ~CudaDmaEngine() override;

  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override;
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override;
  Ticket CopyBatch(bool to_pool, void* const* dsts, const void* const* srcs, const size_t* sizes,
                   size_t count) override;
  bool Poll(Ticket t) override;
  absl::Status failure() const override { return error_; }
  absl::Status Wait(Ticket t, absl::Time deadline) override;
  absl::Status Drain(absl::Time deadline) override;
  absl::Status StartAfter(void* stream) override;
  absl::Status FinishBefore(void* stream) override;
  absl::StatusOr<uint64_t> Mark(void* stream) override;
  absl::Status StartAfterMark(uint64_t mark) override;
  absl::Status WaitDoneOn(void* stream, uint64_t seq) override;
  void SetDone(uint64_t seq) override;

  // --- For engines built on this one.
  // The streams: GPU -> pool copies, pool -> GPU copies, kernels.
  cudaStream_t to_pool_stream() const { return to_pool_; }
  cudaStream_t from_pool_stream() const { return from_pool_; }
  cudaStream_t compute_stream() const { return compute_; }
  runtime::Coherence& coherence() const { return c_; }
  uint8_t* base() const { return base_; }
  const PoolRegistration& registration() const { return *reg_; }
  // The address kernels use for p: its GPU address when it lies in the
  // registered pool, else p.
  const void* GpuAddress(const void* p) const {
    return reg_->Contains(p, 1) ? reg_->GpuAddress(p) : p;
  }
  // A ticket for the work enqueued on `s` so far.
  Ticket Record(cudaStream_t s);
  // Ticket t's event now serves a later ticket (t completed before that).
  bool EventReused(Ticket t) const { return t + kEvents <= next_; }
  // The event of a ticket that is not reused.
  cudaEvent_t EventOf(Ticket t) const { return events_[t % kEvents]; }
  // Records the first error (the engine is unusable after it).
  void Check(cudaError_t e, const char* what);
  void SetError(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
  }
  // Waits, on the host, until every stream of the engine is idle (errors
  // ignored): before an engine built on this one frees what they use.
  void SynchronizeStreams();

 private:
  CudaDmaEngine(runtime::Coherence& c, uint8_t* base, std::shared_ptr<PoolRegistration> reg);
  absl::Status Init();

  runtime::Coherence& c_;
  uint8_t* const base_;
  std::shared_ptr<PoolRegistration> reg_;
  int gpu_ = 0;
  cudaStream_t to_pool_ = nullptr, from_pool_ = nullptr, compute_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t start_ = nullptr, end_[3] = {};
  Ticket next_ = 0;
  bool batch_api_ = true;  // cudaMemcpyBatchAsync works here
  // CXLRT_CUDA_KV_COPY=kernel: KV batches copied by SMs through the mapped
  // pool instead of the copy engine (docs/gpu.md).
  const bool kernel_batches_;
  // Asynchronous calls: marks on callers' streams, and the done word.
  static constexpr uint64_t kMarks = 256;
  std::mutex mark_mu_;
  uint64_t marks_ = 0;                   // guarded by mark_mu_
  std::atomic<uint64_t> marks_used_{0};  // by the proxy
  cudaEvent_t mark_events_[kMarks] = {};
  uint64_t* done_host_ = nullptr;         // page-locked; the proxy stores, streams wait
  uint64_t* done_gpu_ = nullptr;          // its GPU address
  StreamValue64Fn wait_value_ = nullptr;  // cuStreamWaitValue64, when the driver has it
  absl::Status error_;                    // the first error: the engine is unusable after it
};

}  // namespace cxlrt::gpu::cuda
