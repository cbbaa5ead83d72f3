// The pool's registration with the CUDA runtime (cxlrt/gpu/registration.h).
#include "cxlrt/gpu/registration.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cxlrt/gpu/cuda/driver.h"
#include "cxlrt/gpu/gpu.h"

namespace cxlrt::gpu {

absl::StatusOr<std::shared_ptr<PoolRegistration>> PoolRegistration::Get(uint8_t* base,
                                                                        uint64_t size) {
  if (!GpuAvailable()) return cuda::NoGpu();
  static std::mutex mu;
  static std::map<uint8_t*, std::weak_ptr<PoolRegistration>>* live =
      new std::map<uint8_t*, std::weak_ptr<PoolRegistration>>();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = live->find(base); it != live->end()) {
    if (auto r = it->second.lock(); r && r->size_ == size) return r;
  }
  auto r = std::shared_ptr<PoolRegistration>(new PoolRegistration(base, size));
  if (absl::Status s = r->Register(); !s.ok()) return s;
  (*live)[base] = r;
  return r;
}

PoolRegistration::~PoolRegistration() {
  for (const Piece& p : pieces_) {
    if (p.ours) (void)cudaHostUnregister(p.host);
  }
  (void)cudaGetLastError();
}

absl::Status PoolRegistration::Register() {
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
          size_, static_cast<void*>(base_), at, p.len, cuda::CudaError(e)));
    }
    void* gpu = nullptr;
    e = cudaHostGetDevicePointer(&gpu, p.host, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (p.ours) (void)cudaHostUnregister(p.host);
      return absl::FailedPreconditionError(
          absl::StrCat("the registered pool has no device address: ", cuda::CudaError(e)));
    }
    p.gpu = static_cast<uint8_t*>(gpu);
    pieces_.push_back(p);
  }
  took_ = absl::Now() - start;
  return absl::OkStatus();
}

}  // namespace cxlrt::gpu
