// The torch backend's tensor helpers: cxlrt's element type and reduction of
// a tensor and a ReduceOp, the checks every tensor passes, and the stream
// a CUDA call is ordered on. Stateless: any thread.
#ifndef CXLRT_PYTHON_CSRC_TORCH_BACKEND_TENSORS_H_
#define CXLRT_PYTHON_CSRC_TORCH_BACKEND_TENSORS_H_

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/types.h"

namespace cxlrt::torch_backend {

using collectives::DataType;
using collectives::RedOp;

[[noreturn]] inline void Raise(const absl::Status& s) {
  throw std::runtime_error(absl::StrCat("cxlrt: ", s.ToString()));
}

inline DataType TypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUint8;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBfloat16;
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    default:
      throw std::invalid_argument(
          absl::StrCat("cxlrt: no element type for ", c10::toString(t.scalar_type())));
  }
}

inline RedOp OpOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return RedOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return RedOp::kProd;
    case c10d::ReduceOp::MIN:
      return RedOp::kMin;
    case c10d::ReduceOp::MAX:
      return RedOp::kMax;
    case c10d::ReduceOp::AVG:
      return RedOp::kAvg;
    default:
      throw std::invalid_argument("cxlrt: reductions are sum, product, min, max and avg");
  }
}

inline void CheckTensor(const at::Tensor& t) {
  if (t.layout() != at::kStrided) {
    throw std::invalid_argument(absl::StrCat(
        "cxlrt: a ", c10::toString(t.layout()),
        " tensor: cxlrt moves dense (strided) tensors; all_reduce (sum) takes sparse COO ones"));
  }
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw std::invalid_argument(
        absl::StrCat("cxlrt: a ", t.device().str(), " tensor: cxlrt moves CPU and CUDA tensors"));
  }
  if (!t.is_contiguous()) throw std::invalid_argument("cxlrt: the tensor is not contiguous");
}

// The current stream of a CUDA tensor's device; nullopt for CPU tensors.
inline std::optional<c10::Stream> StreamOf(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty() || !tensors[0].device().is_cuda()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(tensors[0].device());
}

}  // namespace cxlrt::torch_backend

#endif  // CXLRT_PYTHON_CSRC_TORCH_BACKEND_TENSORS_H_
