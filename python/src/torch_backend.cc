// The `cxlrt` backend of torch.distributed: a c10d::Backend whose
// collectives run on a cxlrt Communicator over the pool. Built at first use
// by torch.utils.cpp_extension against the installed torch and
// libcxlrt.so (python/cxlrt/torch_backend.py), registered for CPU and CUDA
// tensors (a CUDA call is ordered on the caller's current stream; docs/gpu.md).
//
// A call runs at once in the caller's thread when nothing is queued or
// running (the common case: a wake-up of another thread costs 10-50 us on a
// busy 2-core machine, more than a 64 KiB all-reduce); otherwise it is
// queued for the backend's worker thread, which runs calls in order. Either
// way one thread at a time uses the communicator, in call order, and the
// returned Work completes, with its future, when the collective has.
// CXLRT_TORCH_ASYNC=1 queues every call (compute may then overlap
// communication where cores allow). An error fails that Work and every
// later one (the communicator is aborted, as cxlrt requires).
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/strings/str_cat.h"
#include "allocator/allocator.h"
#include "collectives/communicator.h"
#include "runtime/membership.h"
#include "runtime/pool.h"

namespace cxlrt::torch_backend {
namespace {

using collectives::DataType;
using collectives::RedOp;

[[noreturn]] void Raise(const absl::Status& s) {
  throw std::runtime_error(absl::StrCat("cxlrt: ", s.ToString()));
}

DataType TypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUint8;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBfloat16;
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    default:
      throw std::invalid_argument(
          absl::StrCat("cxlrt: no element type for ", c10::toString(t.scalar_type())));
  }
}

RedOp OpOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return RedOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return RedOp::kProd;
    case c10d::ReduceOp::MIN:
      return RedOp::kMin;
    case c10d::ReduceOp::MAX:
      return RedOp::kMax;
    case c10d::ReduceOp::AVG:
      return RedOp::kAvg;
    default:
      throw std::invalid_argument("cxlrt: reductions are sum, product, min, max and avg");
  }
}

void CheckTensor(const at::Tensor& t) {
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw std::invalid_argument(
        absl::StrCat("cxlrt: a ", t.device().str(), " tensor: cxlrt moves CPU and CUDA tensors"));
  }
  if (!t.is_contiguous()) throw std::invalid_argument("cxlrt: the tensor is not contiguous");
}

// The current stream of a CUDA tensor's device; nullopt for CPU tensors.
std::optional<c10::Stream> StreamOf(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty() || !tensors[0].device().is_cuda()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(tensors[0].device());
}

// One queued call's handle. For CUDA tensors (`stream`: the caller's stream
// when it called) the work is done when the stream holds the result: the
// call has made that stream wait for it; wait() makes the current stream
// wait too, and the future is CUDA-aware (NCCL's contract).
class CxlrtWork : public c10d::Work {
 public:
  CxlrtWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::optional<c10::Stream> stream)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        stream_(stream),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()),
            stream ? std::vector<c10::Device>{stream->device()} : std::vector<c10::Device>{})) {}

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
      throw std::runtime_error("cxlrt: the collective did not complete within the timeout");
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
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  void Finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      error_ = error;
    }
    cv_.notify_all();
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::vector<at::Tensor> outputs_;
  const std::optional<c10::Stream> stream_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CxlrtBackend : public c10d::Backend {
 public:
  CxlrtBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout, const std::string& pool_uri)
      : Backend(rank, size) {
    // Rank 0 makes the pool when it does not exist, and names the
    // communicator; the others wait for both through the store.
    std::string name;
    if (rank == 0) {
      // Made here unless the caller made it (torch_backend.py does, so
      // that the pool goes when the job's process exits).
      auto made = runtime::Pool::Create(pool_uri);
      if (!made.ok() && !absl::IsAlreadyExists(made.status())) Raise(made.status());
      std::random_device rd;
      name = absl::StrCat("torch-", rd(), "-", rd());
      store->set("cxlrt/communicator", std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      const std::vector<uint8_t> got = store->get("cxlrt/communicator");
      name.assign(got.begin(), got.end());
    }
    auto pool = runtime::Pool::Open(pool_uri);
    if (!pool.ok()) Raise(pool.status());
    pool_ = *std::move(pool);
    runtime::AttachOptions attach;
    attach.host_id = -1;  // any free host slot: each rank is a host of its own
    auto membership = runtime::Membership::Attach(*pool_, attach);
    if (!membership.ok()) Raise(membership.status());
    membership_ = *std::move(membership);
    auto alloc = allocator::Allocator::Open(*pool_, *membership_);
    if (!alloc.ok()) Raise(alloc.status());
    alloc_ = *std::move(alloc);
    collectives::CommOptions o;
    o.timeout = absl::FromChrono(timeout);
    auto comm = collectives::Communicator::Create(*alloc_, name, size, rank, o);
    if (!comm.ok()) Raise(comm.status());
    comm_ = *std::move(comm);
    worker_ = std::thread([this] { Run(); });
  }

  ~CxlrtBackend() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    comm_.reset();  // Destroy: a barrier, then rank 0 waits until every rank has left
    alloc_.reset();
    membership_.reset();
    pool_.reset();
  }

  const std::string getBackendName() const override { return "cxlrt"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    at::Tensor t = One(tensors);
    const RedOp op = OpOf(opts.reduceOp);
    return Enqueue(c10d::OpType::ALLREDUCE, {t}, [=](collectives::Communicator& c, void* stream) {
      return c.AllReduce(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), op, stream);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    at::Tensor t = One(tensors);
    const int root = static_cast<int>(opts.rootRank);
    return Enqueue(c10d::OpType::BROADCAST, {t}, [=](collectives::Communicator& c, void* stream) {
      return c.Broadcast(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), root, stream);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    at::Tensor t = One(tensors);
    const RedOp op = OpOf(opts.reduceOp);
    const int root = static_cast<int>(opts.rootRank);
    return Enqueue(c10d::OpType::REDUCE, {t}, [=](collectives::Communicator& c, void* stream) {
      return c.Reduce(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), op, root, stream);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    at::Tensor in = One(inputs);
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
      throw std::invalid_argument("cxlrt: allgather needs one list of world-size tensors");
    }
    std::vector<at::Tensor> outs = outputs[0];
    for (const at::Tensor& o : outs) Same(o, in);
    return Enqueue(c10d::OpType::ALLGATHER, outs, [=](collectives::Communicator& c, void* stream) {
      // Gathered into one flat buffer, then split into the caller's tensors.
      at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
      absl::Status s = c.AllGather(in.data_ptr(), flat.data_ptr(), in.numel(), TypeOf(in), stream);
      if (s.ok()) {
        for (int r = 0; r < size_; ++r) {
          outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
        }
      }
      return s;
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    CheckTensor(input);
    CheckTensor(output);
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      throw std::invalid_argument("cxlrt: the output must hold world size times the input");
    }
    at::Tensor in = input, out = output;
    return Enqueue(
        c10d::OpType::_ALLGATHER_BASE, {out}, [=](collectives::Communicator& c, void* stream) {
          return c.AllGather(in.data_ptr(), out.data_ptr(), in.numel(), TypeOf(in), stream);
        });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out = One(outputs);
    if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
      throw std::invalid_argument("cxlrt: reduce_scatter needs one list of world-size tensors");
    }
    for (const at::Tensor& i : inputs[0]) Same(i, out);
    at::Tensor flat = at::cat(inputs[0]).view(-1);  // the caller's pieces, contiguous
    const RedOp op = OpOf(opts.reduceOp);
    return Enqueue(c10d::OpType::REDUCE_SCATTER, {out},
                   [=](collectives::Communicator& c, void* stream) {
                     return c.ReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(),
                                            TypeOf(out), op, stream);
                   });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    CheckTensor(input);
    CheckTensor(output);
    if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      throw std::invalid_argument("cxlrt: the input must hold world size times the output");
    }
    at::Tensor in = input, out = output;
    const RedOp op = OpOf(opts.reduceOp);
    return Enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {out},
                   [=](collectives::Communicator& c, void* stream) {
                     return c.ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), TypeOf(out),
                                            op, stream);
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    CheckTensor(input);
    CheckTensor(output);
    if (!output_splits.empty() || !input_splits.empty()) {
      throw std::invalid_argument("cxlrt: all_to_all_single with split sizes is not supported");
    }
    if (input.numel() != output.numel() || input.numel() % size_ != 0 ||
        input.scalar_type() != output.scalar_type()) {
      throw std::invalid_argument("cxlrt: all_to_all_single needs equal tensors split evenly");
    }
    at::Tensor in = input, out = output;
    return Enqueue(
        c10d::OpType::ALLTOALL_BASE, {out}, [=](collectives::Communicator& c, void* stream) {
          return c.AllToAll(in.data_ptr(), out.data_ptr(), in.numel() / size_, TypeOf(in), stream);
        });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    if (outputs.size() != static_cast<size_t>(size_) ||
        inputs.size() != static_cast<size_t>(size_)) {
      throw std::invalid_argument("cxlrt: all_to_all needs world-size lists of tensors");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      Same(inputs[i], inputs[0]);
      Same(outputs[i], inputs[0]);
    }
    at::Tensor flat_in = at::cat(inputs).view(-1);
    std::vector<at::Tensor> outs = outputs;
    const int64_t n = inputs[0].numel();
    return Enqueue(c10d::OpType::ALLTOALL, outs, [=](collectives::Communicator& c, void* stream) {
      at::Tensor flat_out = at::empty_like(flat_in);
      absl::Status s =
          c.AllToAll(flat_in.data_ptr(), flat_out.data_ptr(), n, TypeOf(flat_in), stream);
      if (s.ok()) {
        for (int r = 0; r < size_; ++r) outs[r].view(-1).copy_(flat_out.narrow(0, r * n, n));
      }
      return s;
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    at::Tensor in = One(inputs);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument("cxlrt: gather needs one list of world-size tensors");
      }
      outs = outputs[0];
      for (const at::Tensor& o : outs) Same(o, in);
    }
    return Enqueue(c10d::OpType::GATHER, outs, [=](collectives::Communicator& c, void* stream) {
      at::Tensor flat = at::empty({rank_ == root ? size_ * in.numel() : 0}, in.options());
      absl::Status s =
          c.Gather(in.data_ptr(), flat.data_ptr(), in.numel(), TypeOf(in), root, stream);
      if (s.ok() && rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
        }
      }
      return s;
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    at::Tensor out = One(outputs);
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor flat = at::empty({0}, out.options());
    if (rank_ == root) {
      if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument("cxlrt: scatter needs one list of world-size tensors");
      }
      for (const at::Tensor& i : inputs[0]) Same(i, out);
      flat = at::cat(inputs[0]).view(-1);
    }
    return Enqueue(c10d::OpType::SCATTER, {out}, [=](collectives::Communicator& c, void* stream) {
      return c.Scatter(flat.data_ptr(), out.data_ptr(), out.numel(), TypeOf(out), root, stream);
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return Enqueue(c10d::OpType::BARRIER, {},
                   [](collectives::Communicator& c, void*) { return c.Barrier(); });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int /*tag*/) override {
    at::Tensor t = One(tensors);
    return Enqueue(c10d::OpType::SEND, {t}, [=](collectives::Communicator& c, void* stream) {
      return c.Send(t.data_ptr(), t.numel(), TypeOf(t), dst, stream);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int /*tag*/) override {
    at::Tensor t = One(tensors);
    return Enqueue(c10d::OpType::RECV, {t}, [=](collectives::Communicator& c, void* stream) {
      return c.Recv(t.data_ptr(), t.numel(), TypeOf(t), src, stream);
    });
  }

  static c10::intrusive_ptr<c10d::Backend> Create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& pool_uri) {
    return c10::make_intrusive<CxlrtBackend>(store, rank, size, timeout, pool_uri);
  }

 private:
  struct Job {
    c10::intrusive_ptr<CxlrtWork> work;
    std::function<absl::Status(collectives::Communicator&, void* stream)> run;
  };

  static at::Tensor One(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() != 1) throw std::invalid_argument("cxlrt: one tensor per call");
    CheckTensor(tensors[0]);
    TypeOf(tensors[0]);
    return tensors[0];
  }
  static void Same(const at::Tensor& t, const at::Tensor& like) {
    CheckTensor(t);
    if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
      throw std::invalid_argument("cxlrt: the tensors must match in size and type");
    }
  }

  c10::intrusive_ptr<c10d::Work> Enqueue(
      c10d::OpType type, std::vector<at::Tensor> outputs,
      std::function<absl::Status(collectives::Communicator&, void* stream)> run) {
    std::optional<c10::Stream> stream = StreamOf(outputs);
    auto work = c10::make_intrusive<CxlrtWork>(rank_, type, std::move(outputs), stream);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (always_queue_ || busy_ || !jobs_.empty()) {
        jobs_.push_back({work, std::move(run)});
        cv_.notify_one();
        return work;
      }
      busy_ = true;  // the worker leaves the communicator to this thread
    }
    Execute({work, std::move(run)});
    return work;
  }

  // Runs a call; CUDA calls on the caller's stream (the call's own tensor
  // work too, and the future's completion events).
  void Execute(const Job& job) {
    const std::optional<c10::Stream>& stream = job.work->stream();
    std::optional<c10::StreamGuard> on;
    if (stream) on.emplace(*stream);
    std::exception_ptr error;
    try {
      absl::Status s = job.run(*comm_, stream ? stream->native_handle() : nullptr);
      if (!s.ok()) Raise(s);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      busy_ = false;
    }
    cv_.notify_one();
    job.work->Finish(error);
  }

  void Run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || (!jobs_.empty() && !busy_); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      Execute(job);
    }
  }

  std::unique_ptr<runtime::Pool> pool_;
  std::unique_ptr<runtime::Membership> membership_;
  std::unique_ptr<allocator::Allocator> alloc_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool busy_ = false;  // a call is running (in the worker or a caller)
  bool stop_ = false;
  const bool always_queue_ = [] {
    const char* v = std::getenv("CXLRT_TORCH_ASYNC");
    return v && std::string(v) == "1";
  }();
  std::thread worker_;
};

}  // namespace
}  // namespace cxlrt::torch_backend

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create", &cxlrt::torch_backend::CxlrtBackend::Create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("pool"),
        "A cxlrt c10d backend for rank `rank` of `size` over the pool `pool`.");
}
