// GPU timings for the benchmarks (`cxlrt bench dma`, `doorbell`, `kv`): the
// time of a copy by GPU events, and a ping-pong through the pool with each
// way of ringing and hearing a doorbell. Not part of the library: the
// library's GPU interface is cxlrt/gpu/. Every call returns kUnavailable
// without a GPU (and in a build without CUDA: bench/no_gpu_timing.cc).
//
// Thread-safety: thread-safe; each call owns its streams and events.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace cxlrt::bench {

// Seconds per copy of n bytes from src to dst, the median of `iters`
// copies timed with GPU events on one stream; with `reverse_dst` and
// `reverse_src` set, a copy the other way runs on a second stream at the
// same time and the figure is the time for both.
absl::StatusOr<double> TimeCopies(void* dst, const void* src, size_t n, int iters,
                                  void* reverse_dst = nullptr, const void* reverse_src = nullptr);

// --- Doorbells (docs/gpu.md, "Doorbells"): how a rank tells a peer that
// bytes it copied from GPU memory into the pool are there, and how the
// peer hears it. `cxlrt bench doorbell` compares them.
enum class Doorbell {
  // The CPU waits for the copy's event, then stores the flag; the peer's
  // CPU polls the flag, then starts its copy out (the transport's way).
  kHost,
  // The copy engine writes the flag after the bytes (an 8-byte copy from
  // GPU memory on the same stream); the peer's CPU polls it.
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
// this process. A hop: one side copies n bytes from its GPU memory into
// its pool buffer and rings its flag; the other hears the flag and copies
// the bytes into its GPU memory. B answers every round with what it
// got; A checks the last round's bytes (rounds alternate two patterns, so
// a stale read shows). Median over `reps` runs of `rounds` round trips.
// kUnavailable when the driver lacks what `how` needs (stream memory
// operations); kDeadlineExceeded when a flag is not heard within 10 s.
// REQUIRES: pool_a and pool_b (n bytes each) and the flags (on lines of
// their own) lie in a pool mapping registered with the GPU
// (gpu::PoolRegistration, e.g. held by a gpu::DmaEngine), and nothing else
// uses them; n is a multiple of 8.
absl::StatusOr<PingPongTimes> TimePingPong(Doorbell how, uint8_t* pool_a, uint8_t* pool_b,
                                           uint64_t* flag_a, uint64_t* flag_b, size_t n, int rounds,
                                           int reps);

}  // namespace cxlrt::bench
