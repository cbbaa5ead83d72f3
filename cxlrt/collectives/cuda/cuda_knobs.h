// The knobs of the collectives' GPU copy engine (cuda/gpu_engine.cc), declared in a file that
// the build without CUDA compiles too, so that every build lists them
// (`cxlrt doctor`, the README) and checks their values at open.
// Thread-safe (cxlrt/runtime/knobs.h).
#pragma once

#include <string>

#include "cxlrt/runtime/knobs.h"

namespace cxlrt::collectives {

extern const runtime::Knob<std::string> kCudaReduce;    // CXLRT_CUDA_REDUCE: staged or mapped
extern const runtime::Knob<std::string> kCudaDoorbell;  // CXLRT_CUDA_DOORBELL: host or copy

}  // namespace cxlrt::collectives
