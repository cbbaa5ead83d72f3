// GPU memory and the pool: which pointers are device memory, the pool
// mapping registered with the device runtime, and a copy engine that moves
// bytes between device memory and the pool by DMA (cxlrt/collectives/cuda/).
// docs/gpu.md describes the data path; this header is the same whether or
// not the build has CUDA (cxlrt/collectives/no_device.cc: no device, every
// function says why).
//
// Fork: the CUDA runtime cannot be used in a child forked after the parent
// initialised it. Nothing here initialises it until a function is called
// (DevicesAvailable, KindOf, MakeDeviceEngine...), so a launcher may fork
// emulated hosts first and let each initialise its own.
//
// Thread-safety: the free functions are thread-safe; a DeviceEngine is used
// by one thread at a time, like every engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::collectives {

enum class MemoryKind : uint8_t { kHost, kDevice };

// Whether this process can use a GPU: a build with CUDA, a driver, and at
// least one device. Decided once per process.
bool DevicesAvailable();
// Why not, when !DevicesAvailable() (e.g. "built without CUDA", "no CUDA
// driver (cudaErrorInsufficientDriver)"); empty otherwise.
std::string DevicesUnavailableReason();

// kDevice for memory of a GPU (cudaMalloc, cudaMallocManaged); kHost for
// everything else, and always when no device is available.
MemoryKind KindOf(const void* p);

// The engine of device buffers: device -> pool DMA on one stream, pool ->
// device DMA on another (both copy engines of the GPU run at once), and
// reductions as kernels on a third. Tickets are CUDA events. Caller
// buffers may be device memory or lie in the pool (whose mapping the engine
// registered); private host memory is not reachable, except a reduction's
// small sources, which it stages.
class DeviceEngine : public CopyEngine {
 public:
  // Orders the engine's later operations after the work enqueued so far
  // on `stream` (a cudaStream_t; null: the legacy default stream).
  virtual absl::Status StartAfter(void* stream) = 0;
  // Orders `stream`'s later work after every operation of the engine so
  // far, without waiting on the host.
  virtual absl::Status FinishBefore(void* stream) = 0;
  // Copies count buffers, dsts[i] <- srcs[i] of sizes[i] bytes, in one
  // submission (cudaMemcpyBatchAsync where the driver has it), into the
  // pool (`to_pool`: every dst lies in the pool) or out of it; one ticket
  // for them all. For scattered KV pages.
  virtual Ticket CopyBatch(bool to_pool, void* const* dsts, const void* const* srcs,
                           const size_t* sizes, size_t count) = 0;

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
  // (cuStreamWaitValue64 on a pinned word, or a one-thread kernel that
  // polls it where the driver lacks stream memory operations).
  virtual absl::Status WaitDoneOn(void* stream, uint64_t seq) = 0;
  // Publishes that every call up to `seq` has finished.
  virtual void SetDone(uint64_t seq) = 0;
};

// An engine over the pool mapping [base, base+size) that `c` covers, on the
// calling thread's current device. Registers the mapping on first use in
// this process (cudaHostRegister, portable and mapped, in pieces of at most
// 256 GiB: larger single calls fail on recent drivers); the registration is
// shared by every engine and store over the mapping and undone when the
// last of them is destroyed. kUnavailable when no device is available;
// kFailedPrecondition naming the CUDA error when the mapping cannot be
// registered.
absl::StatusOr<std::unique_ptr<DeviceEngine>> MakeDeviceEngine(runtime::Coherence& c, uint8_t* base,
                                                               uint64_t size);

// What `cxlrt doctor` prints: driver and runtime versions, each device
// (name, PCI bus id, NUMA node, memory), and whether a mapping of `bytes`
// bytes at `base` registers (and how long it took); "no device: <why>"
// when none.
std::string DescribeDevices(uint8_t* base, uint64_t bytes);

// --- Device memory for tests, benchmarks and the Python package (no CUDA
// headers needed). Each returns kUnavailable without a device.

absl::StatusOr<void*> DeviceAlloc(size_t bytes);
void DeviceFree(void* p);
// Pinned (page-locked) host memory: the reference for DMA bandwidth.
absl::StatusOr<void*> PinnedAlloc(size_t bytes);
void PinnedFree(void* p);
// Synchronous copy between any two kinds of memory.
absl::Status DeviceCopy(void* dst, const void* src, size_t n);
// A non-blocking stream, and waiting for it.
absl::StatusOr<void*> StreamCreate();
void StreamDestroy(void* stream);
absl::Status StreamSynchronize(void* stream);
// Enqueued on `stream`: copies n bytes (any kinds; device or pinned for
// the copy to be asynchronous).
absl::Status CopyAsync(void* dst, const void* src, size_t n, void* stream);
// Enqueued on `stream`: a kernel that first spins for `delay_us`
// microseconds, then writes n_words 32-bit words of a pattern of `seed` at
// p (word i = PatternWord(seed, i)). Tests use the delay to show that work
// after it on the stream waits for it.
absl::Status FillPatternAsync(void* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              void* stream);
inline uint32_t PatternWord(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32 | seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x >> 32);
}

// Seconds per copy of n bytes from src to dst, the median of `iters`
// copies timed with device events on one stream; with `reverse_dst` and
// `reverse_src` set, a copy the other way runs on a second stream at the
// same time and the figure is the time for both.
absl::StatusOr<double> TimeCopies(void* dst, const void* src, size_t n, int iters,
                                  void* reverse_dst = nullptr, const void* reverse_src = nullptr);

// --- Doorbells (docs/gpu.md, "Doorbells"): how a rank tells a peer that
// bytes it copied from device memory into the pool are there, and how the
// peer hears it. `cxlrt bench doorbell` compares them.
enum class Doorbell {
  // The CPU waits for the copy's event, then stores the flag; the peer's
  // CPU polls the flag, then starts its copy out (the transport's way).
  kHost,
  // The copy engine writes the flag after the bytes (an 8-byte copy from
  // device memory on the same stream); the peer's CPU polls it.
  kCopy,
  // A one-thread kernel stores the flag through the mapped pool; the
  // peer's stream waits in a one-thread kernel that polls it.
  kKernel,
  // The stream writes the flag (cuStreamWriteValue64) and the peer's
  // stream waits for it (cuStreamWaitValue64): no CPU and no SM.
  kMemop,
};
inline constexpr Doorbell kDoorbells[] = {Doorbell::kHost, Doorbell::kCopy, Doorbell::kKernel,
                                          Doorbell::kMemop};
inline const char* DoorbellName(Doorbell d) {
  constexpr const char* kNames[] = {"host", "copy", "kernel", "memop"};
  return kNames[static_cast<int>(d)];
}

struct PingPongTimes {
  double hop_seconds = 0;    // one way (half a round trip), median of the runs
  uint64_t wrong_bytes = 0;  // bytes of a run's last round that came back wrong
};
// Times a ping-pong of n bytes through the pool between two streams of
// this process. A hop: one side copies n bytes from its device memory into
// its pool buffer and rings its flag; the other hears the flag and copies
// the bytes into its device memory. B answers every round with what it
// got; A checks the last round's bytes (rounds alternate two patterns, so
// a stale read shows). Median over `reps` runs of `rounds` round trips.
// kUnavailable when the driver lacks what `how` needs (stream memory
// operations); kDeadlineExceeded when a flag is not heard within 10 s.
// REQUIRES: pool_a and pool_b (n bytes each) and the flags (on lines of
// their own) lie in a pool mapping that MakeDeviceEngine registered, and
// nothing else uses them; n is a multiple of 8.
absl::StatusOr<PingPongTimes> TimePingPong(Doorbell how, uint8_t* pool_a, uint8_t* pool_b,
                                           uint64_t* flag_a, uint64_t* flag_b, size_t n, int rounds,
                                           int reps);

}  // namespace cxlrt::collectives
