#include "cxlrt/gpu/gpu_knobs.h"

namespace cxlrt::gpu {

const runtime::Knob<std::string> kCudaKvCopy(
    {"CXLRT_CUDA_KV_COPY", "engine",
     "How KV batches in GPU memory are copied: engine (cudaMemcpyBatchAsync on the copy engine) "
     "or kernel (SMs through the mapped pool); docs/gpu.md."},
    "engine", runtime::OneOf({"engine", "kernel"}));

}  // namespace cxlrt::gpu
