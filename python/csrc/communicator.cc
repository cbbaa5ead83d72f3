// Bindings of communicators: Communicator (every collective and point to
// point call, each buffer checked before anything is copied; buffers.h)
// and dtype_size.
#include "cxlrt/collectives/communicator.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "python/csrc/bindings.h"
#include "python/csrc/buffers.h"
#include "python/csrc/errors.h"
#include "python/csrc/lifetimes.h"
#include "python/csrc/pool.h"

namespace cxlrt::python {
namespace {

// A communicator and the host state it uses. Calls are serialised (the C++
// Communicator is used by one thread at a time); destroy() waits for the
// call in flight and those queued, and later calls raise.
class PyComm {
 public:
  PyComm(PyHost& host, const std::string& name, int nranks, int rank, double timeout_s,
         uint64_t slot_bytes, uint32_t depth)
      : host_(host.State()) {
    collectives::CommOptions o;
    if (timeout_s > 0) o.timeout = absl::Seconds(timeout_s);
    if (slot_bytes > 0) o.slot_bytes = slot_bytes;  // 0: the knob
    if (depth > 0) o.depth = depth;
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> c;
    {
      py::gil_scoped_release nogil;
      c = collectives::Communicator::Create(*host_->alloc, name, nranks, rank, o);
    }
    comm_ = Value(std::move(c));
    rank_ = comm_->rank();
    size_ = comm_->size();
  }
  ~PyComm() {
    try {
      Destroy();
    } catch (...) {  // a failed barrier on the way out: nothing to tell
    }
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<HostState>& host() const { return host_; }
  Gate::Pass Enter() { return gate_.Enter("the communicator was destroyed"); }

  void Destroy() {
    if (!gate_.Close()) return;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = comm_->Destroy();
      comm_.reset();
      host_.reset();
    }
    Check(s);
  }
  // Marks the communicator aborted for every rank. After the call in flight
  // on another thread, if any: the C++ Communicator is used by one thread
  // at a time, and cannot yet be interrupted from another (ncclCommAbort's
  // role; the review of issue 25 found a data race on its failure state).
  void Abort(const std::string& why) {
    Gate::Pass pass = Enter();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(run_mu_);
    comm_->Abort(why);
  }

  // Runs `fn` on the communicator without the GIL, after the calls before.
  template <typename Fn>
  void Run(Fn&& fn) {
    Gate::Pass pass = Enter();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(run_mu_);
      s = fn(*comm_);
    }
    Check(s);
  }

  // A collective or point-to-point call: x and out held for its length,
  // checked (CheckBuffer) before anything is copied, then fn(comm, x, out,
  // type) run. `out` may be null (send, recv); root < 0: none.
  template <typename Fn>
  void Collective(Call call, py::handle x, const std::string& x_dtype, py::handle out,
                  const std::string& out_dtype, size_t count, const std::string& dtype, int root,
                  Fn&& fn) {
    const char* name = NameOf(call);
    const collectives::DataType type = TypeOf(dtype);
    std::optional<Held> hx, hout;
    hx.emplace(x, call == Call::kRecv, name, "x");
    if (out) hout.emplace(out, true, name, "out");
    if (HasRoot(call) && (root < 0 || root >= size_)) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat(name, ": root ", root, " is not a rank of ", size_))};
    }
    const Uses uses = UsesOf(call, size_, HasRoot(call) && root == rank_);
    CheckBuffer(name, "x", *hx, call == Call::kRecv, uses.x, count, dtype, x_dtype);
    if (hout) CheckBuffer(name, "out", *hout, true, uses.out, count, dtype, out_dtype);
    if (hout && uses.x > 0 && uses.out > 0) CheckOverlap(name, *hx, *hout, rank_);
    void* xp = hx->data();
    void* op = hout ? hout->data() : nullptr;
    Run([&](collectives::Communicator& comm) { return fn(comm, xp, op, type); });
  }

 private:
  std::shared_ptr<HostState> host_;  // declared first: destroyed after comm_
  std::unique_ptr<collectives::Communicator> comm_;
  int rank_ = 0, size_ = 0;
  Gate gate_;
  std::mutex run_mu_;
};

}  // namespace

void BindCommunicator(py::module_& m) {
  const auto stream_of = [](uint64_t s) { return reinterpret_cast<void*>(s); };
  py::class_<PyComm, std::shared_ptr<PyComm>>(m, "Communicator")
      .def(py::init<PyHost&, std::string, int, int, double, uint64_t, uint32_t>(), py::arg("host"),
           py::arg("name"), py::arg("nranks") = -1, py::arg("rank") = -1, py::arg("timeout") = 0.0,
           py::arg("slot_bytes") = 0, py::arg("depth") = 0)
      .def_property_readonly("rank", &PyComm::rank)
      .def_property_readonly("size", &PyComm::size)
      .def("destroy", &PyComm::Destroy)
      .def("abort", &PyComm::Abort, py::arg("why") = "aborted by the application")
      .def(
          "allocate",
          [](PyComm& c, size_t bytes) {
            // A block of the host's allocator, as Communicator::Allocate
            // makes (collectives read any pool buffer in place), owned by
            // the PoolBuffer: destroy() cannot free it under a view.
            Gate::Pass pass = c.Enter();
            std::shared_ptr<HostState> st = c.host();
            absl::StatusOr<runtime::PoolOffset> off;
            {
              py::gil_scoped_release nogil;
              off = st->alloc->Allocate(std::max<size_t>(bytes, 1), {.alignment = 4096});
            }
            return std::make_shared<PyBuffer>(std::move(st), Value(off), bytes);
          },
          py::arg("nbytes"))
      // Buffers: x (send) and out (recv); x_dtype and out_dtype are their
      // own element types (empty: untyped), which must be the call's.
      .def(
          "all_reduce",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              const std::string& op, uint64_t stream, const std::string& x_dtype,
              const std::string& out_dtype) {
            const auto o = OpOf(op);
            c.Collective(Call::kAllReduce, x, x_dtype, out, out_dtype, count, dtype, -1,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.AllReduce(s, r, count, t, o, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream") = 0, py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "reduce_scatter",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              const std::string& op, uint64_t stream, const std::string& x_dtype,
              const std::string& out_dtype) {
            const auto o = OpOf(op);
            c.Collective(Call::kReduceScatter, x, x_dtype, out, out_dtype, count, dtype, -1,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.ReduceScatter(s, r, count, t, o, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream") = 0, py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "all_gather",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              uint64_t stream, const std::string& x_dtype, const std::string& out_dtype) {
            c.Collective(Call::kAllGather, x, x_dtype, out, out_dtype, count, dtype, -1,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.AllGather(s, r, count, t, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0,
          py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "broadcast",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              int root, uint64_t stream, const std::string& x_dtype, const std::string& out_dtype) {
            c.Collective(Call::kBroadcast, x, x_dtype, out, out_dtype, count, dtype, root,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.Broadcast(s, r, count, t, root, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream") = 0, py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "reduce",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              const std::string& op, int root, uint64_t stream, const std::string& x_dtype,
              const std::string& out_dtype) {
            const auto o = OpOf(op);
            c.Collective(Call::kReduce, x, x_dtype, out, out_dtype, count, dtype, root,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.Reduce(s, r, count, t, o, root, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("root"), py::arg("stream") = 0, py::arg("x_dtype") = "",
          py::arg("out_dtype") = "")
      .def(
          "gather",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              int root, uint64_t stream, const std::string& x_dtype, const std::string& out_dtype) {
            c.Collective(Call::kGather, x, x_dtype, out, out_dtype, count, dtype, root,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.Gather(s, r, count, t, root, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream") = 0, py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "scatter",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              int root, uint64_t stream, const std::string& x_dtype, const std::string& out_dtype) {
            c.Collective(Call::kScatter, x, x_dtype, out, out_dtype, count, dtype, root,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.Scatter(s, r, count, t, root, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream") = 0, py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def(
          "all_to_all",
          [=](PyComm& c, py::object x, py::object out, size_t count, const std::string& dtype,
              uint64_t stream, const std::string& x_dtype, const std::string& out_dtype) {
            c.Collective(Call::kAllToAll, x, x_dtype, out, out_dtype, count, dtype, -1,
                         [&](collectives::Communicator& comm, void* s, void* r, auto t) {
                           return comm.AllToAll(s, r, count, t, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0,
          py::arg("x_dtype") = "", py::arg("out_dtype") = "")
      .def("barrier", [](PyComm& c) { c.Run([](auto& comm) { return comm.Barrier(); }); })
      .def(
          "send",
          [=](PyComm& c, py::object x, size_t count, const std::string& dtype, int peer,
              uint64_t stream, const std::string& x_dtype) {
            c.Collective(Call::kSend, x, x_dtype, py::handle(), "", count, dtype, -1,
                         [&](collectives::Communicator& comm, void* s, void*, auto t) {
                           return comm.Send(s, count, t, peer, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0,
          py::arg("x_dtype") = "")
      .def(
          "recv",
          [=](PyComm& c, py::object x, size_t count, const std::string& dtype, int peer,
              uint64_t stream, const std::string& x_dtype) {
            c.Collective(Call::kRecv, x, x_dtype, py::handle(), "", count, dtype, -1,
                         [&](collectives::Communicator& comm, void* r, void*, auto t) {
                           return comm.Recv(r, count, t, peer, stream_of(stream));
                         });
          },
          py::arg("x"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0,
          py::arg("x_dtype") = "");

  m.def(
      "dtype_size", [](const std::string& dtype) { return collectives::SizeOf(TypeOf(dtype)); },
      py::arg("dtype"));
}

}  // namespace cxlrt::python
