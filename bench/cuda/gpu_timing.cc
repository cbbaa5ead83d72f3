// bench/gpu_timing.h with CUDA: copies timed by GPU events, and the four
// ways of ringing and hearing a doorbell in the pool, timed as a ping-pong
// between two streams of one process. docs/gpu.md, "Doorbells", reads the
// results.
//
// One process plays both sides so that the GPU-only modes (kernel, memop)
// can be enqueued whole before they run; the bytes and flags still go
// through the registered pool as between hosts. Side A's stream is `a`,
// side B's is `b`; flag_a is A's doorbell (B listens), flag_b is B's.
#include "bench/gpu_timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/gpu/cuda/driver.h"
#include "cxlrt/gpu/cuda/kernels.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::bench {
namespace {

namespace cuda = gpu::cuda;

// Word i of pattern `seed`: the two patterns a ping-pong's rounds alternate.
uint32_t PatternWord(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32 | seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x >> 32);
}

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();  // not to surface again in a later call
  return cuda::Failed(what, e);
}

absl::Status CheckDriver(int rc, const char* what) {
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUresult ", rc));
}

constexpr absl::Duration kHearWithin = absl::Seconds(10);

// Everything one TimePingPong call owns, released in reverse order.
struct PingPong {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t done_a = nullptr, done_b = nullptr;
  void* src[2] = {};               // A's two patterns (rounds alternate)
  void* got = nullptr;             // A's receive buffer
  void* relay = nullptr;           // B's device buffer
  uint64_t* values = nullptr;      // device memory, values[i] == i: the copy engine's flags
  uint64_t* dev_flag_a = nullptr;  // the flags' device addresses
  uint64_t* dev_flag_b = nullptr;
  uint64_t* flags[2] = {};  // the flags in the pool

  ~PingPong() {
    // A run that failed may have left a stream waiting for a flag that
    // never came: every wait ends at this value.
    for (uint64_t* f : flags) {
      if (f != nullptr) std::atomic_ref<uint64_t>(*f).store(uint64_t{1} << 62);
    }
    if (a != nullptr) (void)cudaStreamSynchronize(a);
    if (b != nullptr) (void)cudaStreamSynchronize(b);
    for (void* p : {src[0], src[1], got, relay, static_cast<void*>(values)}) {
      if (p != nullptr) (void)cudaFree(p);
    }
    for (cudaEvent_t e : {done_a, done_b}) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    for (cudaStream_t s : {a, b}) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
    }
    (void)cudaGetLastError();
  }
};

uint64_t Load(const uint64_t* flag) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(flag)).load(std::memory_order_acquire);
}

// The CPU hears a doorbell: spins until *flag >= v.
absl::Status Hear(const uint64_t* flag, uint64_t v, const char* whose) {
  const absl::Time deadline = absl::Now() + kHearWithin;
  for (uint32_t spins = 0; Load(flag) < v; ++spins) {
    if (spins % 4096 == 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(whose, " flag stayed at ", Load(flag), " (expected ", v, ") for 10 s"));
    }
  }
  return absl::OkStatus();
}

// The CPU waits for the stream's work so far (the transport's event poll).
absl::Status Drain(cudaStream_t s, cudaEvent_t e) {
  CXLRT_RETURN_IF_ERROR(Check(cudaEventRecord(e, s), "cudaEventRecord"));
  const absl::Time deadline = absl::Now() + kHearWithin;
  for (uint32_t spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return Check(q, "cudaEventQuery");
    if (spins % 4096 == 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError("a copy did not complete within 10 s");
    }
  }
}

absl::Status CopyOn(cudaStream_t s, void* dst, const void* src, size_t n) {
  return Check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s), "cudaMemcpyAsync");
}

// One run of `rounds` round trips; returns its seconds.
absl::StatusOr<double> Run(Doorbell how, PingPong& p, uint8_t* pool_a, uint8_t* pool_b,
                           uint64_t* flag_a, uint64_t* flag_b, size_t n, int rounds) {
  // Both streams are idle: the flags start again from 0.
  std::atomic_ref<uint64_t>(*flag_a).store(0, std::memory_order_release);
  std::atomic_ref<uint64_t>(*flag_b).store(0, std::memory_order_release);
  const cuda::StreamValue64Fn write = cuda::StreamWriteValue64();
  const cuda::StreamValue64Fn wait = cuda::StreamWaitValue64();
  // GPU-side rings and waits (kernel and memop modes).
  auto ring = [&](cudaStream_t s, uint64_t* dev_flag, uint64_t v) -> absl::Status {
    if (how == Doorbell::kKernel) return Check(cuda::LaunchRingWord(dev_flag, v, s), "ring kernel");
    return CheckDriver(write(s, reinterpret_cast<uint64_t>(dev_flag), v, cuda::kWriteValueDefault),
                       "cuStreamWriteValue64");
  };
  auto await = [&](cudaStream_t s, uint64_t* dev_flag, uint64_t v) -> absl::Status {
    if (how == Doorbell::kKernel) {
      return Check(cuda::LaunchWaitWord(dev_flag, v, s, /*poll_ns=*/0), "wait kernel");
    }
    return CheckDriver(wait(s, reinterpret_cast<uint64_t>(dev_flag), v, cuda::kWaitValueGeq),
                       "cuStreamWaitValue64");
  };

  const absl::Time start = absl::Now();
  for (int i = 1; i <= rounds; ++i) {
    const void* src = p.src[i % 2];
    switch (how) {
      case Doorbell::kHost:
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, pool_a, src, n));
        CXLRT_RETURN_IF_ERROR(Drain(p.a, p.done_a));
        std::atomic_ref<uint64_t>(*flag_a).store(i, std::memory_order_release);
        CXLRT_RETURN_IF_ERROR(Hear(flag_a, i, "A's"));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, p.relay, pool_a, n));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, pool_b, p.relay, n));
        CXLRT_RETURN_IF_ERROR(Drain(p.b, p.done_b));
        std::atomic_ref<uint64_t>(*flag_b).store(i, std::memory_order_release);
        CXLRT_RETURN_IF_ERROR(Hear(flag_b, i, "B's"));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, p.got, pool_b, n));
        CXLRT_RETURN_IF_ERROR(Drain(p.a, p.done_a));
        break;
      case Doorbell::kCopy:
        // A's next send follows its receive on stream a: no host wait.
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, pool_a, src, n));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, flag_a, &p.values[i], 8));
        CXLRT_RETURN_IF_ERROR(Hear(flag_a, i, "A's"));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, p.relay, pool_a, n));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, pool_b, p.relay, n));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, flag_b, &p.values[i], 8));
        CXLRT_RETURN_IF_ERROR(Hear(flag_b, i, "B's"));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, p.got, pool_b, n));
        break;
      case Doorbell::kKernel:
      case Doorbell::kMemop:
        // Enqueued whole: stream a runs A's rounds, b runs B's, and they
        // meet only at the flags. A round's B half is enqueued right after
        // its A half, so a full launch queue on one stream never waits on
        // work not yet enqueued on the other.
        if (i > 1) {
          CXLRT_RETURN_IF_ERROR(await(p.a, p.dev_flag_b, i - 1));
          CXLRT_RETURN_IF_ERROR(CopyOn(p.a, p.got, pool_b, n));
        }
        CXLRT_RETURN_IF_ERROR(CopyOn(p.a, pool_a, src, n));
        CXLRT_RETURN_IF_ERROR(ring(p.a, p.dev_flag_a, i));
        CXLRT_RETURN_IF_ERROR(await(p.b, p.dev_flag_a, i));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, p.relay, pool_a, n));
        CXLRT_RETURN_IF_ERROR(CopyOn(p.b, pool_b, p.relay, n));
        CXLRT_RETURN_IF_ERROR(ring(p.b, p.dev_flag_b, i));
        if (i == rounds) {
          CXLRT_RETURN_IF_ERROR(await(p.a, p.dev_flag_b, i));
          CXLRT_RETURN_IF_ERROR(CopyOn(p.a, p.got, pool_b, n));
        }
        break;
    }
  }
  CXLRT_RETURN_IF_ERROR(Drain(p.a, p.done_a));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  CXLRT_RETURN_IF_ERROR(Drain(p.b, p.done_b));  // idle before the flags are reset
  return seconds;
}

}  // namespace

absl::StatusOr<PingPongTimes> TimePingPong(Doorbell how, uint8_t* pool_a, uint8_t* pool_b,
                                           uint64_t* flag_a, uint64_t* flag_b, size_t n, int rounds,
                                           int reps) {
  if (!gpu::GpuAvailable()) return cuda::NoGpu();
  if (n == 0 || n % 8 != 0 || rounds < 1 || reps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ping-pong of ", n, " bytes, ", rounds,
                                                   " rounds, ", reps,
                                                   " runs: needs a multiple of 8 bytes and "
                                                   "at least one round and run"));
  }
  if (how == Doorbell::kMemop &&
      (cuda::StreamWriteValue64() == nullptr || cuda::StreamWaitValue64() == nullptr)) {
    return absl::UnavailableError("the driver has no stream memory operations");
  }
  PingPong p;
  p.flags[0] = flag_a;
  p.flags[1] = flag_b;
  CXLRT_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&p.a, cudaStreamNonBlocking), "stream"));
  CXLRT_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&p.b, cudaStreamNonBlocking), "stream"));
  for (cudaEvent_t* e : {&p.done_a, &p.done_b}) {
    CXLRT_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "event"));
  }
  for (void** buf : {&p.src[0], &p.src[1], &p.got, &p.relay}) {
    CXLRT_RETURN_IF_ERROR(Check(cudaMalloc(buf, n), "cudaMalloc"));
  }
  std::vector<uint64_t> values(rounds + 1);
  for (int i = 0; i <= rounds; ++i) values[i] = i;
  const size_t values_bytes = values.size() * sizeof(uint64_t);
  CXLRT_RETURN_IF_ERROR(
      Check(cudaMalloc(reinterpret_cast<void**>(&p.values), values_bytes), "cudaMalloc"));
  CXLRT_RETURN_IF_ERROR(Check(
      cudaMemcpy(p.values, values.data(), values_bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  void* dev = nullptr;
  CXLRT_RETURN_IF_ERROR(Check(cudaHostGetDevicePointer(&dev, flag_a, 0), "flag A's address"));
  p.dev_flag_a = static_cast<uint64_t*>(dev);
  CXLRT_RETURN_IF_ERROR(Check(cudaHostGetDevicePointer(&dev, flag_b, 0), "flag B's address"));
  p.dev_flag_b = static_cast<uint64_t*>(dev);
  std::vector<uint32_t> pattern(n / 4);
  for (int k = 0; k < 2; ++k) {
    for (size_t w = 0; w < pattern.size(); ++w) pattern[w] = PatternWord(k + 1, w);
    CXLRT_RETURN_IF_ERROR(
        Check(cudaMemcpy(p.src[k], pattern.data(), n, cudaMemcpyHostToDevice), "fill"));
  }

  PingPongTimes out;
  std::vector<double> hops;
  std::vector<uint32_t> got(n / 4);
  CXLRT_RETURN_IF_ERROR(Run(how, p, pool_a, pool_b, flag_a, flag_b, n, 1).status());  // warm-up
  for (int r = 0; r < reps; ++r) {
    CXLRT_ASSIGN_OR_RETURN(double s, Run(how, p, pool_a, pool_b, flag_a, flag_b, n, rounds));
    hops.push_back(s / (2.0 * rounds));
    CXLRT_RETURN_IF_ERROR(Check(cudaMemcpy(got.data(), p.got, n, cudaMemcpyDefault), "check"));
    const uint32_t seed = rounds % 2 + 1;  // the last round sent p.src[rounds % 2]
    for (size_t w = 0; w < got.size(); ++w) {
      if (got[w] != PatternWord(seed, w)) {
        const uint32_t want = PatternWord(seed, w);
        for (int byte = 0; byte < 4; ++byte) {
          out.wrong_bytes += ((got[w] ^ want) >> (8 * byte) & 0xff) != 0;
        }
      }
    }
  }
  std::sort(hops.begin(), hops.end());
  out.hop_seconds = hops[hops.size() / 2];
  return out;
}

absl::StatusOr<double> TimeCopies(void* dst, const void* src, size_t n, int iters,
                                  void* reverse_dst, const void* reverse_src) {
  if (!gpu::GpuAvailable()) return gpu::cuda::NoGpu();
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
    return cuda::Failed("timing copies", e);
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

}  // namespace cxlrt::bench
