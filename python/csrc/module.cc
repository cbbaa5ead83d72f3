// The `cxlrt._cxlrt` extension: pools, hosts, pool-resident buffers,
// communicators and the KV store, bound with pybind11, one file per
// subsystem (bindings.h), as Mooncake's and PyTorch's c10d bindings are
// split. python/cxlrt/ wraps it in the Python API (docs/python.md); the
// bindings convert types, raise a cxlrt.Error subclass for every non-OK
// status (errors.h), and release the GIL around every call that may block
// (waits on peers, pool locks, copies). Lifetimes and threads: lifetimes.h
// (docs/python.md, "Lifetimes"); every buffer is checked against the call
// before anything is copied (buffers.h).
#include <pybind11/pybind11.h>

#include "python/csrc/bindings.h"
#include "python/csrc/errors.h"

PYBIND11_MODULE(_cxlrt, m) {
  m.doc() = "cxlrt's C++ runtime, bound for Python (use the `cxlrt` package).";
  cxlrt::python::RegisterErrors(m);
  cxlrt::python::BindPool(m);
  cxlrt::python::BindBuffers(m);
  cxlrt::python::BindCommunicator(m);
  cxlrt::python::BindStore(m);
  cxlrt::python::BindMetrics(m);
}
