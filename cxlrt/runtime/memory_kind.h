// The kind of memory a caller's pointer refers to: host memory (private,
// page-locked or the pool's mapping) or a GPU's memory. The bottom layer
// names it, as UCX's ucs names its memory types, so that every layer above
// (gpu/, collectives/, kv/) speaks of the same kinds; telling a pointer's
// kind needs the GPU runtime and lives in cxlrt/gpu/memory.h.
//
// Thread-safety: constants only.
#pragma once

#include <cstdint>

namespace cxlrt::runtime {

enum class MemoryKind : uint8_t {
  kHost,  // reachable by the CPU: heap, stack, page-locked, the pool
  kGpu,   // a GPU's memory (cudaMalloc, cudaMallocManaged)
};

inline const char* MemoryKindName(MemoryKind k) { return k == MemoryKind::kGpu ? "GPU" : "host"; }

}  // namespace cxlrt::runtime
