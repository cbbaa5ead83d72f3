// The knobs of the gpu/ layer's CUDA DMA engine (cuda/dma_engine.cc),
// declared in a file that the build without CUDA compiles too, so that
// every build lists them (`cxlrt doctor`, the README) and checks their
// values at open. Thread-safe (cxlrt/runtime/knobs.h).
#pragma once

#include <string>

#include "cxlrt/runtime/knobs.h"

namespace cxlrt::gpu {

extern const runtime::Knob<std::string> kCudaKvCopy;  // CXLRT_CUDA_KV_COPY: engine or kernel

}  // namespace cxlrt::gpu
