// cxlrt.Error and its subclasses, and the translation of a StatusError into
// them (errors.h).
#include "python/csrc/errors.h"

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace cxlrt::python {
namespace {

// cxlrt.Error and one subclass per status code, made at import.
PyObject* g_error = nullptr;
PyObject* g_errors[17] = {};

const char* ClassName(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kInvalidArgument:
      return "InvalidArgumentError";
    case absl::StatusCode::kNotFound:
      return "NotFoundError";
    case absl::StatusCode::kAlreadyExists:
      return "AlreadyExistsError";
    case absl::StatusCode::kFailedPrecondition:
      return "FailedPreconditionError";
    case absl::StatusCode::kResourceExhausted:
      return "ResourceExhaustedError";
    case absl::StatusCode::kDeadlineExceeded:
      return "DeadlineExceededError";
    case absl::StatusCode::kAborted:
      return "AbortedError";
    case absl::StatusCode::kDataLoss:
      return "DataLossError";
    default:
      return nullptr;
  }
}

}  // namespace

void RegisterErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "cxlrt.Error",
      "A cxlrt call failed. `code` is the status code's name (e.g. 'NOT_FOUND'), "
      "`message` what was wrong.",
      PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(g_error));
  for (int c = 1; c < 17; ++c) {
    const char* name = ClassName(static_cast<absl::StatusCode>(c));
    if (!name) continue;
    g_errors[c] = PyErr_NewException(absl::StrCat("cxlrt.", name).c_str(), g_error, nullptr);
    m.add_object(name, py::handle(g_errors[c]));
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const int c = static_cast<int>(e.status.code());
      PyObject* cls = c > 0 && c < 17 && g_errors[c] ? g_errors[c] : g_error;
      py::object exc = py::reinterpret_borrow<py::object>(cls)(std::string(e.status.message()));
      exc.attr("code") = absl::StatusCodeToString(e.status.code());
      exc.attr("message") = std::string(e.status.message());
      PyErr_SetObject(cls, exc.ptr());
    }
  });
}

py::object StatusToPy(const absl::Status& s) {
  if (s.ok()) return py::none();
  const int c = static_cast<int>(s.code());
  PyObject* cls = c > 0 && c < 17 && g_errors[c] ? g_errors[c] : g_error;
  py::object exc = py::reinterpret_borrow<py::object>(cls)(std::string(s.message()));
  exc.attr("code") = absl::StatusCodeToString(s.code());
  exc.attr("message") = std::string(s.message());
  return exc;
}

}  // namespace cxlrt::python
