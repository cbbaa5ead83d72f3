// What keeps the _cxlrt bindings' objects alive, and the Gate that close()
// and destroy() use to wait for the calls in flight. A Gate may be entered
// from any thread; Close() needs the GIL (it releases it to wait).
#ifndef CXLRT_PYTHON_CSRC_LIFETIMES_H_
#define CXLRT_PYTHON_CSRC_LIFETIMES_H_

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "python/csrc/errors.h"

namespace cxlrt::python {

namespace py = pybind11;

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

}  // namespace cxlrt::python

#endif  // CXLRT_PYTHON_CSRC_LIFETIMES_H_
