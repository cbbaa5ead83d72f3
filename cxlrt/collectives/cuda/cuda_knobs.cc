#include "cxlrt/collectives/cuda/cuda_knobs.h"

namespace cxlrt::collectives {

const runtime::Knob<std::string> kCudaReduce(
    {"CXLRT_CUDA_REDUCE", "staged",
     "How GPU reductions read peers' chunks: staged (the copy engine moves them into device "
     "memory first) or mapped (the kernel reads the registered pool); docs/gpu.md."},
    "staged", runtime::OneOf({"staged", "mapped"}));
const runtime::Knob<std::string> kCudaDoorbell(
    {"CXLRT_CUDA_DOORBELL", "host",
     "Who writes a GPU rank's post lines and flags: host (the CPU, once the copies behind them "
     "completed) or copy (the copy engine, queued behind the copies); docs/gpu.md."},
    "host", runtime::OneOf({"host", "copy"}));

}  // namespace cxlrt::collectives
