// The `cxlrt._cxlrt` extension: pools, hosts, pool-resident buffers,
// communicators and the KV store, bound with pybind11. python/cxlrt/ wraps
// it in the Python API (docs/python.md); this file converts types, raises
// a cxlrt.Error subclass for every non-OK status, and releases the GIL
// around every call that may block (waits on peers, pool locks, copies).
// Lifetimes and threads: "Lifetimes" below (docs/python.md); every buffer
// is checked against the call before anything is copied.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "python/src/buffers.h"
#include "python/src/errors.h"

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

// --- Lifetimes ---
//
// The rules (docs/python.md, "Lifetimes"): an object made from a Host
// (Store, Communicator, PoolBuffer) shares the host's state, so the
// allocator and membership go when the last of them does, never under a
// call or a destructor; Store.close() and Communicator.destroy() wait for
// the calls in flight on other threads (the GIL released) and refuse the
// calls that start after them; a PoolBuffer is not freed while a view of
// it is exported; every buffer argument is held (its export) until the
// GIL-free work on it has finished.

// Calls in flight on an object that close() ends. Close() refuses later
// calls and waits for those in flight, without the GIL. Its wait has no
// deadline of its own: each call it waits for has one (the communicator's
// timeout, the store's lock and copy bounds).
class Gate {
 public:
  // One admitted call; it leaves when destroyed.
  class Pass {
   public:
    explicit Pass(Gate* gate) : gate_(gate) {}
    Pass(Pass&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (gate_) gate_->Leave();
    }

   private:
    Gate* gate_;
  };

  // Admits a call; FailedPreconditionError `closed` once Close() began.
  Pass Enter(const char* closed) {
    std::optional<Pass> p = TryEnter();
    if (!p) throw StatusError{absl::FailedPreconditionError(closed)};
    return *std::move(p);
  }
  std::optional<Pass> TryEnter() {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return std::nullopt;
    ++calls_;
    return Pass(this);
  }
  // Refuses new calls and waits for those in flight. False when it was
  // closed before. REQUIRES: the GIL (released while waiting).
  bool Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return false;
      closed_ = true;
      if (calls_ == 0) return true;
    }
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return calls_ == 0; });
    return true;
  }

 private:
  void Leave() {
    std::lock_guard<std::mutex> l(mu_);
    if (--calls_ == 0) cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  bool closed_ = false;
};

// --- Pools and hosts ---

// A pool this process has mapped.
struct PyPool {
  std::unique_ptr<runtime::Pool> pool;
};

// What a host's objects use: the pool mapping, the membership and the
// allocator, shared by the Host and everything made from it. Detached (in
// reverse order) when the last owner goes. Never touches Python: it may be
// dropped without the GIL.
struct HostState {
  std::shared_ptr<PyPool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
  ~HostState() {
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

// --- Communicators ---

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

// --- KV store ---

// The store and the host state it uses. Any number of threads may call
// it; close() waits for the calls in flight, and later calls raise.
class PyStore {
 public:
  PyStore(PyHost& host, bool create, uint32_t entries_per_host, uint32_t pins_per_host,
          uint32_t max_namespaces)
      : host_(host.State()) {
    kv::StoreOptions o;
    o.create = create;
    if (entries_per_host) o.entries_per_host = entries_per_host;
    if (pins_per_host) o.pins_per_host = pins_per_host;
    if (max_namespaces) o.max_namespaces = max_namespaces;
    absl::StatusOr<std::unique_ptr<kv::Store>> s;
    {
      py::gil_scoped_release nogil;
      s = kv::Store::Open(*host_->alloc, o);
    }
    store_ = Value(std::move(s));
  }
  ~PyStore() { Close(); }
  Gate::Pass Enter() { return gate_.Enter("the store is closed"); }
  std::optional<Gate::Pass> TryEnter() { return gate_.TryEnter(); }
  kv::Store& s() { return *store_; }  // REQUIRES: a Pass
  void Close() {
    if (!gate_.Close()) return;
    py::gil_scoped_release nogil;
    store_.reset();
    host_.reset();
  }

 private:
  std::shared_ptr<HostState> host_;  // declared first: destroyed after store_
  std::unique_ptr<kv::Store> store_;
  Gate gate_;
};

// Pins from Store.lookup, released by release() or on garbage collection;
// closing the store released them already.
struct PyPins {
  std::shared_ptr<PyStore> store;
  kv::PinSet pins;
  size_t length = 0;
  void Release() {  // REQUIRES: the GIL
    if (!store || pins.empty()) return;
    std::optional<Gate::Pass> pass = store->TryEnter();
    if (!pass) {
      pins = kv::PinSet();
      return;
    }
    py::gil_scoped_release nogil;
    store->s().Release(pins);
  }
  ~PyPins() { Release(); }
};

// `o` as a list or tuple (PySequence_Fast), or TypeError naming `what`.
py::sequence Sequence(const py::object& o, const char* what) {
  PyObject* seq = PySequence_Fast(o.ptr(), what);
  if (!seq) throw py::error_already_set();
  return py::reinterpret_steal<py::sequence>(seq);
}

// The buffers and keys of a batch call, borrowed from the caller's
// sequences for the length of the call (no copies, each buffer held as
// Held says): keys are bytes or str, values buffers (contiguous) or
// DeviceSpans.
class BatchArgs {
 public:
  BatchArgs(const char* call, const py::sequence& keys, const py::sequence& bufs, bool writable) {
    const size_t n = keys.size();
    if (bufs.size() != n) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat(call, ": ", n, " keys but ", bufs.size(), " buffers"))};
    }
    keys_ = keys;
    bufs_ = bufs;
    keyviews_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* k = PySequence_Fast_GET_ITEM(keys_.ptr(), i);
      char* data = nullptr;
      Py_ssize_t len = 0;
      if (PyBytes_Check(k)) {
        PyBytes_AsStringAndSize(k, &data, &len);
      } else if (PyUnicode_Check(k)) {
        data = const_cast<char*>(PyUnicode_AsUTF8AndSize(k, &len));
        if (!data) throw py::error_already_set();
      } else {
        throw StatusError{
            absl::InvalidArgumentError(absl::StrCat(call, ": key ", i, " is not bytes or str"))};
      }
      keyviews_.emplace_back(data, static_cast<size_t>(len));
      held_.emplace_back(PySequence_Fast_GET_ITEM(bufs_.ptr(), i), writable, call,
                         absl::StrCat("buffer ", i));
    }
  }
  size_t size() const { return held_.size(); }
  absl::string_view key(size_t i) const { return keyviews_[i]; }
  void* data(size_t i) const { return held_[i].data(); }
  size_t bytes(size_t i) const { return held_[i].bytes(); }

 private:
  py::object keys_, bufs_;  // PySequence_Fast: lists or tuples, kept alive
  std::deque<Held> held_;   // a deque: Held neither moves nor copies
  std::vector<absl::string_view> keyviews_;
};

py::object StatusToPy(const absl::Status& s) {
  if (s.ok()) return py::none();
  const int c = static_cast<int>(s.code());
  PyObject* cls = c > 0 && c < 17 && g_errors[c] ? g_errors[c] : g_error;
  py::object exc = py::reinterpret_borrow<py::object>(cls)(std::string(s.message()));
  exc.attr("code") = absl::StatusCodeToString(s.code());
  exc.attr("message") = std::string(s.message());
  return exc;
}

// Runs a batch without the GIL; one entry per item: None or the error
// (put), the value's size or the error (get).
py::list RunBatchPut(kv::Store& s, const std::string& ns, const std::vector<kv::PutItem>& items,
                     const kv::BatchOptions& options = {}) {
  std::vector<absl::Status> r;
  {
    py::gil_scoped_release nogil;
    r = s.BatchPut(ns, items, options);
  }
  py::list out(r.size());
  for (size_t i = 0; i < r.size(); ++i) out[i] = StatusToPy(r[i]);
  return out;
}
py::list RunBatchGet(kv::Store& s, const std::string& ns, const std::vector<kv::GetItem>& items,
                     const kv::BatchOptions& options = {}) {
  std::vector<absl::StatusOr<size_t>> r;
  {
    py::gil_scoped_release nogil;
    r = s.BatchGet(ns, items, options);
  }
  py::list out(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    out[i] = r[i].ok() ? py::object(py::int_(*r[i])) : StatusToPy(r[i].status());
  }
  return out;
}

// Batch items from keys and raw (address, size) pairs: `per` consecutive
// pairs per key, the value's parts in order (a get must fill them
// exactly). `parts` keeps the items' parts alive for the call.
template <typename Item, typename Part, typename Ptr>
std::vector<Item> PtrItems(const std::vector<std::string>& keys, const std::vector<uintptr_t>& ptrs,
                           const std::vector<size_t>& sizes, size_t per, std::vector<Part>* parts) {
  if (per == 0 || ptrs.size() != sizes.size() || keys.size() * per != ptrs.size()) {
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys, ", ptrs.size(), " ptrs and ", sizes.size(),
                     " sizes do not make ", per, " (address, size) pairs per key"))};
  }
  std::vector<Item> items(keys.size());
  parts->resize(ptrs.size());
  for (size_t j = 0; j < ptrs.size(); ++j) (*parts)[j] = {reinterpret_cast<Ptr>(ptrs[j]), sizes[j]};
  for (size_t i = 0; i < keys.size(); ++i) {
    items[i] = {keys[i], nullptr, 0, absl::MakeConstSpan(parts->data() + i * per, per)};
  }
  return items;
}

// Paged items (a paged KV cache): item i's value is, for each segment
// (ptr, block_stride, nbytes) in order, the nbytes at ptr + blocks[i] *
// block_stride: PtrItems with a part per segment. A segment is one tensor,
// so its memory kind is asked once, not per page: *memory is set to it,
// for the store to be told (BatchOptions).
template <typename Item, typename Part, typename Ptr>
std::vector<Item> PagedItems(const std::vector<std::string>& keys,
                             const std::vector<uint64_t>& blocks,
                             const std::vector<std::tuple<uintptr_t, uint64_t, size_t>>& segments,
                             std::vector<Part>* parts, std::optional<runtime::MemoryKind>* memory) {
  if (keys.size() != blocks.size()) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        "keys and blocks differ in length (", keys.size(), " and ", blocks.size(), ")"))};
  }
  if (segments.empty()) {
    throw StatusError{absl::InvalidArgumentError("a paged value needs at least one segment")};
  }
  const auto kind_of = [](uintptr_t p) { return gpu::KindOf(reinterpret_cast<void*>(p)); };
  const runtime::MemoryKind kind = kind_of(std::get<0>(segments[0]));
  for (size_t j = 1; j < segments.size(); ++j) {
    if (kind_of(std::get<0>(segments[j])) != kind) {
      throw StatusError{absl::InvalidArgumentError(absl::StrCat(
          "segments 0 and ", j, " are in different kinds of memory (GPU and host); a paged value ",
          "is all in one"))};
    }
  }
  std::vector<uintptr_t> ptrs;
  std::vector<size_t> sizes;
  for (uint64_t block : blocks) {
    for (const auto& [ptr, stride, nbytes] : segments) {
      ptrs.push_back(ptr + block * stride);
      sizes.push_back(nbytes);
    }
  }
  *memory = kind;
  return PtrItems<Item, Part, Ptr>(keys, ptrs, sizes, segments.size(), parts);
}

}  // namespace
}  // namespace cxlrt::python

using namespace cxlrt;          // NOLINT: the module body names every layer
using namespace cxlrt::python;  // NOLINT

PYBIND11_MODULE(_cxlrt, m) {
  m.doc() = "cxlrt's C++ runtime, bound for Python (use the `cxlrt` package).";
  RegisterErrors(m);

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
          "Audits the pool's metadata; returns the problems found (empty: none).");

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

  py::class_<DeviceSpan>(m, "DeviceSpan",
                         "GPU memory for a collective or a KV call: an address and a size "
                         "(e.g. a CUDA tensor's data_ptr() and nbytes). The caller keeps the "
                         "memory alive for the call.")
      .def(py::init([](uint64_t ptr, size_t nbytes) {
             return DeviceSpan{ptr, nbytes, py::none(), false};
           }),
           py::arg("ptr"), py::arg("nbytes"))
      .def_readonly("ptr", &DeviceSpan::ptr)
      .def_readonly("nbytes", &DeviceSpan::nbytes)
      .def_readonly("readonly", &DeviceSpan::readonly)
      .def("__repr__", [](const DeviceSpan& d) {
        return absl::StrCat("DeviceSpan(ptr=0x", absl::Hex(d.ptr), ", nbytes=", d.nbytes, ")");
      });
  py::class_<DlpackMemory>(m, "DlpackMemory", py::buffer_protocol(),
                           "Host memory of a DLPack array (buffer protocol); holds the capsule.")
      .def_buffer([](DlpackMemory& d) {
        return py::buffer_info(d.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<ssize_t>(d.nbytes)}, {1}, d.readonly);
      })
      .def_readonly("readonly", &DlpackMemory::readonly);
  m.def("dlpack_view", &DlpackView, py::arg("capsule"), py::arg("writable") = false,
        "(DlpackMemory or DeviceSpan, dtype, elements) of a DLPack capsule, which the view "
        "holds unconsumed; `writable` refuses a read-only array (InvalidArgumentError).");
  m.def("devices_available", &gpu::GpuAvailable,
        "Whether this process can use a GPU (a CUDA build, a driver, a device).");
  m.def("devices_unavailable_reason", &gpu::GpuUnavailableReason,
        "Why no GPU can be used (empty when one can).");

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

  py::class_<PyPins, std::shared_ptr<PyPins>>(m, "Pins", "Pins taken by Store.lookup.")
      .def_readonly("length", &PyPins::length)
      .def("__len__", [](const PyPins& p) { return p.pins.size(); })
      .def("release", &PyPins::Release);

  py::class_<PyStore, std::shared_ptr<PyStore>>(m, "Store", "The KV-cache block store.")
      .def(py::init<PyHost&, bool, uint32_t, uint32_t, uint32_t>(), py::arg("host"),
           py::arg("create") = false, py::arg("entries_per_host") = 0, py::arg("pins_per_host") = 0,
           py::arg("max_namespaces") = 0)
      .def("close", &PyStore::Close)
      .def(
          "put",
          [](PyStore& st, const std::string& ns, py::bytes key, py::object value) {
            const std::string k = key;
            const Held v(value, false, "put", "value");
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            absl::Status r;
            {
              py::gil_scoped_release nogil;
              r = s.Put(ns, k, v.data(), v.bytes());
            }
            Check(r);
          },
          py::arg("ns"), py::arg("key"), py::arg("value"))
      .def(
          "get_into",
          [](PyStore& st, const std::string& ns, py::bytes key, py::object out) {
            const std::string k = key;
            const Held o(out, true, "get_into", "out");
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            absl::StatusOr<size_t> r;
            {
              py::gil_scoped_release nogil;
              r = s.Get(ns, k, o.data(), o.bytes());
            }
            return Value(r);
          },
          py::arg("ns"), py::arg("key"), py::arg("out"))
      .def(
          "value_size",
          [](PyStore& st, const std::string& ns, py::bytes key) {
            const std::string k = key;
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            py::gil_scoped_release nogil;
            return Value(s.ValueSize(ns, k));
          },
          py::arg("ns"), py::arg("key"))
      .def(
          "contains",
          [](PyStore& st, const std::string& ns, py::bytes key) {
            const std::string k = key;
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            py::gil_scoped_release nogil;
            return Value(s.Contains(ns, k));
          },
          py::arg("ns"), py::arg("key"))
      .def(
          "batch_put",
          [](PyStore& st, const std::string& ns, py::object keys, py::object values) {
            BatchArgs a("batch_put", Sequence(keys, "keys"), Sequence(values, "values"), false);
            Gate::Pass pass = st.Enter();
            std::vector<kv::PutItem> items(a.size());
            for (size_t i = 0; i < a.size(); ++i) items[i] = {a.key(i), a.data(i), a.bytes(i), {}};
            return RunBatchPut(st.s(), ns, items);
          },
          py::arg("ns"), py::arg("keys"), py::arg("values"))
      .def(
          "batch_get_into",
          [](PyStore& st, const std::string& ns, py::object keys, py::object outs) {
            BatchArgs a("batch_get_into", Sequence(keys, "keys"), Sequence(outs, "outs"), true);
            Gate::Pass pass = st.Enter();
            std::vector<kv::GetItem> items(a.size());
            for (size_t i = 0; i < a.size(); ++i) items[i] = {a.key(i), a.data(i), a.bytes(i), {}};
            return RunBatchGet(st.s(), ns, items);
          },
          py::arg("ns"), py::arg("keys"), py::arg("outs"))
      // Zero-copy for frameworks that hand out raw addresses of registered
      // host memory (SGLang's get_page_buffer_meta): the caller guarantees
      // each [ptr, ptr+size) stays valid for the call.
      .def(
          "batch_put_ptrs",
          [](PyStore& st, const std::string& ns, const std::vector<py::bytes>& keys,
             const std::vector<uintptr_t>& ptrs, const std::vector<size_t>& sizes, size_t per) {
            const std::vector<std::string> k(keys.begin(), keys.end());
            Gate::Pass pass = st.Enter();
            std::vector<kv::PutPart> parts;
            return RunBatchPut(
                st.s(), ns,
                PtrItems<kv::PutItem, kv::PutPart, const void*>(k, ptrs, sizes, per, &parts));
          },
          py::arg("ns"), py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
          py::arg("parts_per_key") = 1)
      .def(
          "batch_get_ptrs",
          [](PyStore& st, const std::string& ns, const std::vector<py::bytes>& keys,
             const std::vector<uintptr_t>& ptrs, const std::vector<size_t>& sizes, size_t per) {
            const std::vector<std::string> k(keys.begin(), keys.end());
            Gate::Pass pass = st.Enter();
            std::vector<kv::GetPart> parts;
            return RunBatchGet(
                st.s(), ns, PtrItems<kv::GetItem, kv::GetPart, void*>(k, ptrs, sizes, per, &parts));
          },
          py::arg("ns"), py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
          py::arg("parts_per_key") = 1)
      // Paged KV caches (vLLM's, one tensor per layer): block i's value is
      // gathered from (or scattered to) every segment's page of that block,
      // copied straight between the cache and the pool. The caller
      // guarantees the pages stay valid for the call.
      .def(
          "batch_put_paged",
          [](PyStore& st, const std::string& ns, const std::vector<py::bytes>& keys,
             const std::vector<uint64_t>& blocks,
             const std::vector<std::tuple<uintptr_t, uint64_t, size_t>>& segments) {
            const std::vector<std::string> k(keys.begin(), keys.end());
            Gate::Pass pass = st.Enter();
            std::vector<kv::PutPart> parts;
            kv::BatchOptions options;
            return RunBatchPut(st.s(), ns,
                               PagedItems<kv::PutItem, kv::PutPart, const void*>(
                                   k, blocks, segments, &parts, &options.memory),
                               options);
          },
          py::arg("ns"), py::arg("keys"), py::arg("blocks"), py::arg("segments"))
      .def(
          "batch_get_paged",
          [](PyStore& st, const std::string& ns, const std::vector<py::bytes>& keys,
             const std::vector<uint64_t>& blocks,
             const std::vector<std::tuple<uintptr_t, uint64_t, size_t>>& segments) {
            const std::vector<std::string> k(keys.begin(), keys.end());
            Gate::Pass pass = st.Enter();
            std::vector<kv::GetPart> parts;
            kv::BatchOptions options;
            return RunBatchGet(st.s(), ns,
                               PagedItems<kv::GetItem, kv::GetPart, void*>(k, blocks, segments,
                                                                           &parts, &options.memory),
                               options);
          },
          py::arg("ns"), py::arg("keys"), py::arg("blocks"), py::arg("segments"))
      .def(
          "lookup",
          [](std::shared_ptr<PyStore> st, const std::string& ns,
             const std::vector<py::bytes>& chain) {
            std::vector<std::string> c(chain.begin(), chain.end());
            Gate::Pass pass = st->Enter();
            auto pins = std::make_shared<PyPins>();
            pins->store = st;
            kv::Store& s = st->s();
            absl::StatusOr<size_t> n;
            {
              py::gil_scoped_release nogil;
              n = s.Lookup(ns, c, &pins->pins);
            }
            pins->length = Value(n);
            return pins;
          },
          py::arg("ns"), py::arg("chain"))
      .def(
          "delete",
          [](PyStore& st, const std::string& ns, py::bytes key) {
            const std::string k = key;
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            absl::Status r;
            {
              py::gil_scoped_release nogil;
              r = s.Delete(ns, k);
            }
            Check(r);
          },
          py::arg("ns"), py::arg("key"))
      .def(
          "set_quota",
          [](PyStore& st, const std::string& ns, uint64_t bytes) {
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            absl::Status r;
            {
              py::gil_scoped_release nogil;
              r = s.SetQuota(ns, bytes);
            }
            Check(r);
          },
          py::arg("ns"), py::arg("nbytes"))
      .def(
          "time_batches",
          [](PyStore& st, const std::string& ns, const std::vector<std::vector<py::bytes>>& batches,
             const py::sequence& bufs, bool put) {
            // The same batches as the Python API would run, looped in C++:
            // what the binding costs is the difference (python -m cxlrt.bench).
            std::vector<std::vector<std::string>> keys;
            for (const auto& b : batches) keys.emplace_back(b.begin(), b.end());
            std::deque<Held> spans;  // held for the loop
            for (size_t i = 0; i < bufs.size(); ++i) {
              spans.emplace_back(py::object(bufs[i]), !put, "time_batches",
                                 absl::StrCat("buffer ", i));
            }
            Gate::Pass pass = st.Enter();
            kv::Store& s = st.s();
            size_t failed = 0;
            int64_t ns_total = 0;
            {
              py::gil_scoped_release nogil;
              const int64_t t0 = runtime::NowNs();
              for (const auto& batch : keys) {
                if (batch.size() > spans.size()) {
                  ++failed;
                  continue;
                }
                if (put) {
                  std::vector<kv::PutItem> items(batch.size());
                  for (size_t i = 0; i < batch.size(); ++i) {
                    items[i] = {batch[i], spans[i].data(), spans[i].bytes(), {}};
                  }
                  for (const absl::Status& r : s.BatchPut(ns, items)) failed += !r.ok();
                } else {
                  std::vector<kv::GetItem> items(batch.size());
                  for (size_t i = 0; i < batch.size(); ++i) {
                    items[i] = {batch[i], spans[i].data(), spans[i].bytes(), {}};
                  }
                  for (const auto& r : s.BatchGet(ns, items)) failed += !r.ok();
                }
              }
              ns_total = runtime::NowNs() - t0;
            }
            if (failed) {
              throw StatusError{absl::InternalError(absl::StrCat(failed, " items failed"))};
            }
            return static_cast<double>(ns_total) / 1e9;
          },
          py::arg("ns"), py::arg("batches"), py::arg("bufs"), py::arg("put"),
          "Seconds to run `batches` of BatchPut (put) or BatchGet in C++, item i of a batch "
          "from / into bufs[i].")
      .def("stats", [](PyStore& st) {
        Gate::Pass pass = st.Enter();
        kv::Store& s = st.s();
        absl::StatusOr<kv::StoreStats> r;
        {
          py::gil_scoped_release nogil;
          r = s.Stats();
        }
        const kv::StoreStats v = Value(r);
        py::dict d;
        d["hosts"] = v.hosts;
        d["entries_per_host"] = v.entries_per_host;
        d["live_entries"] = v.live_entries;
        py::dict spaces;
        for (const kv::NamespaceStats& n : v.namespaces) {
          py::dict x;
          x["quota"] = n.quota;
          x["entries"] = n.entries;
          x["bytes"] = n.bytes;
          x["hits"] = n.hits;
          x["misses"] = n.misses;
          x["evictions"] = n.evictions;
          x["puts"] = n.puts;
          x["put_exists"] = n.put_exists;
          spaces[py::str(n.name)] = x;
        }
        d["namespaces"] = spaces;
        return d;
      });
}
