// The CUDA implementation of cxlrt/collectives/gpu_engine.h: the gpu/
// layer's DMA engine (cxlrt/gpu/cuda/dma_engine.h) plus reduction and copy
// kernels and post lines written by the copy engine. Every operation is
// queued on the DMA engine's streams and takes its ticket from it.
// docs/gpu.md explains the choices (staging, regions, line images).
#include "cxlrt/collectives/gpu_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/cuda/cuda_knobs.h"
#include "cxlrt/collectives/cuda/reduce_kernels.h"
#include "cxlrt/gpu/cuda/dma_engine.h"
#include "cxlrt/gpu/cuda/kernels.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"

namespace cxlrt::collectives {
namespace {

using gpu::cuda::CudaDmaEngine;
using gpu::cuda::Failed;

class CudaCopyEngine final : public GpuCopyEngine {
 public:
  static absl::StatusOr<std::unique_ptr<GpuCopyEngine>> Make(runtime::Coherence& c, uint8_t* base,
                                                             uint64_t size) {
    auto dma = CudaDmaEngine::Make(c, base, size);
    if (!dma.ok()) return dma.status();
    auto e = std::unique_ptr<CudaCopyEngine>(new CudaCopyEngine(*std::move(dma)));
    if (absl::Status s = e->Init(); !s.ok()) return s;
    return std::unique_ptr<GpuCopyEngine>(std::move(e));
  }

  ~CudaCopyEngine() override {
    // The streams are idle before what they use goes; the DMA engine then
    // destroys them.
    dma_->SynchronizeStreams();
    for (Region& r : regions_) {
      if (r.p) (void)cudaFree(r.p);
      if (r.copied) (void)cudaEventDestroy(r.copied);
      if (r.read) (void)cudaEventDestroy(r.read);
    }
    if (line_images_) (void)cudaFreeHost(line_images_);
    (void)cudaGetLastError();
  }

  const char* name() const override { return staged_reduce_ ? "cuda (staged)" : "cuda"; }
  bool host_buffers() const override { return false; }
  bool publishes_posts() const override { return copy_doorbells_; }

  // The line's image goes to a page-locked slot of a ring (kept until post
  // seq + kLineImages, past any transport's depth), and the copy engine
  // writes it into the pool behind the post's copies: the rest of the line,
  // then the flag, both on the GPU -> pool stream, after the events of
  // `after`.
  Ticket PublishLine(runtime::PoolOffset line, const uint8_t* image, size_t n, const Ticket* after,
                     size_t n_after) override {
    cudaStream_t to_pool = dma_->to_pool_stream();
    if (n < 8 || n > kLineImageBytes) {
      dma_->SetError(absl::InternalError(absl::StrCat("a post line of ", n, " bytes")));
      return dma_->Record(to_pool);
    }
    uint64_t seq;
    std::memcpy(&seq, image, 8);
    uint8_t* img = line_images_ + (seq % kLineImages) * kLineImageBytes;
    std::memcpy(img, image, n);
    for (size_t i = 0; i < n_after; ++i) {
      const Ticket t = after[i];
      if (t != 0 && !dma_->EventReused(t)) {  // a reused one's ticket completed long ago
        dma_->Check(cudaStreamWaitEvent(to_pool, dma_->EventOf(t), 0), "stream wait");
      }
    }
    uint8_t* const base = dma_->base();
    dma_->coherence().BeforeGpuWrite(line, n);
    dma_->Check(cudaMemcpyAsync(base + line + 8, img + 8, n - 8, cudaMemcpyDefault, to_pool),
                "post line copy");
    dma_->Check(cudaMemcpyAsync(base + line, img, 8, cudaMemcpyDefault, to_pool), "flag copy");
    return dma_->Record(to_pool);
  }

  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    return dma_->ToPool(dst, src, n);
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    return dma_->FromPool(dst, pool_src, n);
  }
  // A kernel, not cudaMemcpyAsync: a copy within GPU memory is one of
  // CUDA's implicit synchronisation points, which an asynchronous call
  // must not meet (see TakeRegion).
  Ticket Copy(void* dst, const void* src, size_t n) override {
    if (n == 0) return 0;
    cudaStream_t compute = dma_->compute_stream();
    dma_->Check(gpu::cuda::LaunchCopy(const_cast<void*>(dma_->GpuAddress(dst)),
                                      dma_->GpuAddress(src), n, compute),
                "copy kernel");
    return dma_->Record(compute);
  }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    if (count == 0) return 0;
    cudaStream_t compute = dma_->compute_stream();
    cudaStream_t from_pool = dma_->from_pool_stream();
    if (n > cuda::kMaxReduceSources) {  // a communicator has at most that many ranks
      dma_->SetError(absl::InternalError(absl::StrCat(
          "a device reduction of ", n, " sources: more than ", cuda::kMaxReduceSources, " ranks")));
      return dma_->Record(compute);
    }
    const gpu::PoolRegistration& reg = dma_->registration();
    cuda::ReduceArgs a{};
    const size_t bytes = count * SizeOf(t);
    // Which sources go through GPU staging: pool sources when reductions
    // are staged (CXLRT_CUDA_REDUCE), and any source the GPU cannot read at
    // all (a peer's tiny post, which the transport hands out from its own
    // copy of the post line). The others are read where they are: GPU
    // memory, or the pool through its mapping.
    bool stage[cuda::kMaxReduceSources] = {};
    int staged = 0;
    for (int i = 0; i < n; ++i) {
      if (reg.Contains(srcs[i], bytes)) {
        stage[i] = staged_reduce_;
        a.srcs[i] = reg.GpuAddress(srcs[i]);
      } else {
        stage[i] = gpu::KindOf(srcs[i]) != runtime::MemoryKind::kGpu;
        a.srcs[i] = srcs[i];
      }
      staged += stage[i];
    }
    Region* region = nullptr;
    if (staged > 0) {
      region = TakeRegion(staged * bytes);
      if (region == nullptr) return dma_->Record(compute);
      uint8_t* at = region->p;
      for (int i = 0; i < n; ++i) {
        if (!stage[i]) continue;
        dma_->Check(cudaMemcpyAsync(at, srcs[i], bytes, cudaMemcpyDefault, from_pool),
                    "staging copy");
        a.srcs[i] = at;
        at += bytes;
      }
      dma_->Check(cudaEventRecord(region->copied, from_pool), "cudaEventRecord");
      dma_->Check(cudaStreamWaitEvent(compute, region->copied, 0), "stream wait");
    }
    a.n = n;
    a.out = const_cast<void*>(dma_->GpuAddress(out));
    a.count = count;
    a.divisor = avg_divisor;
    dma_->Check(cuda::LaunchReduce(t, op, a, compute), "reduction kernel");
    if (region) dma_->Check(cudaEventRecord(region->read, compute), "cudaEventRecord");
    return dma_->Record(compute);
  }

  bool Poll(Ticket t) override { return dma_->Poll(t); }
  absl::Status failure() const override { return dma_->failure(); }
  absl::Status Wait(Ticket t, absl::Time deadline) override { return dma_->Wait(t, deadline); }
  absl::Status Drain(absl::Time deadline) override { return dma_->Drain(deadline); }

  absl::Status StartAfter(void* stream) override { return dma_->StartAfter(stream); }
  absl::Status FinishBefore(void* stream) override { return dma_->FinishBefore(stream); }
  absl::StatusOr<uint64_t> Mark(void* stream) override { return dma_->Mark(stream); }
  absl::Status StartAfterMark(uint64_t mark) override { return dma_->StartAfterMark(mark); }
  absl::Status WaitDoneOn(void* stream, uint64_t seq) override {
    return dma_->WaitDoneOn(stream, seq);
  }
  void SetDone(uint64_t seq) override { dma_->SetDone(seq); }

 private:
  explicit CudaCopyEngine(std::unique_ptr<CudaDmaEngine> dma) : dma_(std::move(dma)) {}

  absl::Status Init() {
    cudaError_t e;
    for (Region& r : regions_) {
      for (cudaEvent_t* ev : {&r.copied, &r.read}) {
        if ((e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming)) != cudaSuccess) {
          return Failed("cudaEventCreate", e);
        }
      }
    }
    if (copy_doorbells_) {
      void* images = nullptr;
      if ((e = cudaHostAlloc(&images, kLineImages * kLineImageBytes, cudaHostAllocPortable)) !=
          cudaSuccess) {
        return Failed("cudaHostAlloc", e);
      }
      line_images_ = static_cast<uint8_t*>(images);
    }
    return absl::OkStatus();
  }

  // GPU staging for reduction sources: a ring of regions, each reused
  // only after the kernel that read it last has run (`read`), and read by a
  // kernel only after its copies landed (`copied`). Grown when a call needs
  // more (after the region's last reader is done).
  struct Region {
    uint8_t* p = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr, read = nullptr;
    bool used = false;
  };
  static constexpr int kRegions = 4;

  //
  // Regions come from the stream-ordered allocator (cudaMallocAsync and
  // cudaFreeAsync): cudaMalloc and cudaFree are implicit synchronisation
  // points that wait for work already queued on other streams. In
  // asynchronous mode that work includes a caller's stream waiting for
  // this very call to finish, so they would deadlock.
  Region* TakeRegion(size_t bytes) {
    cudaStream_t from_pool = dma_->from_pool_stream();
    Region& r = regions_[next_region_++ % kRegions];
    if (r.used) dma_->Check(cudaStreamWaitEvent(from_pool, r.read, 0), "stream wait");
    if (r.bytes < bytes) {
      // The old region goes once its last reader (a kernel) has run.
      if (r.p) dma_->Check(cudaFreeAsync(r.p, dma_->compute_stream()), "cudaFreeAsync");
      r.p = nullptr;
      r.bytes = 0;
      void* p = nullptr;
      const size_t want = std::max<size_t>(bytes, 1 << 20);
      dma_->Check(cudaMallocAsync(&p, want, from_pool), "staging buffer (cudaMallocAsync)");
      if (!dma_->failure().ok()) return nullptr;
      r.p = static_cast<uint8_t*>(p);
      r.bytes = want;
    }
    r.used = true;
    return dma_->failure().ok() ? &r : nullptr;
  }

  std::unique_ptr<CudaDmaEngine> dma_;
  Region regions_[kRegions];
  uint64_t next_region_ = 0;
  const bool staged_reduce_ = kCudaReduce.Get() == "staged";
  // CXLRT_CUDA_DOORBELL=copy: post lines written by the copy engine, from
  // a page-locked ring of their images.
  const bool copy_doorbells_ = kCudaDoorbell.Get() == "copy";
  static constexpr size_t kLineImages = 64, kLineImageBytes = 128;
  uint8_t* line_images_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCopyEngine>> MakeGpuCopyEngine(runtime::Coherence& c,
                                                                 uint8_t* base, uint64_t size) {
  if (!gpu::GpuAvailable()) return gpu::cuda::NoGpu();
  return CudaCopyEngine::Make(c, base, size);
}

}  // namespace cxlrt::collectives
