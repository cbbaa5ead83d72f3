// Errors of the _cxlrt bindings: a non-OK absl::Status travels to Python as
// a StatusError, which the translator RegisterErrors installs raises as the
// cxlrt.Error subclass of its code (errors.cc). Made at import, with the
// GIL; Check and Value may be called from any thread.
#ifndef CXLRT_PYTHON_CSRC_ERRORS_H_
#define CXLRT_PYTHON_CSRC_ERRORS_H_

#include <pybind11/pybind11.h>

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

// Adds cxlrt.Error and one subclass per status code to `m`, and the
// translator that raises a StatusError as its code's class.
void RegisterErrors(pybind11::module_& m);

// The exception a batch call returns for a non-OK item (None for OK): the
// class and attributes the translator would raise. REQUIRES: the GIL, and
// RegisterErrors called.
pybind11::object StatusToPy(const absl::Status& s);

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_CSRC_ERRORS_H_
