// Buffer arguments of the _cxlrt bindings (communicator.cc, store.cc): every buffer a call
// takes is held until the call's GIL-free work is over (Held), DLPack
// arrays are read from their capsules (DlpackView), and each collective's
// buffers are checked against the call before anything is copied
// (CheckBuffer). docs/python.md has the rules.
#ifndef CXLRT_PYTHON_CSRC_BUFFERS_H_
#define CXLRT_PYTHON_CSRC_BUFFERS_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "cxlrt/collectives/types.h"
#include "python/csrc/errors.h"

namespace cxlrt::python {

namespace py = pybind11;

// The element type and reduction named `name`, or InvalidArgumentError.
collectives::DataType TypeOf(const std::string& name);
collectives::RedOp OpOf(const std::string& name);

// GPU memory handed in from Python (a CUDA tensor's data_ptr() and size):
// the buffer protocol cannot describe it (docs/gpu.md, docs/python.md).
// `owner` keeps the memory's owner alive (a DLPack capsule); `readonly`:
// the producer said it must not be written.
struct DeviceSpan {
  uint64_t ptr;
  size_t nbytes;
  py::object owner;
  bool readonly = false;
};

// A buffer argument held for the length of a call: the export (Py_buffer)
// of a buffer-protocol object, so that its owner can neither resize nor
// free it meanwhile (a bytearray raises BufferError, a PoolBuffer refuses
// free()), or a DeviceSpan and what owns its memory. Made and destroyed
// with the GIL; data() and bytes() are used without it. Refuses, naming
// the call and the argument: a read-only buffer to be written, a buffer
// that is not C-contiguous, a DeviceSpan that is not GPU memory.
class Held {
 public:
  Held(py::handle o, bool writable, absl::string_view call, absl::string_view arg);
  ~Held() {
    if (exported_) PyBuffer_Release(&view_);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  Py_buffer view_ = {};
  bool exported_ = false;
  py::object owner_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory of a DLPack array, exported through the buffer protocol: it
// holds the capsule (and so the producer's memory) while any view of it
// lives, and refuses writable views of memory that may not be written.
struct DlpackMemory {
  py::object capsule;
  void* data;
  size_t nbytes;
  bool readonly;
};

// (DlpackMemory or DeviceSpan, cxlrt dtype, elements) of an unconsumed
// "dltensor" or "dltensor_versioned" capsule, which the result holds.
// `writable`: the caller will write the memory (refused when read-only).
py::tuple DlpackView(const py::capsule& cap, bool writable);

// The calls whose buffers are checked (CheckBuffer).
enum class Call {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kSend,
  kRecv
};

const char* NameOf(Call c);
bool HasRoot(Call c);

// How many times `count` elements `call` reads from x and writes into out
// on a rank (NCCL's conventions, cxlrt/collectives/communicator.h); 0: the rank
// does not use that buffer (out of gather and reduce off the root, x of
// broadcast and scatter off the root). Recv writes x.
struct Uses {
  uint64_t x, out;
};
Uses UsesOf(Call c, int nranks, bool root);

// Refuses, before anything is copied, a buffer that does not hold exactly
// the `multiple` x `count` elements of `dtype` the call moves through it,
// or whose own element type (`held_dtype`; empty: an untyped buffer) is
// another. multiple 0: the buffer is not used on this rank.
void CheckBuffer(const char* call, const char* arg, const Held& b, bool writes, uint64_t multiple,
                 uint64_t count, const std::string& dtype, const std::string& held_dtype);

// Refuses x and out that overlap other than as NCCL allows: the same
// buffer (in place), x this rank's part of out (all_gather, gather on the
// root) or out this rank's part of x (reduce_scatter, scatter on the
// root). A call with any other overlap reads bytes it has already
// written: wrong results with an OK status. REQUIRES: both checked by
// CheckBuffer and used on this rank.
void CheckOverlap(const char* call, const Held& x, const Held& out, int rank);

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_CSRC_BUFFERS_H_
