// Buffer arguments of the _cxlrt bindings: held for the length of a call,
// read from DLPack capsules, and checked against the call (buffers.h); and
// their bindings (DeviceSpan, DlpackMemory, dlpack_view, whether a GPU is
// usable).
#include "python/csrc/buffers.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "python/csrc/bindings.h"

namespace cxlrt::python {

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

Held::Held(py::handle o, bool writable, absl::string_view call, absl::string_view arg) {
  if (py::isinstance<DeviceSpan>(o)) {
    const auto& d = o.cast<const DeviceSpan&>();
    // An address that is not GPU memory would be read as host memory: a
    // crash, or wrong bytes. Refuse it, saying why.
    if (d.nbytes > 0 && gpu::KindOf(reinterpret_cast<void*>(d.ptr)) != runtime::MemoryKind::kGpu) {
      const std::string why =
          gpu::GpuAvailable() ? "it is not GPU memory" : "no GPU: " + gpu::GpuUnavailableReason();
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat(call, ": ", arg, ": DeviceSpan at 0x", absl::Hex(d.ptr), ": ", why))};
    }
    if (writable && d.readonly) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat(call, ": ", arg, " is read-only GPU memory; the call writes it"))};
    }
    owner_ = d.owner;
    data_ = reinterpret_cast<void*>(d.ptr);
    bytes_ = d.nbytes;
    return;
  }
  if (!PyObject_CheckBuffer(o.ptr())) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        call, ": ", arg,
        ": expected a buffer (numpy array, bytearray, CPU tensor) or a DeviceSpan, got ",
        std::string(py::str(py::type::handle_of(o).attr("__name__")))))};
  }
  if (PyObject_GetBuffer(o.ptr(), &view_, PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0)) != 0) {
    py::error_already_set e;  // fetches (and clears) the exporter's error
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat(call, ": ", arg, writable ? " is read-only or not a writable buffer (" : " (",
                     e.what(), ")"))};
  }
  if (!PyBuffer_IsContiguous(&view_, 'C')) {
    PyBuffer_Release(&view_);
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat(call, ": ", arg, ": the buffer is not contiguous"))};
  }
  exported_ = true;
  data_ = view_.buf;
  bytes_ = static_cast<size_t>(view_.len);
}

// DLPack (the array-exchange ABI of JAX, TensorFlow, CuPy, numpy...): the
// structs of dlpack.h, whose layout the standard fixes.
namespace {
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
// DLPack 1.0 (capsule "dltensor_versioned"): a version and flags.
struct ManagedTensorVersioned {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned*);
  uint64_t flags;
  Tensor dl_tensor;
};
constexpr uint64_t kReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY
}  // namespace dlpack
}  // namespace

// Consumes a checked capsule as DLPack's protocol says: renamed "used_...",
// so no other consumer takes it (and frees the memory under cxlrt's view),
// and the returned owner calls the producer's deleter when the last view
// of it goes.
template <typename Managed>
py::object Consume(const py::capsule& cap, const char* name, const char* used) {
  auto* m = static_cast<Managed*>(PyCapsule_GetPointer(cap.ptr(), name));
  if (!m || PyCapsule_SetName(cap.ptr(), used) != 0) throw py::error_already_set();
  return py::capsule(m, [](void* p) {
    auto* t = static_cast<Managed*>(p);
    if (t->deleter) t->deleter(t);
  });
}

// (buffer or DeviceSpan, cxlrt dtype, elements) of an unconsumed
// "dltensor" or "dltensor_versioned" capsule, which the result consumes and
// holds (the producer's memory stays until the view goes). `writable`: the
// caller will write the memory, refused (InvalidArgumentError) when the
// array is read-only: a DLPack 1.0 capsule flags it so, and a legacy
// capsule cannot say otherwise (it has no flag, and JAX and TensorFlow
// export their immutable arrays through it), as numpy's from_dlpack reads
// it too.
py::tuple DlpackView(const py::capsule& cap, bool writable) {
  const std::string name = cap.name() ? cap.name() : "";
  const dlpack::Tensor* tp;
  bool readonly;
  if (name == "dltensor_versioned") {
    const auto* m = cap.get_pointer<dlpack::ManagedTensorVersioned>();
    if (m->major != 1) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat("a DLPack ", m->major, ".", m->minor, " capsule: cxlrt reads 1.x"))};
    }
    tp = &m->dl_tensor;
    readonly = (m->flags & dlpack::kReadOnly) != 0;
    if (writable && readonly) {
      throw StatusError{absl::InvalidArgumentError(
          "the DLPack array is read-only (its producer flags it so); cxlrt does not write it")};
    }
  } else if (name == "dltensor") {
    tp = &cap.get_pointer<dlpack::ManagedTensor>()->dl_tensor;
    readonly = true;
    if (writable) {
      throw StatusError{absl::InvalidArgumentError(
          "the DLPack array is read-only to cxlrt: a legacy DLPack capsule (its producer "
          "takes no max_version) cannot say its memory may be written, and JAX's and "
          "TensorFlow's arrays are immutable; write into a numpy array or torch tensor, or "
          "one whose producer speaks DLPack 1.0")};
    }
  } else {
    throw StatusError{absl::InvalidArgumentError(
        "expected an unconsumed DLPack capsule (named 'dltensor' or 'dltensor_versioned')")};
  }
  const dlpack::Tensor& t = *tp;
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
    if (t.shape[i] < 0) throw StatusError{absl::InvalidArgumentError("a DLPack shape below 0")};
    if (t.strides && t.shape[i] > 1 && t.strides[i] != expect) {
      throw StatusError{absl::InvalidArgumentError("the DLPack array is not C-contiguous")};
    }
    expect *= t.shape[i];
    count *= t.shape[i];
  }
  const size_t nbytes = static_cast<size_t>(count) * (d.bits / 8);
  auto* p = static_cast<uint8_t*>(t.data) + t.byte_offset;
  const int device = t.device.type;
  if (device != 1 && device != 3 && device != 2 && device != 13) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        "a DLPack array on device type ", device, ": cxlrt moves CPU and CUDA memory"))};
  }
  // Checked: consumed only now, so a refused capsule stays its producer's.
  const py::object owner = name == "dltensor_versioned"
                               ? Consume<dlpack::ManagedTensorVersioned>(cap, "dltensor_versioned",
                                                                         "used_dltensor_versioned")
                               : Consume<dlpack::ManagedTensor>(cap, "dltensor", "used_dltensor");
  py::object view;
  if (device == 1 || device == 3) {  // CPU, CUDA host memory
    view = py::cast(DlpackMemory{owner, p, nbytes, readonly});
  } else {  // CUDA, CUDA managed
    view = py::cast(DeviceSpan{reinterpret_cast<uint64_t>(p), nbytes, owner, readonly});
  }
  return py::make_tuple(view, type->second, count);
}

const char* NameOf(Call c) {
  switch (c) {
    case Call::kAllReduce:
      return "all_reduce";
    case Call::kReduceScatter:
      return "reduce_scatter";
    case Call::kAllGather:
      return "all_gather";
    case Call::kBroadcast:
      return "broadcast";
    case Call::kReduce:
      return "reduce";
    case Call::kGather:
      return "gather";
    case Call::kScatter:
      return "scatter";
    case Call::kAllToAll:
      return "all_to_all";
    case Call::kSend:
      return "send";
    case Call::kRecv:
      return "recv";
  }
  return "?";
}

bool HasRoot(Call c) {
  return c == Call::kBroadcast || c == Call::kReduce || c == Call::kGather || c == Call::kScatter;
}

Uses UsesOf(Call c, int nranks, bool root) {
  const uint64_t n = static_cast<uint64_t>(nranks);
  switch (c) {
    case Call::kAllReduce:
      return {1, 1};
    case Call::kReduceScatter:
      return {n, 1};
    case Call::kAllGather:
      return {1, n};
    case Call::kBroadcast:
      return {root ? 1u : 0u, 1};
    case Call::kReduce:
      return {1, root ? 1u : 0u};
    case Call::kGather:
      return {1, root ? n : 0};
    case Call::kScatter:
      return {root ? n : 0, 1};
    case Call::kAllToAll:
      return {n, n};
    case Call::kSend:
    case Call::kRecv:
      return {1, 0};
  }
  return {0, 0};
}

// Refuses, before anything is copied, a buffer that does not hold exactly
// the `multiple` x `count` elements of `dtype` the call moves through it,
// or whose own element type (`held_dtype`; empty: an untyped buffer) is
// another. multiple 0: the buffer is not used on this rank.
void CheckBuffer(const char* call, const char* arg, const Held& b, bool writes, uint64_t multiple,
                 uint64_t count, const std::string& dtype, const std::string& held_dtype) {
  if (multiple == 0) return;
  if (!held_dtype.empty() && held_dtype != dtype) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        call, ": ", arg, " holds ", held_dtype, " elements but the call moves ", dtype))};
  }
  const uint64_t es = collectives::SizeOf(TypeOf(dtype));
  uint64_t elements, bytes;
  if (__builtin_mul_overflow(multiple, count, &elements) ||
      __builtin_mul_overflow(elements, es, &bytes)) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        call, ": ", arg, ": ", multiple, " x ", count, " elements of ", dtype, " overflow"))};
  }
  if (b.bytes() != bytes) {
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat(call, ": ", arg, " holds ", b.bytes(), " bytes; the call ",
                     writes ? "writes" : "reads", " ", bytes, " (", elements, " ", dtype, ")"))};
  }
}

void CheckOverlap(const char* call, const Held& x, const Held& out, int rank) {
  const auto xb = reinterpret_cast<uintptr_t>(x.data());
  const auto ob = reinterpret_cast<uintptr_t>(out.data());
  const uint64_t xn = x.bytes(), on = out.bytes();
  if (xn == 0 || on == 0 || xb >= ob + on || ob >= xb + xn) return;
  const uint64_t r = static_cast<uint64_t>(rank);
  const bool allowed = xn == on ? xb == ob : xn < on ? xb == ob + r * xn : ob == xb + r * on;
  if (allowed) return;
  throw StatusError{absl::InvalidArgumentError(absl::StrCat(
      call, ": x (", xn, " bytes) and out (", on, " bytes) overlap ", xb < ob ? ob - xb : xb - ob,
      " bytes apart; ",
      xn == on ? std::string("in place is the same buffer for both")
      : xn < on
          ? absl::StrCat("in place is x at rank ", rank, "'s part of out (byte ", r * xn, ")")
          : absl::StrCat("in place is out at rank ", rank, "'s part of x (byte ", r * on, ")")))};
}

void BindBuffers(py::module_& m) {
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
}

}  // namespace cxlrt::python
