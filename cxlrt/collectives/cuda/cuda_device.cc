// The CUDA implementation of cxlrt/collectives/device.h: device detection, the
// pool's registration with the CUDA runtime, and the CUDA copy engine.
// docs/gpu.md explains the choices (flags, pieces, streams, events).
#include <cuda_runtime.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cxlrt/collectives/cuda/cuda_knobs.h"
#include "cxlrt/collectives/cuda/driver.h"
#include "cxlrt/collectives/cuda/kernels.h"
#include "cxlrt/collectives/device.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::collectives {
namespace {

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

using cuda::Failed;

struct Availability {
  bool available = false;
  std::string reason;
};

const Availability& Probe() {
  static const Availability a = [] {
    Availability r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? absl::StrCat("no CUDA driver or device: ", CudaError(e))
                     : absl::StrCat("CUDA cannot start: ", CudaError(e));
    } else if (n == 0) {
      r.reason = "no CUDA device";
    } else {
      r.available = true;
    }
    return r;
  }();
  return a;
}

// --- The pool's registration ---

// A mapping registered with the CUDA runtime: pinned, mapped into every
// device's address space (portable), addressable by kernels through
// DeviceAddress. One per mapping per process, shared (Get).
class Registration {
 public:
  // Pieces of at most this size: single registrations of 512 GiB or more
  // fail on r580 drivers.
  static constexpr uint64_t kPieceBytes = uint64_t{256} << 30;

  static absl::StatusOr<std::shared_ptr<Registration>> Get(uint8_t* base, uint64_t size) {
    static std::mutex mu;
    static std::map<uint8_t*, std::weak_ptr<Registration>>* live =
        new std::map<uint8_t*, std::weak_ptr<Registration>>();
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = live->find(base); it != live->end()) {
      if (auto r = it->second.lock(); r && r->size_ == size) return r;
    }
    auto r = std::shared_ptr<Registration>(new Registration(base, size));
    if (absl::Status s = r->Register(); !s.ok()) return s;
    (*live)[base] = r;
    return r;
  }

  ~Registration() {
    for (const Piece& p : pieces_) {
      if (p.ours) (void)cudaHostUnregister(p.host);
    }
    (void)cudaGetLastError();
  }

  bool Contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && b <= base_ + size_ && n <= static_cast<uint64_t>(base_ + size_ - b);
  }
  // The address kernels use for host address p of the mapping.
  const void* DeviceAddress(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    for (const Piece& q : pieces_) {
      if (b >= q.host && b < q.host + q.len) return q.dev + (b - q.host);
    }
    return p;
  }
  absl::Duration took() const { return took_; }

 private:
  struct Piece {
    uint8_t* host;
    uint64_t len;
    uint8_t* dev;
    bool ours;  // registered by us (else by someone else in this process)
  };
  Registration(uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  absl::Status Register() {
    const absl::Time start = absl::Now();
    for (uint64_t at = 0; at < size_; at += kPieceBytes) {
      Piece p{base_ + at, std::min(kPieceBytes, size_ - at), nullptr, true};
      cudaError_t e =
          cudaHostRegister(p.host, p.len, cudaHostRegisterPortable | cudaHostRegisterMapped);
      if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        p.ours = false;
      } else if (e != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it, or it surfaces later as another error
        return absl::FailedPreconditionError(absl::StrFormat(
            "the pool mapping (%d bytes at %p, piece at +%d of %d bytes) cannot be registered "
            "with CUDA: %s (a pool on fsdax or a remap_pfn_range mapping cannot be pinned; use "
            "devdax or an emulated pool)",
            size_, static_cast<void*>(base_), at, p.len, CudaError(e)));
      }
      void* dev = nullptr;
      e = cudaHostGetDevicePointer(&dev, p.host, 0);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (p.ours) (void)cudaHostUnregister(p.host);
        return absl::FailedPreconditionError(
            absl::StrCat("the registered pool has no device address: ", CudaError(e)));
      }
      p.dev = static_cast<uint8_t*>(dev);
      pieces_.push_back(p);
    }
    took_ = absl::Now() - start;
    return absl::OkStatus();
  }

  uint8_t* const base_;
  const uint64_t size_;
  std::vector<Piece> pieces_;
  absl::Duration took_;
};

// --- The engine ---

class CudaEngine final : public DeviceEngine {
 public:
  // Events in flight at most; an older ticket's event is waited for before
  // it is reused (in practice tickets are long complete by then).
  static constexpr size_t kEvents = 512;

  static absl::StatusOr<std::unique_ptr<DeviceEngine>> Make(runtime::Coherence& c, uint8_t* base,
                                                            std::shared_ptr<Registration> reg) {
    auto e = std::unique_ptr<CudaEngine>(new CudaEngine(c, base, std::move(reg)));
    if (absl::Status s = e->Init(); !s.ok()) return s;
    return std::unique_ptr<DeviceEngine>(std::move(e));
  }

  ~CudaEngine() override {
    (void)cudaSetDevice(device_);
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      if (s) (void)cudaStreamSynchronize(s);
    }
    for (Region& r : regions_) {
      if (r.p) (void)cudaFree(r.p);
      if (r.copied) (void)cudaEventDestroy(r.copied);
      if (r.read) (void)cudaEventDestroy(r.read);
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (line_images_) (void)cudaFreeHost(line_images_);
    for (cudaEvent_t e : mark_events_) {
      if (e) (void)cudaEventDestroy(e);
    }
    // done_host_ stays: a caller's stream may still be polling it (its wait
    // ends once it reads the last SetDone, which can be after we return).
    // Eight pinned bytes per engine, for the process's life.
    for (cudaEvent_t e : {start_, end_[0], end_[1], end_[2]}) {
      if (e) (void)cudaEventDestroy(e);
    }
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      if (s) (void)cudaStreamDestroy(s);
    }
    (void)cudaGetLastError();
  }

  const char* name() const override { return staged_reduce_ ? "cuda (staged)" : "cuda"; }
  bool host_buffers() const override { return false; }
  bool publishes_posts() const override { return copy_doorbells_; }

  // The line's image goes to a pinned slot of a ring (kept until post seq +
  // kLineImages, past any transport's depth), and the copy engine writes it
  // into the pool behind the post's copies: the rest of the line, then the
  // flag, both on the device -> pool stream, after the events of `after`.
  Ticket PublishLine(runtime::PoolOffset line, const uint8_t* image, size_t n, const Ticket* after,
                     size_t n_after) override {
    if (n < 8 || n > kLineImageBytes) {
      SetError(absl::InternalError(absl::StrCat("a post line of ", n, " bytes")));
      return Record(to_pool_);
    }
    uint64_t seq;
    std::memcpy(&seq, image, 8);
    uint8_t* img = line_images_ + (seq % kLineImages) * kLineImageBytes;
    std::memcpy(img, image, n);
    for (size_t i = 0; i < n_after; ++i) {
      const Ticket t = after[i];
      if (t != 0 && !EventReused(t)) {  // a reused one's ticket completed long ago
        Check(cudaStreamWaitEvent(to_pool_, events_[t % kEvents], 0), "stream wait");
      }
    }
    c_.BeforeDeviceWrite(line, n);
    Check(cudaMemcpyAsync(base_ + line + 8, img + 8, n - 8, cudaMemcpyDefault, to_pool_),
          "post line copy");
    Check(cudaMemcpyAsync(base_ + line, img, 8, cudaMemcpyDefault, to_pool_), "flag copy");
    return Record(to_pool_);
  }

  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    if (n == 0) return 0;
    // The simulated domain must not keep lines over which the DMA lands.
    c_.BeforeDeviceWrite(dst, n);
    Check(cudaMemcpyAsync(base_ + dst, src, n, cudaMemcpyDefault, to_pool_), "copy to the pool");
    return Record(to_pool_);
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    if (n == 0) return 0;
    Check(cudaMemcpyAsync(dst, pool_src, n, cudaMemcpyDefault, from_pool_), "copy from the pool");
    return Record(from_pool_);
  }
  // A kernel, not cudaMemcpyAsync: a copy within device memory is one of
  // CUDA's implicit synchronisation points, which an asynchronous call
  // must not meet (see TakeRegion).
  Ticket Copy(void* dst, const void* src, size_t n) override {
    if (n == 0) return 0;
    Check(cuda::LaunchCopy(const_cast<void*>(Device(dst)), Device(src), n, compute_),
          "copy kernel");
    return Record(compute_);
  }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    if (count == 0) return 0;
    if (n > cuda::kMaxReduceSources) {  // a communicator has at most that many ranks
      SetError(absl::InternalError(absl::StrCat("a device reduction of ", n, " sources: more than ",
                                                cuda::kMaxReduceSources, " ranks")));
      return Record(compute_);
    }
    cuda::ReduceArgs a{};
    const size_t bytes = count * SizeOf(t);
    // Which sources go through device staging: pool sources when reductions
    // are staged (CXLRT_CUDA_REDUCE), and any source the GPU cannot read at
    // all (a peer's tiny post, which the transport hands out from its own
    // copy of the post line). The others are read where they are: device
    // memory, or the pool through its mapping.
    bool stage[cuda::kMaxReduceSources] = {};
    int staged = 0;
    for (int i = 0; i < n; ++i) {
      if (reg_->Contains(srcs[i], bytes)) {
        stage[i] = staged_reduce_;
        a.srcs[i] = reg_->DeviceAddress(srcs[i]);
      } else {
        stage[i] = KindOf(srcs[i]) != MemoryKind::kDevice;
        a.srcs[i] = srcs[i];
      }
      staged += stage[i];
    }
    Region* region = nullptr;
    if (staged > 0) {
      region = TakeRegion(staged * bytes);
      if (region == nullptr) return Record(compute_);
      uint8_t* at = region->p;
      for (int i = 0; i < n; ++i) {
        if (!stage[i]) continue;
        Check(cudaMemcpyAsync(at, srcs[i], bytes, cudaMemcpyDefault, from_pool_), "staging copy");
        a.srcs[i] = at;
        at += bytes;
      }
      Check(cudaEventRecord(region->copied, from_pool_), "cudaEventRecord");
      Check(cudaStreamWaitEvent(compute_, region->copied, 0), "stream wait");
    }
    a.n = n;
    a.out = const_cast<void*>(Device(out));
    a.count = count;
    a.divisor = avg_divisor;
    Check(cuda::LaunchReduce(t, op, a, compute_), "reduction kernel");
    if (region) Check(cudaEventRecord(region->read, compute_), "cudaEventRecord");
    return Record(compute_);
  }

  Ticket CopyBatch(bool to_pool, void* const* dsts, const void* const* srcs, const size_t* sizes,
                   size_t count) override {
    if (count == 0) return 0;
    cudaStream_t s = to_pool ? to_pool_ : from_pool_;
    if (to_pool) {
      for (size_t i = 0; i < count; ++i) {
        c_.BeforeDeviceWrite(static_cast<uint8_t*>(dsts[i]) - base_, sizes[i]);
      }
    }
    bool small = true;  // a gather kernel item's size is 32 bits
    for (size_t i = 0; i < count; ++i) small = small && sizes[i] <= UINT32_MAX;
    if (kernel_batches_ && small) {
      // SM copies through the mapped pool, a launch per 512 items.
      cuda::GatherArgs a{};
      for (size_t i = 0; i < count; ++i) {
        a.dst[a.count] = const_cast<void*>(Device(dsts[i]));
        a.src[a.count] = Device(srcs[i]);
        a.size[a.count] = static_cast<uint32_t>(sizes[i]);
        if (++a.count == cuda::kMaxGatherItems || i + 1 == count) {
          Check(cuda::LaunchGather(a, s), "gather kernel");
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

  bool Poll(Ticket t) override {
    if (t == 0) return true;
    if (!error_.ok()) return false;   // Wait reports it
    if (EventReused(t)) return true;  // waited for before its event was reused
    const cudaError_t e = cudaEventQuery(events_[t % kEvents]);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) Check(e, "a copy or kernel");
    return false;
  }

  absl::Status failure() const override { return error_; }

  absl::Status Wait(Ticket t, absl::Time deadline) override {
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
  absl::Status Drain(absl::Time deadline) override {
    (void)cudaSetDevice(device_);
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

  absl::Status StartAfter(void* stream) override {
    Check(cudaSetDevice(device_), "cudaSetDevice");
    Check(cudaEventRecord(start_, static_cast<cudaStream_t>(stream)),
          "event on the caller's stream");
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      Check(cudaStreamWaitEvent(s, start_, 0), "stream wait");
    }
    return error_;
  }

  absl::Status FinishBefore(void* stream) override {
    int i = 0;
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      Check(cudaEventRecord(end_[i], s), "event on an engine stream");
      Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), end_[i], 0),
            "caller's stream wait");
      ++i;
    }
    return error_;
  }

  absl::StatusOr<uint64_t> Mark(void* stream) override {
    std::lock_guard<std::mutex> lock(mark_mu_);
    const uint64_t m = ++marks_;
    // The proxy has not yet used the mark this one replaces: the caller
    // is kMarks calls ahead of it; wait for it to catch up.
    while (m - marks_used_.load(std::memory_order_acquire) >= kMarks) sched_yield();
    if (cudaError_t e =
            cudaEventRecord(mark_events_[m % kMarks], static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      (void)cudaGetLastError();
      return Failed("event on the caller's stream", e);
    }
    return m;
  }

  absl::Status StartAfterMark(uint64_t mark) override {
    Check(cudaSetDevice(device_), "cudaSetDevice");
    for (cudaStream_t s : {to_pool_, from_pool_, compute_}) {
      Check(cudaStreamWaitEvent(s, mark_events_[mark % kMarks], 0), "stream wait");
    }
    marks_used_.store(mark, std::memory_order_release);
    return error_;
  }

  absl::Status WaitDoneOn(void* stream, uint64_t seq) override {
    auto s = static_cast<cudaStream_t>(stream);
    if (wait_value_ != nullptr) {
      if (wait_value_(s, reinterpret_cast<uint64_t>(done_dev_), seq, cuda::kWaitValueGeq) == 0) {
        return absl::OkStatus();
      }
      CXLRT_LOG(kWarning) << "cuStreamWaitValue64 refused: streams wait on a polling kernel";
      wait_value_ = nullptr;
    }
    if (cudaError_t e = cuda::LaunchWaitWord(done_dev_, seq, s); e != cudaSuccess) {
      (void)cudaGetLastError();
      return Failed("the stream's wait kernel", e);
    }
    return absl::OkStatus();
  }

  void SetDone(uint64_t seq) override {
    std::atomic_ref<uint64_t>(*done_host_).store(seq, std::memory_order_release);
  }

 private:
  CudaEngine(runtime::Coherence& c, uint8_t* base, std::shared_ptr<Registration> reg)
      : c_(c), base_(base), reg_(std::move(reg)) {}

  absl::Status Init() {
    cudaError_t e = cudaGetDevice(&device_);
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
    for (Region& r : regions_) {
      for (cudaEvent_t* ev : {&r.copied, &r.read}) {
        if ((e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming)) != cudaSuccess) {
          return Failed("cudaEventCreate", e);
        }
      }
    }
    for (cudaEvent_t& ev : mark_events_) {
      if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
        return Failed("cudaEventCreate", e);
      }
    }
    // The word asynchronous calls' streams wait on: pinned, mapped.
    void* word = nullptr;
    if ((e = cudaHostAlloc(&word, sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable)) !=
        cudaSuccess) {
      return Failed("cudaHostAlloc", e);
    }
    done_host_ = static_cast<uint64_t*>(word);
    *done_host_ = 0;
    void* dev = nullptr;
    if ((e = cudaHostGetDevicePointer(&dev, word, 0)) != cudaSuccess) {
      return Failed("cudaHostGetDevicePointer", e);
    }
    done_dev_ = static_cast<uint64_t*>(dev);
    wait_value_ = cuda::StreamWaitValue64();
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

  // Device staging for reduction sources: a ring of regions, each reused
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
    Region& r = regions_[next_region_++ % kRegions];
    if (r.used) Check(cudaStreamWaitEvent(from_pool_, r.read, 0), "stream wait");
    if (r.bytes < bytes) {
      // The old region goes once its last reader (a kernel) has run.
      if (r.p) Check(cudaFreeAsync(r.p, compute_), "cudaFreeAsync");
      r.p = nullptr;
      r.bytes = 0;
      void* p = nullptr;
      const size_t want = std::max<size_t>(bytes, 1 << 20);
      Check(cudaMallocAsync(&p, want, from_pool_), "staging buffer (cudaMallocAsync)");
      if (!error_.ok()) return nullptr;
      r.p = static_cast<uint8_t*>(p);
      r.bytes = want;
    }
    r.used = true;
    return error_.ok() ? &r : nullptr;
  }

  const void* Device(const void* p) const {
    return reg_->Contains(p, 1) ? reg_->DeviceAddress(p) : p;
  }

  Ticket Record(cudaStream_t s) {
    const Ticket t = ++next_;
    cudaEvent_t ev = events_[t % kEvents];
    if (t > kEvents) Check(cudaEventSynchronize(ev), "an earlier copy");  // reuse
    Check(cudaEventRecord(ev, s), "cudaEventRecord");
    return t;
  }

  void Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    SetError(Failed(what, e));
  }
  void SetError(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
  }

  runtime::Coherence& c_;
  uint8_t* const base_;
  std::shared_ptr<Registration> reg_;
  int device_ = 0;
  cudaStream_t to_pool_ = nullptr, from_pool_ = nullptr, compute_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t start_ = nullptr, end_[3] = {};
  Ticket next_ = 0;
  Region regions_[kRegions];
  uint64_t next_region_ = 0;
  const bool staged_reduce_ = kCudaReduce.Get() == "staged";
  bool batch_api_ = true;  // cudaMemcpyBatchAsync works here
  // CXLRT_CUDA_KV_COPY=kernel: KV batches copied by SMs through the mapped
  // pool instead of the copy engine (docs/gpu.md).
  const bool kernel_batches_ = kCudaKvCopy.Get() == "kernel";
  // Asynchronous calls: marks on callers' streams, and the done word.
  static constexpr uint64_t kMarks = 256;
  std::mutex mark_mu_;
  uint64_t marks_ = 0;                   // guarded by mark_mu_
  std::atomic<uint64_t> marks_used_{0};  // by the proxy
  cudaEvent_t mark_events_[kMarks] = {};
  uint64_t* done_host_ = nullptr;               // pinned; the proxy stores, streams wait
  uint64_t* done_dev_ = nullptr;                // its device address
  cuda::StreamValue64Fn wait_value_ = nullptr;  // cuStreamWaitValue64, when the driver has it
  // Ticket t's event now serves a later ticket (t completed before that).
  bool EventReused(Ticket t) const { return t + kEvents <= next_; }
  // CXLRT_CUDA_DOORBELL=copy: post lines written by the copy engine, from
  // a pinned ring of their images.
  const bool copy_doorbells_ = kCudaDoorbell.Get() == "copy";
  static constexpr size_t kLineImages = 64, kLineImageBytes = 128;
  uint8_t* line_images_ = nullptr;
  absl::Status error_;  // the first error: the engine is unusable after it
};

absl::Status NoDevice() { return absl::UnavailableError(absl::StrCat("no GPU: ", Probe().reason)); }

cuda::StreamValue64Fn DriverCall(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const bool found =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess;
  (void)cudaGetLastError();
  return found ? reinterpret_cast<cuda::StreamValue64Fn>(fn) : nullptr;
}

}  // namespace

namespace cuda {

absl::Status Failed(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": ", CudaError(e)));
}

StreamValue64Fn StreamWaitValue64() {
  static const StreamValue64Fn fn = DriverCall("cuStreamWaitValue64");
  return fn;
}

StreamValue64Fn StreamWriteValue64() {
  static const StreamValue64Fn fn = DriverCall("cuStreamWriteValue64");
  return fn;
}

}  // namespace cuda

bool DevicesAvailable() { return Probe().available; }
std::string DevicesUnavailableReason() { return Probe().reason; }

MemoryKind KindOf(const void* p) {
  if (p == nullptr || !DevicesAvailable()) return MemoryKind::kHost;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return MemoryKind::kHost;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? MemoryKind::kDevice
                                                                           : MemoryKind::kHost;
}

absl::StatusOr<std::unique_ptr<DeviceEngine>> MakeDeviceEngine(runtime::Coherence& c, uint8_t* base,
                                                               uint64_t size) {
  if (!DevicesAvailable()) return NoDevice();
  auto reg = Registration::Get(base, size);
  if (!reg.ok()) return reg.status();
  return CudaEngine::Make(c, base, *std::move(reg));
}

std::string DescribeDevices(uint8_t* base, uint64_t bytes) {
  if (!DevicesAvailable()) return absl::StrCat("no device: ", DevicesUnavailableReason());
  std::string out;
  int driver = 0, runtime = 0, n = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetDeviceCount(&n);
  absl::StrAppendFormat(&out, "CUDA driver %d.%d, runtime %d.%d, %d device(s)\n", driver / 1000,
                        driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, n);
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    const std::string bus =
        absl::StrFormat("%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    std::string node = "?";
    std::ifstream f("/sys/bus/pci/devices/" + bus + "/numa_node");
    if (f) std::getline(f, node);
    absl::StrAppendFormat(&out,
                          "  device %d: %s, sm_%d%d, %.1f GiB, PCI %s, NUMA node %s (-1: none "
                          "reported)\n",
                          d, p.name, p.major, p.minor, p.totalGlobalMem / double(1 << 30), bus,
                          node);
  }
  if (base != nullptr && bytes > 0) {
    auto reg = Registration::Get(base, bytes);
    if (reg.ok()) {
      absl::StrAppendFormat(&out, "  pool registration: OK, %d MiB in %.1f ms\n", bytes >> 20,
                            absl::ToDoubleMilliseconds((*reg)->took()));
    } else {
      absl::StrAppend(&out, "  pool registration: FAILED: ", reg.status().message(), "\n");
    }
  }
  (void)cudaGetLastError();
  return out;
}

absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  if (!DevicesAvailable()) return NoDevice();
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes: ", CudaError(e)));
  }
  return p;
}
void DeviceFree(void* p) {
  if (p) (void)cudaFree(p);
}

absl::StatusOr<void*> PinnedAlloc(size_t bytes) {
  if (!DevicesAvailable()) return NoDevice();
  void* p = nullptr;
  if (cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMallocHost of ", bytes, " bytes: ", CudaError(e)));
  }
  return p;
}
void PinnedFree(void* p) {
  if (p) (void)cudaFreeHost(p);
}

absl::Status DeviceCopy(void* dst, const void* src, size_t n) {
  if (!DevicesAvailable()) return NoDevice();
  if (cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Failed("cudaMemcpy", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> StreamCreate() {
  if (!DevicesAvailable()) return NoDevice();
  cudaStream_t s = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
    return Failed("cudaStreamCreate", e);
  }
  return static_cast<void*>(s);
}
void StreamDestroy(void* stream) {
  if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
absl::Status StreamSynchronize(void* stream) {
  if (!DevicesAvailable()) return NoDevice();
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return Failed("cudaStreamSynchronize", e);
  }
  return absl::OkStatus();
}

absl::Status CopyAsync(void* dst, const void* src, size_t n, void* stream) {
  if (!DevicesAvailable()) return NoDevice();
  if (cudaError_t e =
          cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    return Failed("cudaMemcpyAsync", e);
  }
  return absl::OkStatus();
}

absl::Status FillPatternAsync(void* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              void* stream) {
  if (!DevicesAvailable()) return NoDevice();
  if (cudaError_t e = cuda::LaunchFillPattern(static_cast<uint32_t*>(p), n_words, seed, delay_us,
                                              static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    return Failed("fill kernel", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> TimeCopies(void* dst, const void* src, size_t n, int iters,
                                  void* reverse_dst, const void* reverse_src) {
  if (!DevicesAvailable()) return NoDevice();
  const bool both = reverse_dst != nullptr && reverse_src != nullptr;
  cudaStream_t s[2] = {};
  cudaEvent_t start[2] = {}, stop[2] = {};
  auto cleanup = [&] {
    for (int i = 0; i < 2; ++i) {
      if (s[i]) (void)cudaStreamDestroy(s[i]);
      if (start[i]) (void)cudaEventDestroy(start[i]);
      if (stop[i]) (void)cudaEventDestroy(stop[i]);
    }
  };
  std::vector<double> times;
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
    if ((e = cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking)) != cudaSuccess) break;
    if ((e = cudaEventCreate(&start[i])) != cudaSuccess) break;
    e = cudaEventCreate(&stop[i]);
  }
  for (int it = -1; it < iters && e == cudaSuccess; ++it) {  // it -1: warm-up
    for (int i = 0; i < (both ? 2 : 1) && e == cudaSuccess; ++i) {
      e = cudaEventRecord(start[i], s[i]);
      if (e == cudaSuccess) {
        e = i == 0 ? cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s[0])
                   : cudaMemcpyAsync(reverse_dst, reverse_src, n, cudaMemcpyDefault, s[1]);
      }
      if (e == cudaSuccess) e = cudaEventRecord(stop[i], s[i]);
    }
    float ms[2] = {0, 0};
    for (int i = 0; i < (both ? 2 : 1) && e == cudaSuccess; ++i) {
      e = cudaEventSynchronize(stop[i]);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms[i], start[i], stop[i]);
    }
    if (it >= 0) times.push_back(std::max(ms[0], ms[1]) / 1e3);
  }
  cleanup();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Failed("timing copies", e);
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

}  // namespace cxlrt::collectives
