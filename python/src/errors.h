// Errors of the _cxlrt bindings: a non-OK absl::Status travels to Python as
// a StatusError, which module.cc's translator raises as the cxlrt.Error
// subclass of its code.
#ifndef CXLRT_PYTHON_SRC_ERRORS_H_
#define CXLRT_PYTHON_SRC_ERRORS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cxlrt::python {

// A non-OK status on its way to Python.
struct StatusError {
  absl::Status status;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}
template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError{v.status()};
  return *std::move(v);
}

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_SRC_ERRORS_H_
