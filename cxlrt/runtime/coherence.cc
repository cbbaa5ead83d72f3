#include "cxlrt/runtime/coherence.h"

#include <immintrin.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/coherence_counters.h"
#include "cxlrt/runtime/cpu_features.h"
#include "cxlrt/runtime/internal/cpu_kernels.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::runtime {

CoherenceCounters& GetCoherenceCounters() {
  // Made on first use (a domain may be made from a static initialiser) and
  // never destroyed.
  static CoherenceCounters* c = new CoherenceCounters{
      *new Counter({"coherence.flushes", "calls",
                    "Flush calls (write-backs) of the software and simulated coherence domains."}),
      *new Counter({"coherence.flushed_lines", "lines", "Cache lines those Flush calls covered."}),
      *new Counter({"coherence.invalidates", "calls",
                    "Invalidate calls (bulk reads' included) of the software and simulated "
                    "coherence domains."}),
      *new Counter(
          {"coherence.invalidated_lines", "lines", "Cache lines those Invalidate calls covered."})};
  return *c;
}

namespace {

// Below this a regular copy plus write-back beats streaming stores.
constexpr size_t kNonTemporalMin = 4096;

// A copy out of the pool that bypasses the destination's cache from
// kNonTemporalMin up (CopyFromPoolStreaming).
void StreamingCopy(void* dst, const void* src, size_t n) {
  if (n >= kNonTemporalMin) {
    NonTemporalCopy(dst, src, n);
  } else {
    CopyBytes(dst, src, n);
  }
}

// A Publish's copy into the pool (1 KiB-64 KiB): `rep movsb` where the CPU
// has enhanced rep movsb, which stores whole lines without reading them for
// ownership, while vector stores first pull each line back from the core
// that last read it (the peer that read the previous post in this slot).
// glibc's memcpy takes `rep movsb` only from 2112 bytes up on CPUs with
// fast short rep movsb (this one); 2-rank all-reduce of 1.5 KiB, best of 6
// interleaved rounds on the 2-vCPU VM: 0.86 -> 0.72 us, 2 KiB 1.04 -> 0.79
// us (docs/collectives.md, "Small calls"). From 1 KiB down the two are even
// and memcpy's short paths win; above 64 KiB memcpy's own choice stands
// (it switches to non-temporal stores for copies larger than the caches).
constexpr size_t kStringStoreMin = 1024;
constexpr size_t kStringStoreMax = 64 << 10;

void StoreBytes(void* dst, const void* src, size_t n) {
  static const bool erms = GetCpuFeatures().erms;
  if (erms && n >= kStringStoreMin && n <= kStringStoreMax) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
  } else {
    std::memcpy(dst, src, n);
  }
}

inline uintptr_t LineDown(const void* p) {
  return reinterpret_cast<uintptr_t>(p) & ~uintptr_t{kCacheLine - 1};
}

__attribute__((target("clwb"))) void ClwbRange(uintptr_t a, uintptr_t end) {
  for (; a < end; a += kCacheLine) _mm_clwb(reinterpret_cast<void*>(a));
}
__attribute__((target("clflushopt"))) void ClflushoptRange(uintptr_t a, uintptr_t end) {
  for (; a < end; a += kCacheLine) _mm_clflushopt(reinterpret_cast<void*>(a));
}
void ClflushRange(uintptr_t a, uintptr_t end) {
  for (; a < end; a += kCacheLine) _mm_clflush(reinterpret_cast<void*>(a));
}

void FlushWith(FlushInstruction f, const void* p, size_t n) {
  if (n == 0) return;
  uintptr_t a = LineDown(p);
  uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  switch (f) {
    case FlushInstruction::kClwb:
      ClwbRange(a, end);
      break;
    case FlushInstruction::kClflushopt:
      ClflushoptRange(a, end);
      break;
    case FlushInstruction::kClflush:
    case FlushInstruction::kNone:  // every x86-64 CPU has clflush
      ClflushRange(a, end);
      break;
  }
}

// Coherent memory (one host, or CXL 3.x HDM-DB): fences order, caches do
// the rest.
class HardwareCoherence final : public Coherence {
 public:
  HardwareCoherence(uint8_t* base, uint64_t size) : Coherence(base, size) { set_plain_words(); }
  bool RmwAllowedEverywhere() const override { return true; }
  CoherenceDomain domain() const override { return CoherenceDomain::kHardware; }
  void DoWrite(PoolOffset dst, const void* src, size_t n) override { StoreBytes(At(dst), src, n); }
  void DoRead(void* dst, PoolOffset src, size_t n) override { std::memcpy(dst, At(src), n); }
  void DoFlush(PoolOffset, size_t) override { std::atomic_thread_fence(std::memory_order_release); }
  void DoInvalidate(PoolOffset, size_t) override {
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  void DoStoreFlag(PoolOffset flag, uint64_t value) override {
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(flag)))
        .store(value, std::memory_order_release);
  }
  uint64_t DoLoadFlag(PoolOffset flag) override {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(flag)))
        .load(std::memory_order_acquire);
  }
  void DoCopyToPool(PoolOffset dst, const void* src, size_t n) override {
    if (n >= kNonTemporalMin) {
      NonTemporalCopy(At(dst), src, n);
    } else {
      std::memcpy(At(dst), src, n);
    }
    std::atomic_thread_fence(std::memory_order_release);
  }
  void DoCopyFromPool(void* dst, PoolOffset src, size_t n) override {
    std::atomic_thread_fence(std::memory_order_acquire);
    CopyBytes(dst, At(src), n);
  }
  void DoCopyFromPoolStreaming(void* dst, PoolOffset src, size_t n) override {
    std::atomic_thread_fence(std::memory_order_acquire);
    StreamingCopy(dst, At(src), n);
  }
};

// Non-coherent CXL (2.0 multi-host, HDM-H): every publish writes lines back
// to the device, every fetch drops the local copy first.
class SoftwareCoherence final : public Coherence {
 public:
  SoftwareCoherence(uint8_t* base, uint64_t size)
      : Coherence(base, size),
        writeback_(GetCpuFeatures().writeback),
        invalidate_(GetCpuFeatures().invalidate) {}
  CoherenceDomain domain() const override { return CoherenceDomain::kSoftware; }
  void DoWrite(PoolOffset dst, const void* src, size_t n) override { StoreBytes(At(dst), src, n); }
  void DoRead(void* dst, PoolOffset src, size_t n) override { std::memcpy(dst, At(src), n); }
  void DoFlush(PoolOffset off, size_t n) override {
    FlushWith(writeback_, At(off), n);
    _mm_sfence();  // write-backs complete before any later store
    counters_.flushes.Add();
    counters_.flushed_lines.Add(LinesOf(off, n));
  }
  void DoInvalidate(PoolOffset off, size_t n) override {
    FlushWith(invalidate_, At(off), n);
    _mm_mfence();  // clflushopt is not ordered with later loads without it
    counters_.invalidates.Add();
    counters_.invalidated_lines.Add(LinesOf(off, n));
  }
  void DoStoreFlag(PoolOffset flag, uint64_t value) override {
    _mm_sfence();  // earlier write-backs of the data before the flag
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(flag)))
        .store(value, std::memory_order_release);
    FlushWith(writeback_, At(flag), 8);
    _mm_sfence();
  }
  uint64_t DoLoadFlag(PoolOffset flag) override {
    FlushWith(invalidate_, At(flag), 8);
    _mm_mfence();
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(flag)))
        .load(std::memory_order_acquire);
  }
  void DoCopyToPool(PoolOffset dst, const void* src, size_t n) override {
    if (n >= kNonTemporalMin) {
      NonTemporalCopy(At(dst), src, n);  // ends with sfence
    } else {
      std::memcpy(At(dst), src, n);
      FlushWith(writeback_, At(dst), n);
      _mm_sfence();
    }
  }
  void DoCopyFromPool(void* dst, PoolOffset src, size_t n) override {
    DoInvalidate(src, n);
    CopyBytes(dst, At(src), n);
  }
  void DoCopyFromPoolStreaming(void* dst, PoolOffset src, size_t n) override {
    DoInvalidate(src, n);
    StreamingCopy(dst, At(src), n);
  }

 private:
  const FlushInstruction writeback_;
  const FlushInstruction invalidate_;
  CoherenceCounters& counters_ = GetCoherenceCounters();
};

std::mutex g_factories_mu;
CoherenceFactory g_factories[4] = {};

}  // namespace

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void Coherence::OutOfRange(PoolOffset off, size_t n) const {
  std::fprintf(stderr,
               "cxlrt: FATAL: pool access [%#llx, +%zu) outside the pool of %llu bytes "
               "(an unvalidated offset reached the coherence layer)\n",
               static_cast<unsigned long long>(off), n, static_cast<unsigned long long>(size_));
  std::abort();
}

void Coherence::Misaligned(PoolOffset flag) const {
  std::fprintf(stderr,
               "cxlrt: FATAL: pool flag at %#llx is not 8-byte aligned "
               "(an unvalidated offset reached the coherence layer)\n",
               static_cast<unsigned long long>(flag));
  std::abort();
}

absl::Status Coherence::WaitFlag(PoolOffset flag, uint64_t expected, absl::Time deadline,
                                 WaitWatch* watch) {
  std::string what = absl::StrCat("flag at pool offset ", absl::Hex(flag), " to reach ", expected);
  return WaitUntil([&] { return LoadFlag(flag) >= expected; }, deadline, what, watch);
}

absl::Status Coherence::CheckRmw(PoolOffset off, const char* what) {
  CheckRange(off, 8);
  if (off % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " at pool offset 0x", absl::Hex(off), " is not 8-byte aligned"));
  }
  if (RmwAllowedEverywhere()) return absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(windows_mu_);
    for (const auto& [start, len] : windows_) {
      if (off >= start && off - start < len && len - (off - start) >= 8) return absl::OkStatus();
    }
  }
  std::string msg = absl::StrCat(
      what, " at pool offset 0x", absl::Hex(off), " outside a coherent window in the ",
      CoherenceDomainName(domain()),
      " domain: cross-host read-modify-write is not atomic on non-coherent CXL memory");
  CXLRT_LOG(kError) << msg;
  return absl::FailedPreconditionError(msg);
}

uint64_t Coherence::DoFetchAdd(PoolOffset off, uint64_t delta) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(off))).fetch_add(delta);
}

bool Coherence::DoCompareExchange(PoolOffset off, uint64_t& expected, uint64_t desired) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(off)))
      .compare_exchange_strong(expected, desired);
}

absl::StatusOr<uint64_t> Coherence::AtomicFetchAdd(PoolOffset off, uint64_t delta) {
  if (absl::Status s = CheckRmw(off, "atomic fetch-add"); !s.ok()) return s;
  return DoFetchAdd(off, delta);
}

absl::StatusOr<bool> Coherence::AtomicCompareExchange(PoolOffset off, uint64_t& expected,
                                                      uint64_t desired) {
  if (absl::Status s = CheckRmw(off, "atomic compare-exchange"); !s.ok()) return s;
  return DoCompareExchange(off, expected, desired);
}

void Coherence::DeclareCoherentWindow(PoolOffset off, uint64_t len) {
  CheckRange(off, len);
  std::lock_guard<std::mutex> lock(windows_mu_);
  windows_.emplace_back(off, len);
}

void RegisterCoherenceFactory(CoherenceDomain domain, CoherenceFactory factory) {
  std::lock_guard<std::mutex> lock(g_factories_mu);
  g_factories[static_cast<int>(domain)] = factory;
}

absl::StatusOr<std::unique_ptr<Coherence>> MakeCoherence(CoherenceDomain domain, uint8_t* base,
                                                         uint64_t size) {
  switch (domain) {
    case CoherenceDomain::kHardware:
      return std::unique_ptr<Coherence>(new HardwareCoherence(base, size));
    case CoherenceDomain::kSoftware:
      return std::unique_ptr<Coherence>(new SoftwareCoherence(base, size));
    case CoherenceDomain::kSimulated: {
      std::lock_guard<std::mutex> lock(g_factories_mu);
      if (CoherenceFactory f = g_factories[static_cast<int>(domain)]) return f(base, size);
      return absl::FailedPreconditionError(
          "coherence domain 'simulated' is not available: no simulator is linked into this "
          "program");
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown coherence domain ", static_cast<uint32_t>(domain)));
}

namespace {

// Only reached at CPU level avx2 and up.
__attribute__((target("avx2"))) void CopyAvx2(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i < n) std::memcpy(d + i, s + i, n - i);
}

void CopySse2(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  if (i < n) std::memcpy(d + i, s + i, n - i);
}

constexpr runtime_internal::CopyKernel kCopyByLevel[kNumCpuLevels] = {CopySse2, CopyAvx2, CopyAvx2};

}  // namespace

void CopyBytes(void* dst, const void* src, size_t n) {
  static const runtime_internal::CopyKernel copy = ForActiveCpuLevel(kCopyByLevel);
  if (n < 2048) {
    std::memcpy(dst, src, n);
  } else {
    copy(dst, src, n);
  }
}

void NonTemporalCopy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Head: plain stores up to a 16 B boundary, written back.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  if (head) {
    std::memcpy(d, s, head);
    WriteBackLines(d, head);
    d += head;
    s += head;
    n -= head;
  }
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  if (i < n) {
    std::memcpy(d + i, s + i, n - i);
    WriteBackLines(d + i, n - i);
  }
  _mm_sfence();
}

void WriteBackLines(const void* p, size_t n) { FlushWith(GetCpuFeatures().writeback, p, n); }

void InvalidateLines(const void* p, size_t n) { FlushWith(GetCpuFeatures().invalidate, p, n); }

}  // namespace cxlrt::runtime

namespace cxlrt::runtime_internal {

CopyKernel CopyKernelAt(runtime::CpuLevel level) {
  return runtime::kCopyByLevel[static_cast<int>(level)];
}

}  // namespace cxlrt::runtime_internal
