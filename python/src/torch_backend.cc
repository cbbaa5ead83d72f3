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
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
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
  if (t.layout() != at::kStrided) {
    throw std::invalid_argument(absl::StrCat(
        "cxlrt: a ", c10::toString(t.layout()),
        " tensor: cxlrt moves dense (strided) tensors; all_reduce (sum) takes sparse COO ones"));
  }
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
            c10::ListType::ofTensors(),  // a shared type, not one made per call
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
      : Backend(rank, size), store_(store), timeout_(timeout) {
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
    return Guarded("all_reduce", [&] {
      if (tensors.size() == 1 && tensors[0].is_sparse()) return SparseAllreduce(tensors[0], opts);
      at::Tensor t = One(tensors);
      const RedOp op = OpOf(opts.reduceOp);
      return Enqueue(c10d::OpType::ALLREDUCE, {t},
                     Named("all_reduce", [=](collectives::Communicator& c, void* stream) {
                       return c.AllReduce(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), op,
                                          stream);
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return Guarded("broadcast", [&] {
      at::Tensor t = One(tensors);
      const int root = static_cast<int>(opts.rootRank);
      return Enqueue(c10d::OpType::BROADCAST, {t},
                     Named("broadcast", [=](collectives::Communicator& c, void* stream) {
                       return c.Broadcast(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), root,
                                          stream);
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return Guarded("reduce", [&] {
      at::Tensor t = One(tensors);
      const RedOp op = OpOf(opts.reduceOp);
      const int root = static_cast<int>(opts.rootRank);
      return Enqueue(c10d::OpType::REDUCE, {t},
                     Named("reduce", [=](collectives::Communicator& c, void* stream) {
                       return c.Reduce(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), op, root,
                                       stream);
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    return Guarded("all_gather", [&] {
      at::Tensor in = One(inputs);
      if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument("cxlrt: allgather needs one list of world-size tensors");
      }
      std::vector<at::Tensor> outs = outputs[0];
      for (const at::Tensor& o : outs) Same(o, in);
      return Enqueue(c10d::OpType::ALLGATHER, outs,
                     Named("all_gather", [=](collectives::Communicator& c, void* stream) {
                       // Gathered into one flat buffer, then split into the caller's tensors.
                       at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
                       absl::Status s = c.AllGather(in.data_ptr(), flat.data_ptr(), in.numel(),
                                                    TypeOf(in), stream);
                       if (s.ok()) {
                         for (int r = 0; r < size_; ++r) {
                           outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
                         }
                       }
                       return s;
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    return Guarded("all_gather_into_tensor", [&] {
      CheckTensor(input);
      CheckTensor(output);
      if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
        throw std::invalid_argument("cxlrt: the output must hold world size times the input");
      }
      at::Tensor in = input, out = output;
      return Enqueue(
          c10d::OpType::_ALLGATHER_BASE, {out},
          Named("all_gather_into_tensor", [=](collectives::Communicator& c, void* stream) {
            return c.AllGather(in.data_ptr(), out.data_ptr(), in.numel(), TypeOf(in), stream);
          }));
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return Guarded("reduce_scatter", [&] {
      at::Tensor out = One(outputs);
      if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument("cxlrt: reduce_scatter needs one list of world-size tensors");
      }
      for (const at::Tensor& i : inputs[0]) Same(i, out);
      at::Tensor flat = at::cat(inputs[0]).view(-1);  // the caller's pieces, contiguous
      const RedOp op = OpOf(opts.reduceOp);
      return Enqueue(c10d::OpType::REDUCE_SCATTER, {out},
                     Named("reduce_scatter", [=](collectives::Communicator& c, void* stream) {
                       return c.ReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(),
                                              TypeOf(out), op, stream);
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return Guarded("reduce_scatter_tensor", [&] {
      CheckTensor(input);
      CheckTensor(output);
      if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
        throw std::invalid_argument("cxlrt: the input must hold world size times the output");
      }
      at::Tensor in = input, out = output;
      const RedOp op = OpOf(opts.reduceOp);
      return Enqueue(
          c10d::OpType::_REDUCE_SCATTER_BASE, {out},
          Named("reduce_scatter_tensor", [=](collectives::Communicator& c, void* stream) {
            return c.ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), TypeOf(out), op,
                                   stream);
          }));
    });
  }

  // all_to_all_single: split sizes count rows (dim 0); none given: even.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    return Guarded("all_to_all_single", [&] {
      CheckTensor(input);
      CheckTensor(output);
      TypeOf(input);
      if (input.scalar_type() != output.scalar_type()) {
        throw std::invalid_argument(
            absl::StrCat("cxlrt: the input is ", c10::toString(input.scalar_type()),
                         " but the output ", c10::toString(output.scalar_type())));
      }
      at::Tensor in = input, out = output;
      if (output_splits.empty() && input_splits.empty()) {
        if (input.numel() != output.numel() || input.numel() % size_ != 0) {
          throw std::invalid_argument(absl::StrCat(
              "cxlrt: without split sizes the input and output must be equal and split evenly "
              "(input ",
              input.numel(), " elements, output ", output.numel(), ", world size ", size_, ")"));
        }
        return Enqueue(c10d::OpType::ALLTOALL_BASE, {out},
                       Named("all_to_all_single", [=](collectives::Communicator& c, void* stream) {
                         return c.AllToAll(in.data_ptr(), out.data_ptr(), in.numel() / size_,
                                           TypeOf(in), stream);
                       }));
      }
      std::vector<size_t> sc, sd, rc, rd;
      RowSplits(input, input_splits, "input", sc, sd);
      RowSplits(output, output_splits, "output", rc, rd);
      if (Overlap(in, out)) in = in.clone();  // AllToAllV reads the input while it writes
      return Enqueue(c10d::OpType::ALLTOALL_BASE, {out},
                     Named("all_to_all_single", [=](collectives::Communicator& c, void* stream) {
                       return c.AllToAllV(in.data_ptr(), sc, sd, out.data_ptr(), rc, rd, TypeOf(in),
                                          stream);
                     }));
    });
  }

  // all_to_all of tensor lists: tensors of one type, of any sizes (uneven:
  // MoE dispatch and combine) through AllToAllV; all of one size through
  // AllToAll (a round fewer).
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    return Guarded("all_to_all", [&] {
      if (outputs.size() != static_cast<size_t>(size_) ||
          inputs.size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument(absl::StrCat("cxlrt: all_to_all needs lists of ", size_,
                                                 " tensors, got ", inputs.size(), " inputs and ",
                                                 outputs.size(), " outputs"));
      }
      bool even = true;
      std::vector<size_t> sc, sd, rc, rd;
      size_t stotal = 0, rtotal = 0;
      for (int j = 0; j < size_; ++j) {
        CheckTensor(inputs[j]);
        CheckTensor(outputs[j]);
        TypeOf(inputs[j]);
        if (inputs[j].scalar_type() != inputs[0].scalar_type() ||
            outputs[j].scalar_type() != inputs[0].scalar_type()) {
          throw std::invalid_argument("cxlrt: all_to_all needs tensors of one element type");
        }
        even = even && inputs[j].numel() == inputs[0].numel() &&
               outputs[j].numel() == inputs[0].numel();
        sc.push_back(inputs[j].numel());
        sd.push_back(stotal);
        stotal += inputs[j].numel();
        rc.push_back(outputs[j].numel());
        rd.push_back(rtotal);
        rtotal += outputs[j].numel();
      }
      std::vector<at::Tensor> flat_ins;
      for (const at::Tensor& t : inputs) flat_ins.push_back(t.reshape(-1));
      at::Tensor flat_in = at::cat(flat_ins);
      std::vector<at::Tensor> outs = outputs;
      const int64_t n = inputs[0].numel();
      return Enqueue(
          c10d::OpType::ALLTOALL, outs,
          Named("all_to_all", [=](collectives::Communicator& c, void* stream) {
            at::Tensor flat_out = at::empty({static_cast<int64_t>(rtotal)}, flat_in.options());
            absl::Status s = even ? c.AllToAll(flat_in.data_ptr(), flat_out.data_ptr(), n,
                                               TypeOf(flat_in), stream)
                                  : c.AllToAllV(flat_in.data_ptr(), sc, sd, flat_out.data_ptr(), rc,
                                                rd, TypeOf(flat_in), stream);
            if (s.ok()) {
              for (int r = 0; r < size_; ++r) {
                outs[r].view(-1).copy_(flat_out.narrow(0, rd[r], rc[r]));
              }
            }
            return s;
          }));
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    return Guarded("gather", [&] {
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
      return Enqueue(c10d::OpType::GATHER, outs,
                     Named("gather", [=](collectives::Communicator& c, void* stream) {
                       at::Tensor flat =
                           at::empty({rank_ == root ? size_ * in.numel() : 0}, in.options());
                       absl::Status s = c.Gather(in.data_ptr(), flat.data_ptr(), in.numel(),
                                                 TypeOf(in), root, stream);
                       if (s.ok() && rank_ == root) {
                         for (int r = 0; r < size_; ++r) {
                           outs[r].view(-1).copy_(flat.narrow(0, r * in.numel(), in.numel()));
                         }
                       }
                       return s;
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return Guarded("scatter", [&] {
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
      return Enqueue(c10d::OpType::SCATTER, {out},
                     Named("scatter", [=](collectives::Communicator& c, void* stream) {
                       return c.Scatter(flat.data_ptr(), out.data_ptr(), out.numel(), TypeOf(out),
                                        root, stream);
                     }));
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return Guarded("barrier", [&] {
      return Enqueue(
          c10d::OpType::BARRIER, {},
          Named("barrier", [](collectives::Communicator& c, void*) { return c.Barrier(); }));
    });
  }

  // --- Calls Gloo answers beyond the basic collectives (docs/python.md). ---

  // A sparse COO all-reduce (sum), as Gloo does it: every rank's coalesced
  // indices and values are all-gathered (padded to the largest count), and
  // their sum replaces the tensor.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    return allreduce(tensors, opts);
  }

  // Several tensors of one element type reduced as one buffer.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return Guarded("all_reduce_coalesced", [&] {
      OneType(tensors);
      const RedOp op = OpOf(opts.reduceOp);
      std::vector<at::Tensor> ts = tensors;
      return Enqueue(c10d::OpType::ALLREDUCE_COALESCED, ts,
                     Named("all_reduce_coalesced", [=](collectives::Communicator& c, void* stream) {
                       at::Tensor flat = Flatten(ts);
                       absl::Status s = c.AllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                                                    TypeOf(flat), op, stream);
                       if (s.ok()) Unflatten(flat, ts);
                       return s;
                     }));
    });
  }

  // outputs[r][i] receives rank r's inputs[i]: one all-gather of every
  // rank's inputs flattened together.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    return Guarded("all_gather_coalesced", [&] {
      OneType(inputs);
      if (outputs.size() != static_cast<size_t>(size_)) {
        throw std::invalid_argument(
            absl::StrCat("cxlrt: ", outputs.size(), " output lists for ", size_, " ranks"));
      }
      std::vector<at::Tensor> outs;
      for (const auto& list : outputs) {
        if (list.size() != inputs.size()) {
          throw std::invalid_argument(absl::StrCat("cxlrt: an output list of ", list.size(),
                                                   " tensors for ", inputs.size(), " inputs"));
        }
        for (size_t i = 0; i < list.size(); ++i) {
          Same(list[i], inputs[i]);
          outs.push_back(list[i]);
        }
      }
      std::vector<at::Tensor> ins = inputs;
      return Enqueue(c10d::OpType::ALLGATHER_COALESCED, outs,
                     Named("all_gather_coalesced", [=](collectives::Communicator& c, void* stream) {
                       at::Tensor flat = Flatten(ins);
                       at::Tensor all = at::empty({size_ * flat.numel()}, flat.options());
                       absl::Status s = c.AllGather(flat.data_ptr(), all.data_ptr(), flat.numel(),
                                                    TypeOf(flat), stream);
                       if (s.ok()) {
                         const size_t k = ins.size();
                         for (int r = 0; r < size_; ++r) {
                           Unflatten(all.narrow(0, r * flat.numel(), flat.numel()),
                                     {outs.begin() + r * k, outs.begin() + (r + 1) * k});
                         }
                       }
                       return s;
                     }));
    });
  }

  // all_gather_into_tensor calls coalesced: outputs[i] (world size times
  // inputs[i]) holds every rank's inputs[i] in rank order.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    return Guarded("all_gather_into_tensor_coalesced", [&] {
      OneType(inputs);
      PairedBy(outputs, inputs, "output", "input");
      std::vector<at::Tensor> ins = inputs, outs = outputs;
      return Enqueue(c10d::OpType::COALESCED, outs,
                     Named("all_gather_into_tensor_coalesced",
                           [=](collectives::Communicator& c, void* stream) {
                             at::Tensor flat = Flatten(ins);
                             at::Tensor all = at::empty({size_, flat.numel()}, flat.options());
                             absl::Status s = c.AllGather(flat.data_ptr(), all.data_ptr(),
                                                          flat.numel(), TypeOf(flat), stream);
                             int64_t off = 0;
                             for (size_t i = 0; s.ok() && i < ins.size(); ++i) {
                               const int64_t n = ins[i].numel();
                               outs[i].view({size_, n}).copy_(all.narrow(1, off, n));
                               off += n;
                             }
                             return s;
                           }));
    });
  }

  // reduce_scatter_tensor calls coalesced: rank r gets the reduction of
  // every rank's shard r of inputs[i] (world size times outputs[i]) in
  // outputs[i]. Shard r of every input is packed together, so that one
  // reduce-scatter serves them all.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return Guarded("reduce_scatter_tensor_coalesced", [&] {
      OneType(inputs);
      PairedBy(inputs, outputs, "input", "output");
      const RedOp op = OpOf(opts.reduceOp);
      std::vector<at::Tensor> ins = inputs, outs = outputs;
      return Enqueue(
          c10d::OpType::COALESCED, outs,
          Named("reduce_scatter_tensor_coalesced", [=](collectives::Communicator& c, void* stream) {
            std::vector<at::Tensor> shards;
            for (const at::Tensor& t : ins) shards.push_back(t.reshape({size_, -1}));
            at::Tensor packed = at::cat(shards, 1).contiguous();
            at::Tensor mine = at::empty({packed.size(1)}, packed.options());
            absl::Status s = c.ReduceScatter(packed.data_ptr(), mine.data_ptr(), mine.numel(),
                                             TypeOf(mine), op, stream);
            if (s.ok()) Unflatten(mine, outs);
            return s;
          }));
    });
  }

  // Gloo's contract: every rank but 0 reports to rank 0, which waits up to
  // the timeout for each and names the first that did not come (every one,
  // with wait_all_ranks); then it answers every rank. Through the group's
  // store (keys per call), so the communicator is not involved and a
  // missing rank does not abort it.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
    const std::string prefix = absl::StrCat("cxlrt/monitored_barrier/", ++monitored_barriers_, "/");
    auto fail = [&](const std::string& why) {
      throw std::runtime_error(absl::StrCat("cxlrt: [Rank ", rank_, "] monitored_barrier: ", why));
    };
    if (rank_ != 0) {
      store_->set(absl::StrCat(prefix, rank_), std::vector<uint8_t>{1});
      std::vector<uint8_t> answer;
      try {
        store_->wait({prefix + "done"}, std::max(timeout, timeout_));
        answer = store_->get(prefix + "done");
      } catch (const std::exception& e) {
        fail(absl::StrCat("Rank ", rank_,
                          " reached monitoredBarrier but Timed out waiting for "
                          "rank 0's answer: ",
                          e.what()));
      }
      if (!answer.empty() && answer[0] != 0) {
        fail(absl::StrCat("Rank ", rank_,
                          " successfully reached monitoredBarrier, but rank 0 "
                          "reported: ",
                          std::string(answer.begin() + 1, answer.end())));
      }
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<int> missing;
    for (int r = 1; r < size_; ++r) {
      const std::string key = absl::StrCat(prefix, r);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      bool came = store_->check({key});
      if (!came && left.count() > 0) {
        try {
          store_->wait({key}, left);
          came = true;
        } catch (const std::exception&) {
        }
      }
      if (!came) {
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
    }
    std::string why;
    if (missing.size() == 1 && !wait_all_ranks) {
      why = absl::StrCat("Rank ", missing[0], " failed to pass monitoredBarrier in ",
                         timeout.count(), " ms");
    } else if (!missing.empty()) {
      why = absl::StrCat("Ranks ", absl::StrJoin(missing, ", "),
                         " failed to pass monitoredBarrier in ", timeout.count(), " ms");
    }
    std::vector<uint8_t> answer{static_cast<uint8_t>(why.empty() ? 0 : 1)};
    answer.insert(answer.end(), why.begin(), why.end());
    store_->set(prefix + "done", answer);
    if (!why.empty()) fail(why);
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
    bool queued;
    {
      std::lock_guard<std::mutex> l(mu_);
      busy_ = false;
      queued = !jobs_.empty();
    }
    // The worker waits only for queued calls: waking it for none costs two
    // context switches per call, most of a small call's time (docs/python.md).
    if (queued) cv_.notify_one();
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

  // --- Helpers of the collectives: names in errors, argument checks, packing. ---

  // Runs an override's checks and enqueueing; an error it throws names the
  // rank and the call ("cxlrt: [Rank 1] all_to_all: ...").
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> Guarded(const char* call, Body&& body) {
    try {
      return body();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(Prefixed(call, e.what()));
    } catch (const std::exception& e) {
      throw std::runtime_error(Prefixed(call, e.what()));
    }
  }
  std::string Prefixed(const char* call, absl::string_view what) const {
    absl::ConsumePrefix(&what, "cxlrt: ");
    return absl::StrCat("cxlrt: [Rank ", rank_, "] ", call, ": ", what);
  }
  // A call's body whose failure names the rank and the call; a deadline is
  // worded as torch's own backends word a timeout ("Timed out", which
  // torch's tooling matches case-sensitively as " (Timed out|closed|timeout) ").
  template <typename Fn>
  std::function<absl::Status(collectives::Communicator&, void*)> Named(const char* call, Fn fn) {
    return [this, call, fn](collectives::Communicator& c, void* stream) -> absl::Status {
      absl::Status s;
      try {
        s = fn(c, stream);
      } catch (const std::exception& e) {
        s = absl::InternalError(e.what());
      }
      if (s.ok()) return s;
      if (absl::IsDeadlineExceeded(s)) {
        return absl::Status(
            s.code(), absl::StrCat("[Rank ", rank_, "] ", call, ": Timed out waiting ",
                                   timeout_.count(), "ms for the other ranks (", s.message(), ")"));
      }
      return absl::Status(s.code(), absl::StrCat("[Rank ", rank_, "] ", call, ": ", s.message()));
    };
  }

  // Counts and displacements, in elements, of the row splits of `t`
  // (all_to_all_single: none given means even).
  void RowSplits(const at::Tensor& t, const std::vector<int64_t>& splits, const char* which,
                 std::vector<size_t>& counts, std::vector<size_t>& displs) const {
    if (t.dim() == 0)
      throw std::invalid_argument(absl::StrCat("cxlrt: the ", which, " is a scalar"));
    const int64_t rows = t.size(0), row = c10::multiply_integers(t.sizes().slice(1));
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      if (rows % size_ != 0) {
        throw std::invalid_argument(absl::StrCat(
            "cxlrt: the ", which, "'s ", rows, " rows do not split evenly over ", size_, " ranks"));
      }
      s.assign(size_, rows / size_);
    }
    if (s.size() != static_cast<size_t>(size_)) {
      throw std::invalid_argument(
          absl::StrCat("cxlrt: ", s.size(), " ", which, " split sizes for ", size_, " ranks"));
    }
    int64_t at_row = 0;
    for (int64_t v : s) {
      if (v < 0) {
        throw std::invalid_argument(absl::StrCat("cxlrt: a negative ", which, " split size: ", v));
      }
      counts.push_back(v * row);
      displs.push_back(at_row * row);
      at_row += v;
    }
    if (at_row != rows) {
      throw std::invalid_argument(absl::StrCat("cxlrt: the ", which, " split sizes sum to ", at_row,
                                               " but its first dimension is ", rows));
    }
  }
  static bool Overlap(const at::Tensor& a, const at::Tensor& b) {
    const auto* pa = static_cast<const char*>(a.data_ptr());
    const auto* pb = static_cast<const char*>(b.data_ptr());
    return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
  }
  // At least one tensor; all dense, of one element type and device.
  static void OneType(const std::vector<at::Tensor>& ts) {
    if (ts.empty()) throw std::invalid_argument("cxlrt: no tensors");
    for (const at::Tensor& t : ts) {
      CheckTensor(t);
      TypeOf(t);
      if (t.scalar_type() != ts[0].scalar_type() || t.device() != ts[0].device()) {
        throw std::invalid_argument(absl::StrCat(
            "cxlrt: the tensors must be of one type and device: ", c10::toString(t.scalar_type()),
            " on ", t.device().str(), " beside ", c10::toString(ts[0].scalar_type()), " on ",
            ts[0].device().str()));
      }
    }
  }
  // big[i] holds world size times small[i], of its type.
  void PairedBy(const std::vector<at::Tensor>& big, const std::vector<at::Tensor>& small,
                const char* bigname, const char* smallname) const {
    if (big.size() != small.size()) {
      throw std::invalid_argument(absl::StrCat("cxlrt: ", big.size(), " ", bigname, "s for ",
                                               small.size(), " ", smallname, "s"));
    }
    for (size_t i = 0; i < big.size(); ++i) {
      CheckTensor(big[i]);
      if (big[i].numel() != small[i].numel() * size_ ||
          big[i].scalar_type() != small[i].scalar_type()) {
        throw std::invalid_argument(absl::StrCat("cxlrt: ", bigname, " ", i,
                                                 " must hold world size times ", smallname, " ", i,
                                                 " of its type"));
      }
    }
  }
  static at::Tensor Flatten(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : ts) flat.push_back(t.reshape(-1));
    return at::cat(flat);
  }
  static void Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
    int64_t off = 0;
    for (const at::Tensor& t : ts) {
      t.view(-1).copy_(flat.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }

  c10::intrusive_ptr<c10d::Work> SparseAllreduce(const at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts) {
    if (opts.reduceOp != c10d::ReduceOp::SUM) {
      throw std::invalid_argument("cxlrt: a sparse tensor's all_reduce sums only (as Gloo's)");
    }
    if (!tensor.device().is_cpu()) {
      throw std::invalid_argument("cxlrt: sparse tensors are all-reduced on the CPU only");
    }
    TypeOf(tensor);
    at::Tensor t = tensor;
    return Enqueue(
        c10d::OpType::ALLREDUCE, {t},
        Named("all_reduce", [=](collectives::Communicator& c, void* stream) -> absl::Status {
          const at::Tensor in = t.coalesce();
          const at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
          const int64_t nnz = in._nnz(), sparse_dim = in.sparse_dim();
          const int64_t dense = c10::multiply_integers(val.sizes().slice(1));
          // Every rank's count, then every rank's indices and values padded to the largest.
          at::Tensor counts = at::empty({size_}, at::kLong);
          int64_t mine = nnz;
          absl::Status s = c.AllGather(&mine, counts.data_ptr(), 1, DataType::kInt64, stream);
          if (!s.ok()) return s;
          const int64_t most = counts.max().item<int64_t>();
          at::Tensor pidx = at::zeros({sparse_dim, most}, idx.options());
          pidx.narrow(1, 0, nnz).copy_(idx);
          at::Tensor pval = at::zeros({most * dense}, val.options());
          pval.narrow(0, 0, nnz * dense).copy_(val.reshape(-1));
          at::Tensor aidx = at::empty({size_, sparse_dim, most}, idx.options());
          s = c.AllGather(pidx.data_ptr(), aidx.data_ptr(), sparse_dim * most, DataType::kInt64,
                          stream);
          if (!s.ok()) return s;
          at::Tensor aval = at::empty({size_, most * dense}, val.options());
          s = c.AllGather(pval.data_ptr(), aval.data_ptr(), most * dense, TypeOf(val), stream);
          if (!s.ok()) return s;
          std::vector<at::Tensor> is, vs;
          int64_t total = 0;
          for (int r = 0; r < size_; ++r) {
            const int64_t n = counts[r].item<int64_t>();
            is.push_back(aidx[r].narrow(1, 0, n));
            vs.push_back(aval[r].narrow(0, 0, n * dense));
            total += n;
          }
          std::vector<int64_t> shape{total};
          for (int64_t d : val.sizes().slice(1)) shape.push_back(d);
          t.copy_(
              at::sparse_coo_tensor(at::cat(is, 1), at::cat(vs).view(shape), t.sizes()).coalesce());
          return absl::OkStatus();
        }));
  }

  // The group's store (monitored_barrier) and timeout (messages), as created.
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::chrono::milliseconds timeout_;
  uint64_t monitored_barriers_ = 0;  // calls so far: their store keys
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
