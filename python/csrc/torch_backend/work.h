// The torch backend's Work: the handle of one collective or point-to-point
// call, and its future. Completed once (Finish) by the thread that ran the
// call; waited on and queried from any thread.
#ifndef CXLRT_PYTHON_CSRC_TORCH_BACKEND_WORK_H_
#define CXLRT_PYTHON_CSRC_TORCH_BACKEND_WORK_H_

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cxlrt::torch_backend {

// One queued call's handle. For CUDA tensors (`stream`: the caller's stream
// when it called) the work is done when the stream holds the result: the
// call has made that stream wait for it; wait() makes the current stream
// wait too, and the future is CUDA-aware (NCCL's contract). A CPU call's
// future is made only when asked for (most callers only wait(); making and
// completing one was a tenth of a small call's cost).
class CxlrtWork : public c10d::Work {
 public:
  CxlrtWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::optional<c10::Stream> stream)
      : Work(rank, type), outputs_(std::move(outputs)), stream_(stream) {
    // A CUDA future completes on the call's stream (Finish runs under it).
    if (stream_) future_ = MakeFuture();
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> l(mu_);
    return done_ && !error_;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(mu_);
    if (timeout == kNoTimeout) {
      cv_.wait(l, [&] { return done_; });
    } else if (!cv_.wait_for(l, timeout, [&] { return done_; })) {
      // Worded as torch's own backends word a timeout (" Timed out ").
      throw std::runtime_error(absl::StrCat("cxlrt: [Rank ", rank_, "] ",
                                            c10d::opTypeToString(opType_), ": Timed out waiting ",
                                            timeout.count(), "ms for the work to complete"));
    }
    if (error_) std::rethrow_exception(error_);
    if (stream_) {
      const c10::Stream current =
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(stream_->device());
      if (current != *stream_) {
        c10::Event done(c10::DeviceType::CUDA);
        done.record(*stream_);
        done.block(current);
      }
    }
    return true;
  }
  const std::optional<c10::Stream>& stream() const { return stream_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!future_) {
      future_ = MakeFuture();
      if (done_) Complete(*future_);
    }
    return future_;
  }
  // The sender of a completed receive (recvAnysource's answer).
  int sourceRank() const override {
    std::lock_guard<std::mutex> l(mu_);
    if (source_ < 0) {
      throw std::runtime_error(
          "cxlrt: sourceRank() is known only for a completed recv or recv from any source");
    }
    return source_;
  }
  void SetSource(int source) {
    std::lock_guard<std::mutex> l(mu_);
    source_ = source;
  }
  std::vector<at::Tensor> result() override { return outputs_; }

  void Finish(std::exception_ptr error) {
    c10::intrusive_ptr<at::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      error_ = error;
      future = future_;
    }
    cv_.notify_all();
    if (future) Complete(*future);
  }

 private:
  c10::intrusive_ptr<at::ivalue::Future> MakeFuture() const {
    return c10::make_intrusive<at::ivalue::Future>(
        c10::ListType::ofTensors(),  // a shared type, not one made per call
        stream_ ? std::vector<c10::Device>{stream_->device()} : std::vector<c10::Device>{});
  }
  // REQUIRES: done_ (error_ is then fixed).
  void Complete(at::ivalue::Future& future) const {
    if (error_) {
      future.setError(error_);
    } else {
      future.markCompleted(c10::IValue(outputs_));
    }
  }

  std::vector<at::Tensor> outputs_;
  const std::optional<c10::Stream> stream_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  int source_ = -1;
};

}  // namespace cxlrt::torch_backend

#endif  // CXLRT_PYTHON_CSRC_TORCH_BACKEND_WORK_H_
