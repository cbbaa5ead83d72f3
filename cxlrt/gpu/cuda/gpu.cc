// The CUDA implementation of cxlrt/gpu/gpu.h and cxlrt/gpu/memory.h:
// whether a GPU is usable, the kind of a pointer, what doctor prints, GPU
// and page-locked memory, copies and streams; and the helpers of
// cxlrt/gpu/cuda/driver.h.
#include "cxlrt/gpu/gpu.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlrt/gpu/cuda/driver.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/gpu/registration.h"

namespace cxlrt::gpu {
namespace {

using cuda::CudaError;
using cuda::Failed;
using cuda::NoGpu;
using cuda::StreamValue64Fn;

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

StreamValue64Fn DriverCall(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const bool found =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess;
  (void)cudaGetLastError();
  return found ? reinterpret_cast<StreamValue64Fn>(fn) : nullptr;
}

}  // namespace

namespace cuda {

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

absl::Status NoGpu() { return absl::UnavailableError(absl::StrCat("no GPU: ", Probe().reason)); }

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

bool GpuAvailable() { return Probe().available; }
std::string GpuUnavailableReason() { return Probe().reason; }

runtime::MemoryKind KindOf(const void* p) {
  using runtime::MemoryKind;
  if (p == nullptr || !GpuAvailable()) return MemoryKind::kHost;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return MemoryKind::kHost;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? MemoryKind::kGpu
                                                                           : MemoryKind::kHost;
}

std::string DescribeGpus(uint8_t* base, uint64_t bytes) {
  if (!GpuAvailable()) return absl::StrCat("no device: ", GpuUnavailableReason());
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
    auto reg = PoolRegistration::Get(base, bytes);
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

absl::StatusOr<void*> GpuAlloc(size_t bytes) {
  if (!GpuAvailable()) return NoGpu();
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes: ", CudaError(e)));
  }
  return p;
}
void GpuFree(void* p) {
  if (p) (void)cudaFree(p);
}

absl::StatusOr<void*> PageLockedAlloc(size_t bytes) {
  if (!GpuAvailable()) return NoGpu();
  void* p = nullptr;
  if (cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMallocHost of ", bytes, " bytes: ", CudaError(e)));
  }
  return p;
}
void PageLockedFree(void* p) {
  if (p) (void)cudaFreeHost(p);
}

absl::Status CopySync(void* dst, const void* src, size_t n) {
  if (!GpuAvailable()) return NoGpu();
  if (cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Failed("cudaMemcpy", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> StreamCreate() {
  if (!GpuAvailable()) return NoGpu();
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
  if (!GpuAvailable()) return NoGpu();
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return Failed("cudaStreamSynchronize", e);
  }
  return absl::OkStatus();
}

absl::Status CopyAsync(void* dst, const void* src, size_t n, void* stream) {
  if (!GpuAvailable()) return NoGpu();
  if (cudaError_t e =
          cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    return Failed("cudaMemcpyAsync", e);
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::gpu
