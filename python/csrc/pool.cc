// Bindings of pools, hosts and pool buffers (pool.h): Pool, Host and
// PoolBuffer, whose buffer protocol is installed by hand.
#include "python/csrc/pool.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxlrt/runtime/coherence.h"
#include "python/csrc/bindings.h"

namespace cxlrt::python {

void BindPool(py::module_& m) {
  py::class_<PyPool, std::shared_ptr<PyPool>>(m, "Pool", "A CXL (or emulated) memory pool, mapped.")
      .def_static(
          "create",
          [](const std::string& uri) {
            py::gil_scoped_release nogil;
            return std::make_shared<PyPool>(PyPool{Value(runtime::Pool::Create(uri))});
          },
          py::arg("uri"), "Creates the pool `uri` names (AlreadyExistsError when it exists).")
      .def_static(
          "open",
          [](const std::string& uri) {
            py::gil_scoped_release nogil;
            return std::make_shared<PyPool>(PyPool{Value(runtime::Pool::Open(uri))});
          },
          py::arg("uri"), "Maps an existing pool.")
      .def_static(
          "destroy",
          [](const std::string& uri, bool force) {
            py::gil_scoped_release nogil;
            Check(runtime::Pool::Destroy(uri, {.force = force}));
          },
          py::arg("uri"), py::arg("force") = false,
          "Removes the pool's backing (FailedPreconditionError while hosts are attached, "
          "unless force).")
      .def_property_readonly("size", [](const PyPool& p) { return p.pool->size(); })
      .def_property_readonly("uri", [](const PyPool& p) { return p.pool->uri().ForOpeners(); })
      .def_property_readonly("coherence",
                             [](const PyPool& p) {
                               return std::string(runtime::CoherenceDomainName(p.pool->domain()));
                             })
      .def(
          "check",
          [](const PyPool& p) {
            std::vector<std::string> problems;
            absl::Status s;
            {
              py::gil_scoped_release nogil;
              s = p.pool->Check(&problems);
            }
            if (!s.ok() && problems.empty()) problems.push_back(std::string(s.message()));
            return problems;
          },
          "Audits the pool's metadata; returns the problems found (empty: none).")
      .def("metrics", &PoolMetrics, py::arg("format") = "dict",
           "The whole pool's metrics, as every host published them, with the pool's gauges "
           "(hosts, heartbeat ages, lease margins): a dict {'hosts': [...], 'samples': [...]}, "
           "or the Prometheus text with format='text'. The first call watches the host table "
           "for two heartbeat periods (docs/metrics.md).");

  py::class_<PyHost, std::shared_ptr<PyHost>>(m, "Host",
                                              "This process attached to a pool as a host.")
      .def(py::init<std::shared_ptr<PyPool>, std::optional<uint32_t>, std::optional<int>>(),
           py::arg("pool"), py::arg("slot") = py::none(), py::arg("host_id") = py::none())
      .def("close", &PyHost::Close,
           "Closes the host: it detaches once nothing made from it (stores, communicators, "
           "pool buffers and their views) is left.")
      .def_property_readonly("closed", &PyHost::closed)
      .def_property_readonly("slot", [](const PyHost& h) { return h.State()->membership->slot(); })
      .def(
          "allocate",
          [](const PyHost& h, size_t bytes, size_t alignment) {
            std::shared_ptr<HostState> st = h.State();
            absl::StatusOr<runtime::PoolOffset> off;
            {
              py::gil_scoped_release nogil;
              off = st->alloc->Allocate(std::max<size_t>(bytes, 1), {.alignment = alignment});
            }
            return std::make_shared<PyBuffer>(std::move(st), Value(off), bytes);
          },
          py::arg("nbytes"), py::arg("alignment") = 64, "A block of the pool (PoolBuffer).");

  auto pool_buffer =
      py::class_<PyBuffer, std::shared_ptr<PyBuffer>>(
          m, "PoolBuffer", py::buffer_protocol(), "Pool memory, readable and writable in place.")
          .def_property_readonly("freed", &PyBuffer::freed)
          .def_property_readonly("nbytes", &PyBuffer::size)
          .def_property_readonly("offset", &PyBuffer::offset, "Offset in the pool.")
          .def("free", &PyBuffer::Free,
               "Returns the block (FailedPreconditionError while views of it are exported).");
  // The buffer protocol by hand, not def_buffer: free() must know whether
  // views are exported, which only bf_releasebuffer can tell.
  PyTypeObject* pool_buffer_type = reinterpret_cast<PyTypeObject*>(pool_buffer.ptr());
  pool_buffer_type->tp_as_buffer->bf_getbuffer = &PyBuffer::GetBuffer;
  pool_buffer_type->tp_as_buffer->bf_releasebuffer = &PyBuffer::ReleaseBuffer;
}

}  // namespace cxlrt::python
