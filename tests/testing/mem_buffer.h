// Test buffers by memory kind, as UCX's mem_buffer: a known pattern of
// 32-bit words written into a buffer of any kind, and the word each index
// must hold, so that a test checks bytes that went through the pool. The
// GPU fill is a kernel (tests/testing/cuda/mem_buffer.cu), so it is
// ordered on a stream like a producer's work; a build without CUDA
// returns kUnavailable (tests/testing/no_gpu_mem_buffer.cc).
//
// Thread-safety: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace cxlrt::testing {

// Word i of the pattern of `seed`.
inline uint32_t PatternWord(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32 | seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x >> 32);
}

// Enqueued on `stream` (a cudaStream_t): a kernel that first spins for
// `delay_us` microseconds, then writes n_words words of the pattern of
// `seed` at p (GPU memory). Tests use the delay to show that work after it
// on the stream waits for it. kUnavailable without a GPU.
absl::Status FillPatternAsync(void* p, size_t n_words, uint32_t seed, uint32_t delay_us,
                              void* stream);

}  // namespace cxlrt::testing
