// Whether this process can use a GPU, why not, and what `cxlrt doctor`
// says about the GPUs and the pool's registration with them. The bottom of
// the gpu/ layer (docs/gpu.md): the same header with or without CUDA in the
// build (cxlrt/gpu/no_gpu.cc: no GPU, every call says why).
//
// Fork: the CUDA runtime cannot be used in a child forked after the parent
// initialised it. Nothing in cxlrt/gpu/ initialises it until a function is
// called (GpuAvailable, KindOf, MakeDmaEngine...), so a launcher may fork
// emulated hosts first and let each initialise its own.
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace cxlrt::gpu {

// Whether this process can use a GPU: a build with CUDA, a driver, and at
// least one GPU. Decided once per process.
bool GpuAvailable();
// Why not, when !GpuAvailable() (e.g. "built without CUDA", "no CUDA
// driver (cudaErrorInsufficientDriver)"); empty otherwise.
std::string GpuUnavailableReason();

// What `cxlrt doctor` prints: driver and runtime versions, each GPU (name,
// PCI bus id, NUMA node, memory), and whether a mapping of `bytes` bytes at
// `base` registers (and how long it took); "no device: <why>" when none
// (the words doctor's users and tests read).
std::string DescribeGpus(uint8_t* base, uint64_t bytes);

}  // namespace cxlrt::gpu
