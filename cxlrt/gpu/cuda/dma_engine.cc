// The CUDA DMA engine (cxlrt/gpu/dma_engine.h, class in
// cxlrt/gpu/cuda/dma_engine.h). docs/gpu.md explains the choices (streams,
// events, batches, the done word of asynchronous calls).
#include "cxlrt/gpu/cuda/dma_engine.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/gpu/cuda/kernels.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/gpu_knobs.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::gpu {
namespace cuda {

CudaDmaEngine::CudaDmaEngine(runtime::Coherence& c, uint8_t* base,
                             std::shared_ptr<PoolRegistration> reg)
    : c_(c), base_(base), reg_(std::move(reg)), kernel_batches_(kCudaKvCopy.Get() == "kernel") {}

absl::StatusOr<std::unique_ptr<CudaDmaEngine>> CudaDmaEngine::Make(runtime::Coherence& c,
                                                                   uint8_t* base, uint64_t size) {
  auto reg = PoolRegistration::Get(base, size);
  if (!reg.ok()) return reg.status();
  auto e = std::unique_ptr<CudaDmaEngine>(new CudaDmaEngine(c, base, *std::move(reg)));
  if (absl::Status s = e->Init(); !s.ok()) return s;
  return e;
}

CudaDmaEngine::~CudaDmaEngine() {
  SynchronizeStreams();
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : mark_events_) {
    if (e) (void)cudaEventDestroy(e);
  }
  // done_host_ stays: a caller's stream may still be polling it (its wait
  // ends once it reads the last SetDone, which can be after we return).
  // Eight page-locked bytes per engine, for the process's life.
  for (cudaEvent_t e : {start_, end_[0], end_[1], end_[2]}) {
    if (e) (void)cudaEventDestroy(e);
  }
  for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
    if (s) (void)cudaStreamDestroy(s);
  }
  (void)cudaGetLastError();
}

void CudaDmaEngine::SynchronizeStreams() {
  (void)cudaSetDevice(gpu_);
  for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
    if (s) (void)cudaStreamSynchronize(s);
  }
}

DmaEngine::Ticket CudaDmaEngine::ToPool(runtime::PoolOffset dst, const void* src, size_t n) {
  if (n == 0) return 0;
  // The simulated domain must not keep lines over which the DMA lands.
  c_.BeforeGpuWrite(dst, n);
  Check(cudaMemcpyAsync(base_ + dst, src, n, cudaMemcpyDefault, to_pool_), "copy to the pool");
  return Record(to_pool_);
}

DmaEngine::Ticket CudaDmaEngine::FromPool(void* dst, const void* pool_src, size_t n) {
  if (n == 0) return 0;
  Check(cudaMemcpyAsync(dst, pool_src, n, cudaMemcpyDefault, from_pool_), "copy from the pool");
  return Record(from_pool_);
}

DmaEngine::Ticket CudaDmaEngine::CopyBatch(bool to_pool, void* const* dsts, const void* const* srcs,
                                           const size_t* sizes, size_t count) {
  if (count == 0) return 0;
  cudaStream_t s = to_pool ? to_pool_ : from_pool_;
  if (to_pool) {
    for (size_t i = 0; i < count; ++i) {
      c_.BeforeGpuWrite(static_cast<uint8_t*>(dsts[i]) - base_, sizes[i]);
    }
  }
  bool small = true;  // a gather kernel item's size is 32 bits
  for (size_t i = 0; i < count; ++i) small = small && sizes[i] <= UINT32_MAX;
  if (kernel_batches_ && small) {
    // SM copies through the mapped pool, a launch per 512 items.
    GatherArgs a{};
    for (size_t i = 0; i < count; ++i) {
      a.dst[a.count] = const_cast<void*>(GpuAddress(dsts[i]));
      a.src[a.count] = GpuAddress(srcs[i]);
      a.size[a.count] = static_cast<uint32_t>(sizes[i]);
      if (++a.count == kMaxGatherItems || i + 1 == count) {
        Check(LaunchGather(a, s), "gather kernel");
        a.count = 0;
      }
    }
    return Record(s);
  }
  if (batch_api_) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &first, 1, s);
    if (e == cudaSuccess) return Record(s);
    (void)cudaGetLastError();
    // Refused on first use: this driver or these pointers do not take
    // batches; copy one by one from now on (logged once).
    CXLRT_LOG(kWarning) << "cudaMemcpyBatchAsync: " << CudaError(e)
                        << ": KV batches copy item by item";
    batch_api_ = false;
  }
  for (size_t i = 0; i < count; ++i) {
    Check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s), "batch copy");
  }
  return Record(s);
}

bool CudaDmaEngine::Poll(Ticket t) {
  if (t == 0) return true;
  if (!error_.ok()) return false;   // Wait reports it
  if (EventReused(t)) return true;  // waited for before its event was reused
  const cudaError_t e = cudaEventQuery(events_[t % kEvents]);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) Check(e, "a copy or kernel");
  return false;
}

absl::Status CudaDmaEngine::Wait(Ticket t, absl::Time deadline) {
  for (uint64_t spins = 0;; ++spins) {
    if (Poll(t)) return absl::OkStatus();
    if (!error_.ok()) return error_;
    if (spins % 256 == 255) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            "a device copy or kernel did not complete by the call's deadline");
      }
      sched_yield();
    }
  }
}

// Every stream of the engine idle: its copies into the pool (a
// communicator's slots, post lines under CXLRT_CUDA_DOORBELL=copy) and
// into the caller's buffers have landed. A stream that reports an error
// runs nothing more (a sticky error ends the context's work).
absl::Status CudaDmaEngine::Drain(absl::Time deadline) {
  (void)cudaSetDevice(gpu_);
  for (uint64_t spins = 0;; ++spins) {
    bool busy = false;
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      if (!s) continue;
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaErrorNotReady) {
        busy = true;
      } else if (e != cudaSuccess) {
        (void)cudaGetLastError();
      }
    }
    if (!busy) return absl::OkStatus();
    if (spins % 256 == 255) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            "the device's copies into the pool and the caller's buffers were still running at "
            "the deadline");
      }
      sched_yield();
    }
  }
}

absl::Status CudaDmaEngine::StartAfter(void* stream) {
  Check(cudaSetDevice(gpu_), "cudaSetDevice");
  Check(cudaEventRecord(start_, static_cast<cudaStream_t>(stream)), "event on the caller's stream");
  for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
    Check(cudaStreamWaitEvent(s, start_, 0), "stream wait");
  }
  return error_;
}

absl::Status CudaDmaEngine::FinishBefore(void* stream) {
  int i = 0;
  for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
    Check(cudaEventRecord(end_[i], s), "event on an engine stream");
    Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), end_[i], 0),
          "caller's stream wait");
    ++i;
  }
  return error_;
}

absl::StatusOr<uint64_t> CudaDmaEngine::Mark(void* stream) {
  std::lock_guard<std::mutex> lock(mark_mu_);
  const uint64_t m = ++marks_;
  // The proxy has not yet used the mark this one replaces: the caller
  // is kMarks calls ahead of it; wait for it to catch up.
  while (m - marks_used_.load(std::memory_order_acquire) >= kMarks) sched_yield();
  if (cudaError_t e = cudaEventRecord(mark_events_[m % kMarks], static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return Failed("event on the caller's stream", e);
  }
  return m;
}

absl::Status CudaDmaEngine::StartAfterMark(uint64_t mark) {
  Check(cudaSetDevice(gpu_), "cudaSetDevice");
  for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
    Check(cudaStreamWaitEvent(s, mark_events_[mark % kMarks], 0), "stream wait");
  }
  marks_used_.store(mark, std::memory_order_release);
  return error_;
}

absl::Status CudaDmaEngine::WaitDoneOn(void* stream, uint64_t seq) {
  auto s = static_cast<cudaStream_t>(stream);
  if (wait_value_ != nullptr) {
    if (wait_value_(s, reinterpret_cast<uint64_t>(done_gpu_), seq, kWaitValueGeq) == 0) {
      return absl::OkStatus();
    }
    CXLRT_LOG(kWarning) << "cuStreamWaitValue64 refused: streams wait on a polling kernel";
    wait_value_ = nullptr;
  }
  if (cudaError_t e = LaunchWaitWord(done_gpu_, seq, s); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Failed("the stream's wait kernel", e);
  }
  return absl::OkStatus();
}

void CudaDmaEngine::SetDone(uint64_t seq) {
  std::atomic_ref<uint64_t>(*done_host_).store(seq, std::memory_order_release);
}

absl::Status CudaDmaEngine::Init() {
  cudaError_t e = cudaGetDevice(&gpu_);
  if (e != cudaSuccess) return Failed("cudaGetDevice", e);
  for (cudaStream_t* s : {&to_pool_, &from_pool_, &compute_}) {
    if ((e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking)) != cudaSuccess) {
      return Failed("cudaStreamCreate", e);
    }
  }
  events_.resize(kEvents);
  for (cudaEvent_t& ev : events_) {
    if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
      return Failed("cudaEventCreate", e);
    }
  }
  for (cudaEvent_t* ev : {&start_, &end_[0], &end_[1], &end_[2]}) {
    if ((e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming)) != cudaSuccess) {
      return Failed("cudaEventCreate", e);
    }
  }
  for (cudaEvent_t& ev : mark_events_) {
    if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
      return Failed("cudaEventCreate", e);
    }
  }
  // The word asynchronous calls' streams wait on: page-locked, mapped.
  void* word = nullptr;
  if ((e = cudaHostAlloc(&word, sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable)) !=
      cudaSuccess) {
    return Failed("cudaHostAlloc", e);
  }
  done_host_ = static_cast<uint64_t*>(word);
  *done_host_ = 0;
  void* gpu = nullptr;
  if ((e = cudaHostGetDevicePointer(&gpu, word, 0)) != cudaSuccess) {
    return Failed("cudaHostGetDevicePointer", e);
  }
  done_gpu_ = static_cast<uint64_t*>(gpu);
  wait_value_ = StreamWaitValue64();
  return absl::OkStatus();
}

DmaEngine::Ticket CudaDmaEngine::Record(cudaStream_t s) {
  const Ticket t = ++next_;
  cudaEvent_t ev = events_[t % kEvents];
  if (t > kEvents) Check(cudaEventSynchronize(ev), "an earlier copy");  // reuse
  Check(cudaEventRecord(ev, s), "cudaEventRecord");
  return t;
}

void CudaDmaEngine::Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  SetError(Failed(what, e));
}

}  // namespace cuda

absl::StatusOr<std::unique_ptr<DmaEngine>> MakeDmaEngine(runtime::Coherence& c, uint8_t* base,
                                                         uint64_t size) {
  if (!GpuAvailable()) return cuda::NoGpu();
  auto e = cuda::CudaDmaEngine::Make(c, base, size);
  if (!e.ok()) return e.status();
  return std::unique_ptr<DmaEngine>(*std::move(e));
}

}  // namespace cxlrt::gpu
