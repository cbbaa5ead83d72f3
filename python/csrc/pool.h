// Pools, hosts and pool buffers of the _cxlrt bindings: a mapped pool
// (PyPool), this process attached to it as a host (PyHost) and the state
// every object made from the host shares (HostState), and blocks of the
// pool exported through the buffer protocol (PyBuffer). Lifetimes:
// lifetimes.h. The GIL guards each object's Python-facing state; HostState
// is dropped without it.
#ifndef CXLRT_PYTHON_CSRC_POOL_H_
#define CXLRT_PYTHON_CSRC_POOL_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/metrics/http_exporter.h"
#include "cxlrt/metrics/pool_metrics.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "python/csrc/errors.h"

namespace cxlrt::python {

namespace py = pybind11;

// The reader of a pool's metrics (Pool.metrics), kept between calls so
// that heartbeat ages are measured across them.
struct PoolMetricsState {
  std::mutex mu;
  std::unique_ptr<metrics::PoolMetricsReader> reader;  // guarded by mu; made on first use
};

// A pool this process has mapped.
struct PyPool {
  std::unique_ptr<runtime::Pool> pool;
  std::shared_ptr<PoolMetricsState> metrics = std::make_shared<PoolMetricsState>();
};

// What a host's objects use: the pool mapping, the membership and the
// allocator, shared by the Host and everything made from it. Detached (in
// reverse order) when the last owner goes. Never touches Python: it may be
// dropped without the GIL.
struct HostState {
  std::shared_ptr<PyPool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
  // Publishes this process's metrics into the pool (docs/metrics.md).
  std::unique_ptr<metrics::MetricsPublisher> publisher;
  ~HostState() {
    publisher.reset();
    alloc.reset();
    membership.reset();
  }
  uint8_t* base() const { return pool->pool->backend().base(); }
};

// This process attached to a pool as a host. close() drops the Host's
// share of the state: it detaches at once when nothing made from the host
// is left, else when the last of those goes.
class PyHost {
 public:
  PyHost(std::shared_ptr<PyPool> pool, std::optional<uint32_t> slot, std::optional<int> host_id) {
    auto state = std::make_shared<HostState>();
    state->pool = std::move(pool);
    runtime::AttachOptions o;
    o.slot = slot;
    o.host_id = host_id;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      auto m = runtime::Membership::Attach(*state->pool->pool, o);
      if (m.ok()) {
        state->membership = *std::move(m);
        auto a = allocator::Allocator::Open(*state->pool->pool, *state->membership);
        if (a.ok()) {
          state->alloc = *std::move(a);
          state->publisher = std::make_unique<metrics::MetricsPublisher>(
              *state->pool->pool, *state->membership, *state->alloc);
          if (absl::Status served = metrics::ServeProcessMetricsFromEnvironment(); !served.ok()) {
            CXLRT_LOG(kError) << "not serving this process's metrics: " << served;
          }
        } else {
          s = a.status();
        }
      } else {
        s = m.status();
      }
      if (!s.ok()) state.reset();
    }
    Check(s);
    state_ = std::move(state);
  }
  ~PyHost() { Close(); }
  void Close() {
    std::shared_ptr<HostState> state = std::move(state_);
    if (!state) return;
    py::gil_scoped_release nogil;
    state.reset();
  }
  bool closed() const { return !state_; }
  // A share of the state, for a call or a new object (the GIL serialises
  // this with Close).
  std::shared_ptr<HostState> State() const {
    if (!state_) throw StatusError{absl::FailedPreconditionError("the host is closed")};
    return state_;
  }

 private:
  std::shared_ptr<HostState> state_;
};

// A block of the pool this process may read and write through the buffer
// protocol (numpy.frombuffer, torch.frombuffer: no copy). It owns the
// block: free() returns it, and so does the PoolBuffer's end (the object
// and every view of it gone). free() refuses while views are exported, as
// a bytearray refuses to resize.
class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<HostState> host, runtime::PoolOffset offset, size_t size)
      : host_(std::move(host)), data_(host_->base() + offset), size_(size), offset_(offset) {}
  ~PyBuffer() {
    py::gil_scoped_release nogil;
    if (data_) (void)host_->alloc->Free(offset_);
    host_.reset();
  }
  size_t size() const { return size_; }
  bool freed() const { return data_ == nullptr; }
  runtime::PoolOffset offset() const { return offset_; }
  void Free() {
    if (!data_) return;
    if (exports_ > 0) {
      throw StatusError{absl::FailedPreconditionError(absl::StrCat(
          "the buffer at offset ", offset_, " has ", exports_, exports_ == 1 ? " view" : " views",
          " (numpy arrays, memoryviews) still using its memory: release them before free()"))};
    }
    data_ = nullptr;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = host_->alloc->Free(offset_);
      host_.reset();
    }
    Check(s);
  }

  // The buffer protocol (the type's bf_getbuffer / bf_releasebuffer), with
  // the GIL: a freed block exposes no bytes; exports are counted for free().
  static int GetBuffer(PyObject* self, Py_buffer* view, int flags) {
    PyBuffer* b = Of(self);
    if (!b) {
      view->obj = nullptr;
      PyErr_SetString(PyExc_BufferError, "not a PoolBuffer");
      return -1;
    }
    static uint8_t empty[1];
    if (PyBuffer_FillInfo(view, self, b->data_ ? b->data_ : empty, b->data_ ? b->size_ : 0,
                          /*readonly=*/0, flags) != 0) {
      return -1;
    }
    ++b->exports_;
    return 0;
  }
  static void ReleaseBuffer(PyObject* self, Py_buffer*) {
    if (PyBuffer* b = Of(self)) --b->exports_;
  }

 private:
  static PyBuffer* Of(PyObject* self) {
    try {
      return py::handle(self).cast<PyBuffer*>();
    } catch (...) {
      return nullptr;
    }
  }

  std::shared_ptr<HostState> host_;
  uint8_t* data_;
  size_t size_;
  runtime::PoolOffset offset_;
  int exports_ = 0;  // views exported now (the GIL guards it)
};

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_CSRC_POOL_H_
