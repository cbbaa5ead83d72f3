// The _cxlrt extension's bindings, one function per subsystem, each in its
// own file; module.cc calls them in this order at import, with the GIL.
// The order is the module's: a signature names a type as Python does only
// when the type was bound before it.
#ifndef CXLRT_PYTHON_CSRC_BINDINGS_H_
#define CXLRT_PYTHON_CSRC_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <string>

namespace cxlrt::python {

// RegisterErrors (errors.h) comes first: every binding raises its classes.

// Pool, Host and PoolBuffer (pool.cc).
void BindPool(pybind11::module_& m);

// DeviceSpan, DlpackMemory, dlpack_view and whether a GPU is usable
// (buffers.cc).
void BindBuffers(pybind11::module_& m);

// Communicator and dtype_size (communicator.cc).
void BindCommunicator(pybind11::module_& m);

// Store and Pins (store.cc).
void BindStore(pybind11::module_& m);

// process_metrics (metrics.cc; Pool.metrics is bound with Pool and defined
// there too).
void BindMetrics(pybind11::module_& m);
struct PyPool;
pybind11::object PoolMetrics(const PyPool& p, const std::string& format);

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_CSRC_BINDINGS_H_
