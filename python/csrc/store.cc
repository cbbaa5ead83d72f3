// Bindings of the KV store: Store (single, batched, raw-address and paged
// calls, lookups that pin) and Pins. Batches borrow the caller's buffers
// for the call (Held, buffers.h); each item's error comes back as an
// exception object, not raised (StatusToPy).
#include "cxlrt/kv/store.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/runtime/coherence.h"
#include "python/csrc/bindings.h"
#include "python/csrc/buffers.h"
#include "python/csrc/errors.h"
#include "python/csrc/lifetimes.h"
#include "python/csrc/pool.h"

namespace cxlrt::python {
namespace {

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

void BindStore(py::module_& m) {
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

}  // namespace cxlrt::python
