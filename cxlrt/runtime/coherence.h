// The coherence layer: every read and write of pool memory that another
// host may see goes through a Coherence, chosen when the pool is opened.
//
//   domain     write side                         read side
//   hardware   store, release fence               acquire fence, load
//   software   store, clwb (else clflushopt), sfence   clflushopt, mfence, load
//   simulated  (cxlrt/emulation/) private per-host cache; only Flush writes back,
//              only Invalidate drops, so a missing one shows as a stale read
//
// Addresses are pool offsets, never pointers: the pool maps anywhere, and
// the simulator needs to see every access. An offset range outside the pool
// is a bug in the caller (every offset read from the pool is validated
// before use) and aborts with a message rather than touching other memory.
//
// Rules the protocols above follow (DESIGN.md, docs/coherence.md):
// - A flag is a 64-bit counter that only grows, alone in its cache line and
//   128 B away from any other writer's line; one host writes it.
// - Data is published (Flush) before the flag that announces it; a reader
//   invalidates the data after it sees the flag.
//
// Thread-safety: hardware and software Coherence objects are stateless and
// safe from any thread. Implementations must document their own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlrt/runtime/coherence_domain.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::runtime {

using PoolOffset = uint64_t;

inline constexpr size_t kCacheLine = 64;
// Distance between lines of different writers: adjacent-line prefetch pairs
// 64 B lines, so 128 B keeps two writers from sharing a prefetch pair.
inline constexpr size_t kWriterSeparation = 128;

// A model of the device's speed (cxlrt/emulation/access_model.h): after each
// access the coherence layer calls Complete(), which returns once the
// access would have finished on the modeled device. Thread-safe.
class AccessModel {
 public:
  virtual ~AccessModel() = default;
  // An access of `bytes` at `off` that started at `start_ns` (steady clock,
  // NowNs()) and, when `round_trip`, waited for one device round trip.
  virtual void Complete(PoolOffset off, size_t bytes, bool round_trip, int64_t start_ns) = 0;
  // "latency 700 ns, 25 GB/s per device": for tools.
  virtual std::string Describe() const = 0;
};

// Monotonic nanoseconds, the same clock in every process of a machine.
int64_t NowNs();

class Coherence {
 public:
  Coherence(uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  virtual ~Coherence() = default;

  virtual CoherenceDomain domain() const = 0;

  // Every access below aborts with a message when its range is not inside
  // the pool (an unvalidated offset is a bug of the caller), and is charged
  // to the access model when the pool has one.

  // Stores `n` bytes at `dst`. Other hosts may not see them until Flush.
  void Write(PoolOffset dst, const void* src, size_t n) {
    const int64_t t = Start(dst, n);
    DoWrite(dst, src, n);
    Charge(dst, n, false, t);
  }
  // Loads `n` bytes at `src`. May return this host's stale copy: Invalidate
  // first to see other hosts' writes.
  void Read(void* dst, PoolOffset src, size_t n) {
    const int64_t t = Start(src, n);
    DoRead(dst, src, n);
    Charge(src, n, true, t);
  }
  // Writes back this host's stores to [off, off+n) and orders them before
  // any later store of this thread (so a flag stored after it is seen after).
  void Flush(PoolOffset off, size_t n) {
    const int64_t t = Start(off, n);
    DoFlush(off, n);
    Charge(off, 0, n > 0, t);
  }
  // Drops this host's copy of [off, off+n), so the next Read sees the pool;
  // orders it after every earlier load of this thread.
  void Invalidate(PoolOffset off, size_t n) {
    CheckRange(off, n);
    DoInvalidate(off, n);
  }

  // A GPU of this host is about to write [off, off+n) by DMA.
  // x86 DMA is coherent with the host's own caches (it updates or drops
  // their lines), so only the simulated domain, whose private cache a DMA
  // cannot see, drops its copies of the lines here.
  void BeforeGpuWrite(PoolOffset off, size_t n) {
    CheckRange(off, n);
    DoBeforeGpuWrite(off, n);
  }

  // Stores a flag and publishes it. REQUIRES: `flag` 8-byte aligned, one writer.
  void StoreFlag(PoolOffset flag, uint64_t value) {
    const int64_t t = Start(flag, 8);
    CheckFlag(flag);
    DoStoreFlag(flag, value);
    Charge(flag, 8, true, t);
  }
  // Orders this thread's earlier stores (flags included) before its later
  // loads, in every domain: a full fence (mfence). Release/acquire is not
  // enough for a protocol that writes its own line and then reads another
  // host's: x86 lets the load pass the store still in the store buffer, so
  // both hosts can read the other's old value (tests/models/bakery_tso.pml).
  void FenceStoresBeforeLoads() { std::atomic_thread_fence(std::memory_order_seq_cst); }
  // Loads the current value of a flag, as published by its writer.
  uint64_t LoadFlag(PoolOffset flag) {
    const int64_t t = Start(flag, 8);
    CheckFlag(flag);
    const uint64_t v = DoLoadFlag(flag);
    Charge(flag, 8, true, t);
    return v;
  }

  // Bulk copy into the pool with non-temporal stores; the bytes are visible
  // to every host (in the pool, not in a cache) when it returns.
  void CopyToPool(PoolOffset dst, const void* src, size_t n) {
    const int64_t t = Start(dst, n);
    DoCopyToPool(dst, src, n);
    Charge(dst, n, true, t);
  }
  // Bulk copy out of the pool of what every host has published.
  void CopyFromPool(void* dst, PoolOffset src, size_t n) {
    const int64_t t = Start(src, n);
    DoCopyFromPool(dst, src, n);
    Charge(src, n, true, t);
  }

  // Write + Flush: after it returns, a reader that sees a later flag and
  // then calls Fetch() on the same range sees these bytes.
  // A line the range covers only in part is invalidated first: this host's
  // cached copy of it may be stale (a block freed and reused, a line another
  // host wrote since), and writing back the whole line would put the stale
  // bytes around [dst, dst+n) over the other host's (issue 13, defects 4-5).
  void Publish(PoolOffset dst, const void* src, size_t n) {
    InvalidatePartialLines(dst, n);
    Write(dst, src, n);
    Flush(dst, n);
    CXLRT_FAULT_POINT_AFTER_WRITE("coherence.publish", this, dst, n);
  }
  // Invalidate + Read: the bytes as last published by their writer.
  void Fetch(void* dst, PoolOffset src, size_t n) {
    Invalidate(src, n);
    Read(dst, src, n);
  }

  // CopyFromPool with non-temporal stores into `dst` for large copies: the
  // bytes go to memory, not into this core's cache (no read-for-ownership
  // of `dst`). For data the caller hands on rather than reads at once, such
  // as a KV block bound for a GPU.
  void CopyFromPoolStreaming(void* dst, PoolOffset src, size_t n) {
    const int64_t t = Start(src, n);
    DoCopyFromPoolStreaming(dst, src, n);
    Charge(src, n, true, t);
  }

  // Bulk reads in place (a reduction over other hosts' published bytes,
  // with no copy out first): returns this host's address of [src, src+n)
  // after dropping its cached copy, so loads through it see what was
  // published before a flag this thread has since seen. Charged as a read
  // of n bytes.
  const uint8_t* BeginRead(PoolOffset src, size_t n) {
    const int64_t t = Start(src, n);
    DoInvalidate(src, n);
    Charge(src, n, true, t);
    return At(src);
  }
  template <typename T>
  void PublishObject(PoolOffset dst, const T& value) {
    Publish(dst, &value, sizeof(T));
  }
  // Fetch of one aligned 8-byte word, for hot paths that read a few words
  // another host publishes (a remote free reads four): in the hardware
  // domain without an access model it is a load after an acquire fence,
  // with no call through the domain.
  uint64_t FetchWord(PoolOffset src) {
    if (plain_words_ && !model_) {
      CheckRange(src, 8);
      std::atomic_thread_fence(std::memory_order_acquire);
      uint64_t v;
      std::memcpy(&v, At(src), 8);
      return v;
    }
    uint64_t v;
    Fetch(&v, src, 8);
    return v;
  }
  template <typename T>
  T FetchObject(PoolOffset src) {
    T value;
    Fetch(&value, src, sizeof(T));
    return value;
  }

  // Atomic read-modify-write on pool memory. Cross-host RMW is not atomic
  // on CXL 2.0 memory, so the software and simulated domains allow it only
  // inside a window declared coherent (CXL 3.x HDM-DB regions); elsewhere
  // they return kFailedPrecondition naming the offset, and log it.
  // REQUIRES: `off` 8-byte aligned (else kInvalidArgument).
  absl::StatusOr<uint64_t> AtomicFetchAdd(PoolOffset off, uint64_t delta);
  // Returns whether it swapped; `expected` gets the value seen.
  absl::StatusOr<bool> AtomicCompareExchange(PoolOffset off, uint64_t& expected, uint64_t desired);
  // Declares [off, off+len) coherent for this host's atomic RMW.
  void DeclareCoherentWindow(PoolOffset off, uint64_t len);

  // Waits until the flag at `flag` is >= `expected`. Returns OK,
  // kDeadlineExceeded, or the watch's status (kAborted for a dead peer).
  absl::Status WaitFlag(PoolOffset flag, uint64_t expected, absl::Time deadline,
                        WaitWatch* watch = nullptr);

  // Puts every later access under `model` (null: none). REQUIRES: called
  // before the Coherence is shared between threads.
  void SetModel(std::unique_ptr<AccessModel> model) { model_ = std::move(model); }
  const AccessModel* model() const { return model_.get(); }

  uint64_t size() const { return size_; }

 protected:
  // The domain's implementation of each access; ranges already checked.
  virtual void DoWrite(PoolOffset dst, const void* src, size_t n) = 0;
  virtual void DoRead(void* dst, PoolOffset src, size_t n) = 0;
  virtual void DoFlush(PoolOffset off, size_t n) = 0;
  virtual void DoInvalidate(PoolOffset off, size_t n) = 0;
  virtual void DoStoreFlag(PoolOffset flag, uint64_t value) = 0;
  virtual uint64_t DoLoadFlag(PoolOffset flag) = 0;
  virtual void DoCopyToPool(PoolOffset dst, const void* src, size_t n) = 0;
  virtual void DoCopyFromPool(void* dst, PoolOffset src, size_t n) = 0;
  virtual void DoBeforeGpuWrite(PoolOffset, size_t) {}
  virtual void DoCopyFromPoolStreaming(void* dst, PoolOffset src, size_t n) {
    DoCopyFromPool(dst, src, n);
  }

  // True when this domain may do RMW anywhere (hardware).
  virtual bool RmwAllowedEverywhere() const { return false; }
  // The RMW itself, on pool memory; the simulator first writes back and
  // drops its cached copy of the line.
  virtual uint64_t DoFetchAdd(PoolOffset off, uint64_t delta);
  virtual bool DoCompareExchange(PoolOffset off, uint64_t& expected, uint64_t desired);

  // Drops this host's copy of the first and last line of [off, off+n) when
  // the range covers them only in part (Publish).
  void InvalidatePartialLines(PoolOffset off, size_t n) {
    if (n == 0) return;
    CheckRange(off, n);
    const PoolOffset first = off / kCacheLine * kCacheLine;
    const PoolOffset end = off + n;
    const PoolOffset last = (end - 1) / kCacheLine * kCacheLine;
    if (off != first) DoInvalidate(first, kCacheLine);
    if (end % kCacheLine != 0 && (last != first || off == first)) DoInvalidate(last, kCacheLine);
  }

  // Set by a domain whose Fetch is a fence and a load (FetchWord inlines it).
  void set_plain_words() { plain_words_ = true; }

  // Aborts with a message when [off, off+n) is not inside the pool.
  void CheckRange(PoolOffset off, size_t n) const {
    if (off > size_ || n > size_ - off) OutOfRange(off, n);
  }
  // Aborts with a message when a flag is not 8-byte aligned (its load or
  // store would not be atomic).
  void CheckFlag(PoolOffset flag) const {
    if (flag % 8 != 0) Misaligned(flag);
  }
  uint8_t* At(PoolOffset off) const { return base_ + off; }

 private:
  [[noreturn]] void OutOfRange(PoolOffset off, size_t n) const;
  [[noreturn]] void Misaligned(PoolOffset flag) const;

  int64_t Start(PoolOffset off, size_t n) const {
    CheckRange(off, n);
    return model_ ? NowNs() : 0;
  }
  void Charge(PoolOffset off, size_t bytes, bool round_trip, int64_t start_ns) {
    if (model_) model_->Complete(off, bytes, round_trip, start_ns);
  }

  absl::Status CheckRmw(PoolOffset off, const char* what);

  uint8_t* const base_;
  const uint64_t size_;
  std::unique_ptr<AccessModel> model_;
  bool plain_words_ = false;
  std::mutex windows_mu_;
  std::vector<std::pair<PoolOffset, uint64_t>> windows_;  // guarded by windows_mu_
};

// Makes the Coherence of `domain` over the mapping [base, base+size).
// hardware and software are built in; simulated is provided by cxlrt/emulation/
// through RegisterCoherenceFactory, else kFailedPrecondition.
absl::StatusOr<std::unique_ptr<Coherence>> MakeCoherence(CoherenceDomain domain, uint8_t* base,
                                                         uint64_t size);

using CoherenceFactory = std::unique_ptr<Coherence> (*)(uint8_t* base, uint64_t size);
void RegisterCoherenceFactory(CoherenceDomain domain, CoherenceFactory factory);

// Non-temporal copy of `n` bytes (any alignment) followed by sfence: the
// bytes bypass the caches. Used by CopyToPool and by benchmarks.
void NonTemporalCopy(void* dst, const void* src, size_t n);

// memcpy for bulk data (n of a few KiB and up) with vector loads and
// stores. glibc's memcpy uses `rep movsb` from 2 KiB up to about 1 MiB,
// which on the AMD EPYC VMs we measure runs 3-5x slower than a vector loop
// when the source was written by another core (cxlrt bench broadcast,
// 512 KiB: 2.5 GB/s with memcpy, 14 GB/s with this). REQUIRES: the ranges
// do not overlap.
void CopyBytes(void* dst, const void* src, size_t n);

// Writes back (clwb, else clflushopt, else clflush) the lines of [p, p+n).
// No fence. Exposed for tests and the software domain.
void WriteBackLines(const void* p, size_t n);
// Invalidates (clflushopt, else clflush) the lines of [p, p+n). No fence.
void InvalidateLines(const void* p, size_t n);

}  // namespace cxlrt::runtime
