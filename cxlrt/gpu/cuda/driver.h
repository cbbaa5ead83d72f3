// What the CUDA sources of cxlrt share: a CUDA error as a status, and the
// driver calls cxlrt makes without linking the driver library (the runtime
// looks them up, cudaGetDriverEntryPointByVersion, once per process).
// Internal to cxlrt's CUDA sources (cxlrt/gpu/cuda/, cxlrt/collectives/cuda/,
// bench/cuda/); not installed.
//
// Thread-safety: thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace cxlrt::gpu::cuda {

// "<error name> (<error string>)".
std::string CudaError(cudaError_t e);
// kInternal: "<what>: <error name> (<error string>)".
absl::Status Failed(const char* what, cudaError_t e);
// kUnavailable: "no GPU: <why>" (GpuUnavailableReason()).
absl::Status NoGpu();

// cuStreamWaitValue64 / cuStreamWriteValue64: `addr` is a GPU address
// of page-locked or registered host memory (cudaHostGetDevicePointer).
// Return 0 (CUDA_SUCCESS) or the driver's error.
using StreamValue64Fn = int (*)(cudaStream_t stream, uint64_t addr, uint64_t value, unsigned flags);
// The stream waits until (int64_t)(*addr - value) >= 0.
inline constexpr unsigned kWaitValueGeq = 0x0;  // CU_STREAM_WAIT_VALUE_GEQ
// The write is ordered after the stream's earlier writes (a memory barrier).
inline constexpr unsigned kWriteValueDefault = 0x0;  // CU_STREAM_WRITE_VALUE_DEFAULT

// Null where the driver has no such call.
StreamValue64Fn StreamWaitValue64();
StreamValue64Fn StreamWriteValue64();

}  // namespace cxlrt::gpu::cuda
