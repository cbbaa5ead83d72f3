// GPU memory seen from the host: the kind of a pointer, GPU and
// page-locked allocations, copies and streams, without CUDA headers (a
// stream is a void*, a cudaStream_t). For the layers above (a collective's
// or a KV batch's buffers), the Python package, benchmarks and tests. The
// same header with or without CUDA in the build: each call that needs a GPU
// returns kUnavailable saying why when there is none (cxlrt/gpu/gpu.h).
//
// Thread-safety: thread-safe.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/runtime/memory_kind.h"

namespace cxlrt::gpu {

// kGpu for memory of a GPU (cudaMalloc, cudaMallocManaged); kHost for
// everything else, and always when no GPU is available.
runtime::MemoryKind KindOf(const void* p);

// GPU memory: kResourceExhausted naming the size when the GPU has none left.
absl::StatusOr<void*> GpuAlloc(size_t bytes);
void GpuFree(void* p);
// Page-locked host memory (cudaMallocHost): the reference for DMA
// bandwidth.
absl::StatusOr<void*> PageLockedAlloc(size_t bytes);
void PageLockedFree(void* p);
// Synchronous copy between any two kinds of memory.
absl::Status CopySync(void* dst, const void* src, size_t n);
// A non-blocking stream, and waiting for it.
absl::StatusOr<void*> StreamCreate();
void StreamDestroy(void* stream);
absl::Status StreamSynchronize(void* stream);
// Enqueued on `stream`: copies n bytes (any kinds; GPU or page-locked for
// the copy to be asynchronous).
absl::Status CopyAsync(void* dst, const void* src, size_t n, void* stream);

}  // namespace cxlrt::gpu
