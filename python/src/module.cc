// The `cxlrt._cxlrt` extension: pools, hosts, pool-resident buffers,
// communicators and the KV store, bound with pybind11. python/cxlrt/ wraps
// it in the Python API (docs/python.md); this file converts types, raises
// a cxlrt.Error subclass for every non-OK status, and releases the GIL
// around every call that may block (waits on peers, pool locks, copies).
// Thread-safety: as the C++ objects it wraps (a Communicator is used by one
// thread at a time; a Store by any).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/allocator.h"
#include "collectives/communicator.h"
#include "collectives/device.h"
#include "kv/store.h"
#include "runtime/coherence.h"
#include "runtime/membership.h"
#include "runtime/pool.h"

namespace py = pybind11;

namespace cxlrt::python {
namespace {

// A non-OK status on its way to Python.
struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}
template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError{v.status()};
  return *std::move(v);
}

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

// --- Pools and hosts ---

// A pool this process has mapped.
struct PyPool {
  std::unique_ptr<runtime::Pool> pool;
};

// This process attached to a pool as a host, with its allocator. Closed
// (in reverse order) by close() or when the last reference goes.
class PyHost {
 public:
  PyHost(std::shared_ptr<PyPool> pool, std::optional<uint32_t> slot, std::optional<int> host_id)
      : pool_(std::move(pool)) {
    runtime::AttachOptions o;
    o.slot = slot;
    o.host_id = host_id;
    py::gil_scoped_release nogil;
    membership_ = Value(runtime::Membership::Attach(*pool_->pool, o));
    alloc_ = Value(allocator::Allocator::Open(*pool_->pool, *membership_));
  }
  ~PyHost() { Close(); }
  void Close() {
    py::gil_scoped_release nogil;
    alloc_.reset();
    membership_.reset();
  }
  bool closed() const { return !alloc_; }
  allocator::Allocator& alloc() {
    if (!alloc_) throw StatusError{absl::FailedPreconditionError("the host is closed")};
    return *alloc_;
  }
  uint32_t slot() { return alloc().membership().slot(); }
  runtime::Pool& pool() { return *pool_->pool; }

 private:
  std::shared_ptr<PyPool> pool_;
  std::unique_ptr<runtime::Membership> membership_;
  std::unique_ptr<allocator::Allocator> alloc_;
};

// A block of the pool this process may read and write through the buffer
// protocol (numpy.frombuffer, torch.frombuffer: no copy). Freed by free()
// or with its owner.
class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<PyHost> host, uint8_t* data, size_t size, runtime::PoolOffset offset,
           std::function<absl::Status()> free)
      : host_(std::move(host)), data_(data), size_(size), offset_(offset), free_(std::move(free)) {}
  uint8_t* data() const {
    if (!data_) throw StatusError{absl::FailedPreconditionError("the buffer was freed")};
    return data_;
  }
  size_t size() const { return size_; }
  bool freed() const { return data_ == nullptr; }
  runtime::PoolOffset offset() const { return offset_; }
  void Free() {
    if (!data_) return;
    data_ = nullptr;
    Check(free_());
  }

 private:
  std::shared_ptr<PyHost> host_;
  uint8_t* data_;
  size_t size_;
  runtime::PoolOffset offset_;
  std::function<absl::Status()> free_;
};

// --- Communicators ---

collectives::DataType TypeOf(const std::string& name) {
  auto t = collectives::ParseDataType(name);
  if (!t) throw StatusError{absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"))};
  return *t;
}
collectives::RedOp OpOf(const std::string& name) {
  auto o = collectives::ParseRedOp(name);
  if (!o) throw StatusError{absl::InvalidArgumentError(absl::StrCat("unknown op '", name, "'"))};
  return *o;
}

// A contiguous buffer's address and size.
struct Span {
  void* p;
  size_t bytes;
};

// GPU memory handed in from Python (a CUDA tensor's data_ptr() and size):
// the buffer protocol cannot describe it (docs/gpu.md, docs/python.md).
struct DeviceSpan {
  uint64_t ptr;
  size_t nbytes;
};

Span SpanOf(const py::buffer& b, bool writable);

// DLPack (the array-exchange ABI of JAX, TensorFlow, CuPy, numpy...): the
// structs of dlpack.h, whose layout the standard fixes.
namespace dlpack {
struct Device {
  int32_t type;  // 1 CPU, 2 CUDA, 3 CUDA host (pinned), 13 CUDA managed
  int32_t id;
};
struct DataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: C-contiguous
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};
}  // namespace dlpack

// (memoryview or DeviceSpan, cxlrt dtype, elements) of an unconsumed
// "dltensor" capsule. It is only read: the capsule keeps ownership, and
// the producer's array (which the caller holds) keeps the memory.
py::tuple DlpackView(const py::capsule& cap) {
  if (std::string(cap.name() ? cap.name() : "") != "dltensor") {
    throw StatusError{
        absl::InvalidArgumentError("expected an unconsumed DLPack capsule (named 'dltensor')")};
  }
  const dlpack::Tensor& t = cap.get_pointer<dlpack::ManagedTensor>()->dl_tensor;
  const dlpack::DataType d = t.dtype;
  static const std::map<std::pair<int, int>, const char*> kTypes = {
      {{0, 8}, "int8"},     {{0, 32}, "int32"},   {{0, 64}, "int64"},   {{1, 8}, "uint8"},
      {{1, 32}, "uint32"},  {{1, 64}, "uint64"},  {{2, 16}, "float16"}, {{2, 32}, "float32"},
      {{2, 64}, "float64"}, {{4, 16}, "bfloat16"}};
  auto type = kTypes.find({d.code, d.bits});
  if (type == kTypes.end() || d.lanes != 1) {
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat("cxlrt has no element type for DLPack type code ", d.code, ", ", d.bits,
                     " bits, ", d.lanes, " lanes"))};
  }
  int64_t count = 1, expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.strides && t.shape[i] > 1 && t.strides[i] != expect) {
      throw StatusError{absl::InvalidArgumentError("the DLPack array is not C-contiguous")};
    }
    expect *= t.shape[i];
    count *= t.shape[i];
  }
  const size_t nbytes = static_cast<size_t>(count) * (d.bits / 8);
  auto* p = static_cast<uint8_t*>(t.data) + t.byte_offset;
  py::object view;
  switch (t.device.type) {
    case 1:  // CPU
    case 3:  // CUDA host memory
      view = py::reinterpret_steal<py::object>(
          PyMemoryView_FromMemory(reinterpret_cast<char*>(p), nbytes, PyBUF_WRITE));
      break;
    case 2:   // CUDA
    case 13:  // CUDA managed
      view = py::cast(DeviceSpan{reinterpret_cast<uint64_t>(p), nbytes});
      break;
    default:
      throw StatusError{absl::InvalidArgumentError(absl::StrCat(
          "a DLPack array on device type ", t.device.type, ": cxlrt moves CPU and CUDA memory"))};
  }
  return py::make_tuple(view, type->second, count);
}

// A buffer-protocol object or a DeviceSpan.
Span AnySpanOf(const py::handle& o, bool writable) {
  if (py::isinstance<DeviceSpan>(o)) {
    const auto& d = o.cast<const DeviceSpan&>();
    // An address that is not GPU memory would be read as host memory: a
    // crash, or wrong bytes. Refuse it, saying why.
    if (d.nbytes > 0 &&
        collectives::KindOf(reinterpret_cast<void*>(d.ptr)) != collectives::MemoryKind::kDevice) {
      const std::string why = collectives::DevicesAvailable()
                                  ? "it is not GPU memory"
                                  : "no GPU: " + collectives::DevicesUnavailableReason();
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat("DeviceSpan at 0x", absl::Hex(d.ptr), ": ", why))};
    }
    return {reinterpret_cast<void*>(d.ptr), d.nbytes};
  }
  if (!PyObject_CheckBuffer(o.ptr())) {
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat("expected a buffer (numpy array, bytearray, CPU tensor) or a DeviceSpan, "
                     "got ",
                     std::string(py::str(o.get_type().attr("__name__")))))};
  }
  return SpanOf(py::reinterpret_borrow<py::buffer>(o), writable);
}

Span SpanOf(const py::buffer& b, bool writable) {
  py::buffer_info info = b.request(writable);
  ssize_t expect = info.itemsize;
  for (ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      throw StatusError{absl::InvalidArgumentError("the buffer is not contiguous")};
    }
    expect *= info.shape[d];
  }
  return {info.ptr, static_cast<size_t>(info.size * info.itemsize)};
}

class PyComm {
 public:
  PyComm(std::shared_ptr<PyHost> host, const std::string& name, int nranks, int rank,
         double timeout_s, uint64_t slot_bytes, uint32_t depth)
      : host_(std::move(host)) {
    collectives::CommOptions o;
    if (timeout_s > 0) o.timeout = absl::Seconds(timeout_s);
    o.slot_bytes = slot_bytes;
    o.depth = depth;
    allocator::Allocator& alloc = host_->alloc();
    py::gil_scoped_release nogil;
    comm_ = Value(collectives::Communicator::Create(alloc, name, nranks, rank, o));
  }
  collectives::Communicator& c() {
    if (!comm_) throw StatusError{absl::FailedPreconditionError("the communicator was destroyed")};
    return *comm_;
  }
  void Destroy() {
    if (!comm_) return;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = comm_->Destroy();
      comm_.reset();
    }
    Check(s);
  }
  void Abort(const std::string& why) { c().Abort(why); }
  std::shared_ptr<PyHost> host() const { return host_; }

  // Runs `fn` on the communicator without the GIL.
  template <typename Fn>
  void Run(Fn&& fn) {
    collectives::Communicator& comm = c();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = fn(comm);
    }
    Check(s);
  }

 private:
  std::shared_ptr<PyHost> host_;
  std::unique_ptr<collectives::Communicator> comm_;
};

// --- KV store ---

class PyStore {
 public:
  PyStore(std::shared_ptr<PyHost> host, bool create, uint32_t entries_per_host,
          uint32_t pins_per_host, uint32_t max_namespaces)
      : host_(std::move(host)) {
    kv::StoreOptions o;
    o.create = create;
    if (entries_per_host) o.entries_per_host = entries_per_host;
    if (pins_per_host) o.pins_per_host = pins_per_host;
    if (max_namespaces) o.max_namespaces = max_namespaces;
    allocator::Allocator& alloc = host_->alloc();
    py::gil_scoped_release nogil;
    store_ = Value(kv::Store::Open(alloc, o));
  }
  kv::Store& s() {
    if (!store_) throw StatusError{absl::FailedPreconditionError("the store is closed")};
    return *store_;
  }
  void Close() {
    py::gil_scoped_release nogil;
    store_.reset();
  }

 private:
  std::shared_ptr<PyHost> host_;
  std::unique_ptr<kv::Store> store_;
};

// Pins from Store.lookup, released by release() or on garbage collection.
struct PyPins {
  std::shared_ptr<PyStore> store;
  kv::PinSet pins;
  size_t length = 0;
  void Release() {
    if (store && !pins.empty()) store->s().Release(pins);
  }
  ~PyPins() {
    try {
      Release();
    } catch (...) {
    }
  }
};

// The buffers and keys of a batch call, borrowed from the caller's
// sequences for the length of the call (no copies): keys are bytes or str,
// values anything with the buffer protocol, contiguous.
class BatchArgs {
 public:
  BatchArgs(const py::sequence& keys, const py::sequence& bufs, bool writable) {
    const size_t n = keys.size();
    if (bufs.size() != n) {
      throw StatusError{
          absl::InvalidArgumentError(absl::StrCat(n, " keys but ", bufs.size(), " buffers"))};
    }
    keys_ = keys;
    bufs_ = bufs;
    views_.reserve(n);
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
            absl::InvalidArgumentError(absl::StrCat("key ", i, " is not bytes or str"))};
      }
      keyviews_.emplace_back(data, static_cast<size_t>(len));
      Py_buffer view;
      PyObject* b = PySequence_Fast_GET_ITEM(bufs_.ptr(), i);
      if (PyObject_GetBuffer(
              b, &view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        throw StatusError{absl::InvalidArgumentError(absl::StrCat(
            "buffer ", i, " is not a contiguous", writable ? ", writable" : "", " buffer"))};
      }
      views_.push_back(view);
    }
  }
  ~BatchArgs() {
    for (Py_buffer& v : views_) PyBuffer_Release(&v);
  }
  size_t size() const { return views_.size(); }
  absl::string_view key(size_t i) const { return keyviews_[i]; }
  void* data(size_t i) const { return views_[i].buf; }
  size_t bytes(size_t i) const { return static_cast<size_t>(views_[i].len); }

 private:
  py::object keys_, bufs_;  // PySequence_Fast: lists or tuples, kept alive
  std::vector<Py_buffer> views_;
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
                             std::vector<Part>* parts,
                             std::optional<collectives::MemoryKind>* memory) {
  if (keys.size() != blocks.size()) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        "keys and blocks differ in length (", keys.size(), " and ", blocks.size(), ")"))};
  }
  if (segments.empty()) {
    throw StatusError{absl::InvalidArgumentError("a paged value needs at least one segment")};
  }
  const auto kind_of = [](uintptr_t p) { return collectives::KindOf(reinterpret_cast<void*>(p)); };
  const collectives::MemoryKind kind = kind_of(std::get<0>(segments[0]));
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
      .def("close", &PyHost::Close, "Detaches (the allocator first).")
      .def_property_readonly("closed", &PyHost::closed)
      .def_property_readonly("slot", &PyHost::slot)
      .def(
          "allocate",
          [](std::shared_ptr<PyHost> h, size_t bytes, size_t alignment) {
            allocator::Allocator& a = h->alloc();
            runtime::PoolOffset off;
            {
              py::gil_scoped_release nogil;
              off = Value(a.Allocate(std::max<size_t>(bytes, 1), {.alignment = alignment}));
            }
            uint8_t* p = h->pool().backend().base() + off;
            return std::make_shared<PyBuffer>(h, p, bytes, off,
                                              [h, off] { return h->alloc().Free(off); });
          },
          py::arg("nbytes"), py::arg("alignment") = 64, "A block of the pool (PoolBuffer).");

  py::class_<DeviceSpan>(m, "DeviceSpan",
                         "GPU memory for a collective or a KV call: an address and a size "
                         "(e.g. a CUDA tensor's data_ptr() and nbytes). The caller keeps the "
                         "memory alive for the call.")
      .def(py::init([](uint64_t ptr, size_t nbytes) {
             return DeviceSpan{ptr, nbytes};
           }),
           py::arg("ptr"), py::arg("nbytes"))
      .def_readonly("ptr", &DeviceSpan::ptr)
      .def_readonly("nbytes", &DeviceSpan::nbytes)
      .def("__repr__", [](const DeviceSpan& d) {
        return absl::StrCat("DeviceSpan(ptr=0x", absl::Hex(d.ptr), ", nbytes=", d.nbytes, ")");
      });
  m.def("dlpack_view", &DlpackView, py::arg("capsule"),
        "(memoryview or DeviceSpan, dtype, elements) of a DLPack capsule, which stays "
        "unconsumed; the array must outlive the view.");
  m.def("devices_available", &collectives::DevicesAvailable,
        "Whether this process can use a GPU (a CUDA build, a driver, a device).");
  m.def("devices_unavailable_reason", &collectives::DevicesUnavailableReason,
        "Why no GPU can be used (empty when one can).");

  py::class_<PyBuffer, std::shared_ptr<PyBuffer>>(m, "PoolBuffer", py::buffer_protocol(),
                                                  "Pool memory, readable and writable in place.")
      .def_buffer([](PyBuffer& b) {
        // No exception may leave a buffer callback: a freed block exposes no
        // bytes (and nothing to write into).
        return py::buffer_info(b.freed() ? nullptr : b.data(), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<ssize_t>(b.freed() ? 0 : b.size())}, {1});
      })
      .def_property_readonly("freed", &PyBuffer::freed)
      .def_property_readonly("nbytes", &PyBuffer::size)
      .def_property_readonly("offset", &PyBuffer::offset, "Offset in the pool.")
      .def("free", &PyBuffer::Free, "Returns the block (later use raises).");

  py::class_<PyComm, std::shared_ptr<PyComm>>(m, "Communicator")
      .def(py::init<std::shared_ptr<PyHost>, std::string, int, int, double, uint64_t, uint32_t>(),
           py::arg("host"), py::arg("name"), py::arg("nranks") = -1, py::arg("rank") = -1,
           py::arg("timeout") = 0.0, py::arg("slot_bytes") = 0, py::arg("depth") = 0)
      .def_property_readonly("rank", [](PyComm& c) { return c.c().rank(); })
      .def_property_readonly("size", [](PyComm& c) { return c.c().size(); })
      .def("destroy", &PyComm::Destroy)
      .def("abort", &PyComm::Abort, py::arg("why") = "aborted by the application")
      .def(
          "allocate",
          [](std::shared_ptr<PyComm> c, size_t bytes) {
            void* p = Value(c->c().Allocate(bytes));
            const runtime::PoolOffset off =
                static_cast<uint8_t*>(p) - c->host()->pool().backend().base();
            return std::make_shared<PyBuffer>(c->host(), static_cast<uint8_t*>(p), bytes, off,
                                              [c, p] { return c->c().Free(p); });
          },
          py::arg("nbytes"))
      .def("all_reduce",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              const std::string& op, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             const auto o = OpOf(op);
             c.Run([&](auto& comm) {
               return comm.AllReduce(s.p, r.p, count, t, o, reinterpret_cast<void*>(stream));
             });
           })
      .def("reduce_scatter",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              const std::string& op, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             const auto o = OpOf(op);
             c.Run([&](auto& comm) {
               return comm.ReduceScatter(s.p, r.p, count, t, o, reinterpret_cast<void*>(stream));
             });
           })
      .def("all_gather",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.AllGather(s.p, r.p, count, t, reinterpret_cast<void*>(stream));
             });
           })
      .def("broadcast",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              int root, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.Broadcast(s.p, r.p, count, t, root, reinterpret_cast<void*>(stream));
             });
           })
      .def("reduce",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              const std::string& op, int root, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             const auto o = OpOf(op);
             c.Run([&](auto& comm) {
               return comm.Reduce(s.p, r.p, count, t, o, root, reinterpret_cast<void*>(stream));
             });
           })
      .def("gather",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              int root, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.Gather(s.p, r.p, count, t, root, reinterpret_cast<void*>(stream));
             });
           })
      .def("scatter",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              int root, uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.Scatter(s.p, r.p, count, t, root, reinterpret_cast<void*>(stream));
             });
           })
      .def("all_to_all",
           [](PyComm& c, py::object send, py::object recv, size_t count, const std::string& dtype,
              uint64_t stream) {
             const Span s = AnySpanOf(send, false), r = AnySpanOf(recv, true);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.AllToAll(s.p, r.p, count, t, reinterpret_cast<void*>(stream));
             });
           })
      .def("barrier", [](PyComm& c) { c.Run([](auto& comm) { return comm.Barrier(); }); })
      .def("send",
           [](PyComm& c, py::object buf, size_t count, const std::string& dtype, int peer,
              uint64_t stream) {
             const Span s = AnySpanOf(buf, false);
             const auto t = TypeOf(dtype);
             c.Run([&](auto& comm) {
               return comm.Send(s.p, count, t, peer, reinterpret_cast<void*>(stream));
             });
           })
      .def("recv", [](PyComm& c, py::object buf, size_t count, const std::string& dtype, int peer,
                      uint64_t stream) {
        const Span r = AnySpanOf(buf, true);
        const auto t = TypeOf(dtype);
        c.Run([&](auto& comm) {
          return comm.Recv(r.p, count, t, peer, reinterpret_cast<void*>(stream));
        });
      });

  m.def(
      "dtype_size", [](const std::string& dtype) { return collectives::SizeOf(TypeOf(dtype)); },
      py::arg("dtype"));

  py::class_<PyPins, std::shared_ptr<PyPins>>(m, "Pins", "Pins taken by Store.lookup.")
      .def_readonly("length", &PyPins::length)
      .def("__len__", [](const PyPins& p) { return p.pins.size(); })
      .def("release", [](PyPins& p) {
        py::gil_scoped_release nogil;
        p.Release();
      });

  py::class_<PyStore, std::shared_ptr<PyStore>>(m, "Store", "The KV-cache block store.")
      .def(py::init<std::shared_ptr<PyHost>, bool, uint32_t, uint32_t, uint32_t>(), py::arg("host"),
           py::arg("create") = false, py::arg("entries_per_host") = 0, py::arg("pins_per_host") = 0,
           py::arg("max_namespaces") = 0)
      .def("close", &PyStore::Close)
      .def(
          "put",
          [](PyStore& st, const std::string& ns, py::bytes key, py::object value) {
            const std::string k = key;
            const Span v = AnySpanOf(value, false);
            kv::Store& s = st.s();
            absl::Status r;
            {
              py::gil_scoped_release nogil;
              r = s.Put(ns, k, v.p, v.bytes);
            }
            Check(r);
          },
          py::arg("ns"), py::arg("key"), py::arg("value"))
      .def(
          "get_into",
          [](PyStore& st, const std::string& ns, py::bytes key, py::object out) {
            const std::string k = key;
            const Span o = AnySpanOf(out, true);
            kv::Store& s = st.s();
            absl::StatusOr<size_t> r;
            {
              py::gil_scoped_release nogil;
              r = s.Get(ns, k, o.p, o.bytes);
            }
            return Value(r);
          },
          py::arg("ns"), py::arg("key"), py::arg("out"))
      .def(
          "value_size",
          [](PyStore& st, const std::string& ns, py::bytes key) {
            const std::string k = key;
            kv::Store& s = st.s();
            py::gil_scoped_release nogil;
            return Value(s.ValueSize(ns, k));
          },
          py::arg("ns"), py::arg("key"))
      .def(
          "contains",
          [](PyStore& st, const std::string& ns, py::bytes key) {
            const std::string k = key;
            kv::Store& s = st.s();
            py::gil_scoped_release nogil;
            return Value(s.Contains(ns, k));
          },
          py::arg("ns"), py::arg("key"))
      .def(
          "batch_put",
          [](PyStore& st, const std::string& ns, py::object keys, py::object values) {
            BatchArgs a(
                py::reinterpret_steal<py::sequence>(PySequence_Fast(keys.ptr(), "keys")),
                py::reinterpret_steal<py::sequence>(PySequence_Fast(values.ptr(), "values")),
                false);
            std::vector<kv::PutItem> items(a.size());
            for (size_t i = 0; i < a.size(); ++i) items[i] = {a.key(i), a.data(i), a.bytes(i), {}};
            return RunBatchPut(st.s(), ns, items);
          },
          py::arg("ns"), py::arg("keys"), py::arg("values"))
      .def(
          "batch_get_into",
          [](PyStore& st, const std::string& ns, py::object keys, py::object outs) {
            BatchArgs a(py::reinterpret_steal<py::sequence>(PySequence_Fast(keys.ptr(), "keys")),
                        py::reinterpret_steal<py::sequence>(PySequence_Fast(outs.ptr(), "outs")),
                        true);
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
             const std::vector<py::buffer>& bufs, bool put) {
            // The same batches as the Python API would run, looped in C++:
            // what the binding costs is the difference (python -m cxlrt.bench).
            std::vector<std::vector<std::string>> keys;
            for (const auto& b : batches) keys.emplace_back(b.begin(), b.end());
            std::vector<Span> spans;
            for (const py::buffer& b : bufs) spans.push_back(SpanOf(b, !put));
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
                    items[i] = {batch[i], spans[i].p, spans[i].bytes, {}};
                  }
                  for (const absl::Status& r : s.BatchPut(ns, items)) failed += !r.ok();
                } else {
                  std::vector<kv::GetItem> items(batch.size());
                  for (size_t i = 0; i < batch.size(); ++i) {
                    items[i] = {batch[i], spans[i].p, spans[i].bytes, {}};
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
