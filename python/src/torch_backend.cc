// The `cxlrt` backend of torch.distributed: a c10d::Backend whose
// collectives run on a cxlrt Communicator over the pool. Built ahead of time
// by CMake against the venv's torch and libcxlrt.so (python/CMakeLists.txt;
// CXLRT_TORCH_JIT=1: at first use by torch.utils.cpp_extension), loaded by
// python/cxlrt/torch_backend.py, registered for CPU and CUDA
// tensors (a CUDA call is ordered on the caller's current stream; docs/gpu.md).
//
// Every group of a process shares one attachment to the pool (host slot,
// heartbeat, allocator; HostFor). A group has two communicators: one for
// its collectives, made at its first collective (every rank makes it then),
// and one for point to point, made with the group (a p2p call need not
// involve every rank), whose only memory is its channels.
//
// Collectives: a call runs at once in the caller's thread when nothing is
// queued or running (the common case: a wake-up of another thread costs
// 10-50 us on a busy 2-core machine, more than a 64 KiB all-reduce);
// otherwise it is queued for the backend's worker thread, which runs calls
// in order. Either way one thread at a time uses the communicator, in call
// order, and the returned Work completes, with its future, when the
// collective has. CXLRT_TORCH_ASYNC=1 queues every call (compute may then
// overlap communication where cores allow). An error fails that Work and
// every later one (the communicator is aborted, as cxlrt requires).
//
// Point to point: send, recv and recvAnysource queue the call for the
// group's p2p thread and return at once. That thread alone uses the p2p
// communicator and never waits for a peer: it sends a piece only when the
// channel has room for all of it, and receives one only when its first
// chunk is posted (whose sender then completes it without waiting), so any
// number of calls are in flight, in any order of posting on either side,
// and a rank inside a collective still moves its pending sends. A message
// is a header (tag, size, type) and then its bytes in pieces of the channel
// ring; a receive takes the next message from its peer with its tag (per
// (peer, tag) order, as Gloo's), and a message that arrives before its
// receive is posted (another tag's, or any source's) waits in a buffer.
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

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

// One attachment to a pool per process, shared by every group's backend:
// a host slot, its heartbeat thread and an allocator are a process's, not a
// group's (a pool has 64 host slots). Freed with the last backend using it.
struct SharedHost {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
  ~SharedHost() {  // in reverse order of making
    alloc.reset();
    membership.reset();
    pool.reset();
  }
};

// `who` ("rank 1 of 2") prefixes its errors.
std::shared_ptr<SharedHost> HostFor(const std::string& uri, const std::string& who) {
  // Never destroyed: backends may outlive static destruction at exit.
  static auto* mu = new std::mutex;
  static auto* hosts = new std::map<std::string, std::weak_ptr<SharedHost>>;
  std::lock_guard<std::mutex> l(*mu);
  if (std::shared_ptr<SharedHost> h = (*hosts)[uri].lock()) return h;
  auto fail = [&](const absl::Status& s, const char* what) {
    Raise(absl::Status(s.code(), absl::StrCat(who, " ", what, " ", uri, ": ", s.message())));
  };
  auto h = std::make_shared<SharedHost>();
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) fail(pool.status(), "opening the pool");
  h->pool = *std::move(pool);
  runtime::AttachOptions attach;
  attach.host_id = -1;  // any free host slot: each process is a host of its own
  auto membership = runtime::Membership::Attach(*h->pool, attach);
  if (!membership.ok()) fail(membership.status(), "attaching to");
  h->membership = *std::move(membership);
  auto alloc = allocator::Allocator::Open(*h->pool, *h->membership);
  if (!alloc.ok()) fail(alloc.status(), "opening the allocator of");
  h->alloc = *std::move(alloc);
  (*hosts)[uri] = h;
  return h;
}

// A message's first post on the channel; its bytes follow in pieces.
struct P2pHeader {
  int64_t tag;
  uint64_t bytes;
  int64_t numel;
  int64_t type;  // c10::ScalarType
};

// A pending send or receive (peer -1: a receive from any source).
struct P2pOp {
  c10::intrusive_ptr<CxlrtWork> work;
  at::Tensor tensor;
  int peer;
  int tag;
  bool header_sent = false;                     // sends
  uint64_t done = 0;                            // bytes moved (sends)
  P2pHeader header{};                           // sends: what the header says
  std::chrono::steady_clock::time_point since;  // posted, or last moved
};

// A message being received or received before its receive was posted.
struct P2pMessage {
  int peer;
  P2pHeader header;
  std::shared_ptr<P2pOp> recv;  // null while unclaimed
  at::Tensor buffer;            // its bytes when they do not go to recv's tensor
  uint64_t done = 0;
  bool complete = false;
};

class CxlrtBackend : public c10d::Backend {
 public:
  CxlrtBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout, const std::string& pool_uri)
      : Backend(rank, size), store_(store), timeout_(timeout) {
    // Rank 0 makes the pool when it does not exist, and names the
    // communicators; the others wait for both through the store (torch
    // gives each group a store of its own). A group made again after
    // destroy_process_group gets the same store keys, and the earlier
    // group's name is still there: each making of the group counts itself
    // (every rank adds 1, and no rank makes the next one before all have
    // made this one: Create below waits for all), and its name has a key
    // of its own.
    made_ = (store->add("cxlrt/made", 1) - 1) / size;
    const std::string key = absl::StrCat("cxlrt/communicator/", made_);
    if (rank == 0) {
      // Made here unless the caller made it (torch_backend.py does, so
      // that the pool goes when the job's process exits).
      auto made = runtime::Pool::Create(pool_uri);
      if (!made.ok() && !absl::IsAlreadyExists(made.status())) Raise(made.status());
      std::random_device rd;
      name_ = absl::StrCat("torch-", rd(), "-", rd());
      store->set(key, std::vector<uint8_t>(name_.begin(), name_.end()));
    } else {
      const std::vector<uint8_t> got = store->get(key);
      name_.assign(got.begin(), got.end());
    }
    host_ = HostFor(pool_uri, absl::StrCat("rank ", rank, " of ", size));
    // The p2p communicator now, while every rank is here: its calls involve
    // only two ranks. It runs no collective but Destroy's barrier, so its
    // data slots are the smallest there are. Its channels (n x n of them)
    // are 256 KiB, a quarter of the communicator's default, so that a group
    // of 2 ranks costs about 1 MiB of the pool until it runs a collective,
    // and a 1 GiB pool holds the 40 used groups Gloo makes (the collective
    // communicator's slots take 4 MiB a rank); CXLRT_COMM_P2P_BYTES sets
    // them.
    collectives::CommOptions o;
    if (timeout.count() > 0) o.timeout = absl::FromChrono(timeout);  // else the knob
    o.slot_bytes = 64;
    o.depth = collectives::kMinDepth;
    if (!collectives::kCommP2pBytes.IsSet()) o.p2p_bytes = 256 << 10;
    auto p2p = collectives::Communicator::Create(*host_->alloc, name_ + "-p2p", size, rank, o);
    if (!p2p.ok()) {
      Raise(absl::Status(p2p.status().code(),
                         absl::StrCat("rank ", rank, " of ", size, " making the group's p2p ",
                                      "communicator: ", p2p.status().message())));
    }
    p2p_ = *std::move(p2p);
    in_.resize(size);
    sends_.resize(size);
    sent_at_.resize(size);
    received_at_.resize(size);
  }

  ~CxlrtBackend() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard<std::mutex> l(p2p_mu_);
      p2p_stop_ = true;
    }
    p2p_cv_.notify_all();
    if (p2p_thread_.joinable()) p2p_thread_.join();
    comm_.reset();  // Destroy: a barrier, then rank 0 waits until every rank has left
    p2p_.reset();
    host_.reset();
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
                     Named("all_gather", [=, this](collectives::Communicator& c, void* stream) {
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
      at::Tensor out = output, in = Apart(input, output, /*in_is_part=*/true);
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
      at::Tensor out = output, in = Apart(input, output, /*in_is_part=*/false);
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
        return Enqueue(
            c10d::OpType::ALLTOALL_BASE, {out},
            Named("all_to_all_single", [=, this](collectives::Communicator& c, void* stream) {
              return c.AllToAll(in.data_ptr(), out.data_ptr(), in.numel() / size_, TypeOf(in),
                                stream);
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
          Named("all_to_all", [=, this](collectives::Communicator& c, void* stream) {
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
                     Named("gather", [=, this](collectives::Communicator& c, void* stream) {
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
      return Enqueue(
          c10d::OpType::ALLGATHER_COALESCED, outs,
          Named("all_gather_coalesced", [=, this](collectives::Communicator& c, void* stream) {
            at::Tensor flat = Flatten(ins);
            at::Tensor all = at::empty({size_ * flat.numel()}, flat.options());
            absl::Status s =
                c.AllGather(flat.data_ptr(), all.data_ptr(), flat.numel(), TypeOf(flat), stream);
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
                           [=, this](collectives::Communicator& c, void* stream) {
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
      return Enqueue(c10d::OpType::COALESCED, outs,
                     Named("reduce_scatter_tensor_coalesced",
                           [=, this](collectives::Communicator& c, void* stream) {
                             std::vector<at::Tensor> shards;
                             for (const at::Tensor& t : ins)
                               shards.push_back(t.reshape({size_, -1}));
                             at::Tensor packed = at::cat(shards, 1).contiguous();
                             at::Tensor mine = at::empty({packed.size(1)}, packed.options());
                             absl::Status s =
                                 c.ReduceScatter(packed.data_ptr(), mine.data_ptr(), mine.numel(),
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
    const std::string prefix =
        absl::StrCat("cxlrt/monitored_barrier/", made_, "/", ++monitored_barriers_, "/");
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
    // One byte (1: failed) and the message.
    const std::string text = std::string(1, why.empty() ? '\0' : '\1') + why;
    const std::vector<uint8_t> answer(text.begin(), text.end());
    store_->set(prefix + "done", answer);
    if (!why.empty()) fail(why);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    at::Tensor t = OneOfAnyType(tensors);
    CheckPeer(dst, "send to");
    return PostP2p(c10d::OpType::SEND, t, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    at::Tensor t = OneOfAnyType(tensors);
    CheckPeer(src, "recv from");
    return PostP2p(c10d::OpType::RECV, t, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    at::Tensor t = OneOfAnyType(tensors);
    if (size_ < 2) {
      throw std::invalid_argument(
          absl::StrCat("cxlrt: rank ", rank_, ": recv from any source in a group of one rank"));
    }
    return PostP2p(c10d::OpType::RECVANYSOURCE, t, -1, tag);
  }

  // Collectives called so far (equal on every rank of a group that calls
  // the same collectives; torch's desync checks compare them).
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  static c10::intrusive_ptr<c10d::Backend> Create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& pool_uri) {
    return c10::make_intrusive<CxlrtBackend>(store, rank, size, timeout, pool_uri);
  }

 private:
  struct Job {
    c10::intrusive_ptr<CxlrtWork> work;
    std::function<absl::Status(void* stream)> run;  // Named: makes the communicator first
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

  c10::intrusive_ptr<c10d::Work> Enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<absl::Status(void* stream)> run) {
    std::optional<c10::Stream> stream = StreamOf(outputs);
    auto work = c10::make_intrusive<CxlrtWork>(rank_, type, std::move(outputs), stream);
    ++seq_;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (always_queue_ || busy_ || !jobs_.empty()) {
        // The worker starts with the first queued call: a group that is
        // never used, or used one call at a time, costs no thread.
        if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
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
      absl::Status s = job.run(stream ? stream->native_handle() : nullptr);
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
  // A call's body, run on the group's communicator (made at the first
  // call), whose failure names the rank and the call, making the
  // communicator included; a deadline is worded as torch's own backends
  // word a timeout ("Timed out", which torch's tooling matches
  // case-sensitively as " (Timed out|closed|timeout) ").
  template <typename Fn>
  std::function<absl::Status(void*)> Named(const char* call, Fn fn) {
    return [this, call, fn](void* stream) -> absl::Status {
      absl::Status s;
      try {
        absl::StatusOr<collectives::Communicator*> c = Comm();
        s = c.ok() ? fn(**c, stream) : c.status();
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
  // The input of an all-gather (`in_is_part`: it is one rank's part of the
  // output) or of a reduce-scatter (the output is one part of it): itself
  // when apart from the output or in NCCL's in-place form (this rank's part
  // is the smaller one), which the collectives read correctly; otherwise a
  // copy, since the output would overwrite input bytes not yet read.
  at::Tensor Apart(const at::Tensor& in, const at::Tensor& out, bool in_is_part) const {
    if (!Overlap(in, out)) return in;
    const at::Tensor& part = in_is_part ? in : out;
    const at::Tensor& whole = in_is_part ? out : in;
    const auto* at = static_cast<const char*>(whole.data_ptr()) + rank_ * part.nbytes();
    return part.data_ptr() == at ? in : in.clone();
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
        Named("all_reduce", [=, this](collectives::Communicator& c, void* stream) -> absl::Status {
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

  // The collective communicator, made at the group's first collective
  // (every rank calls it); a failure to make it answers every later call.
  // REQUIRES: the caller runs calls (busy_).
  absl::StatusOr<collectives::Communicator*> Comm() {
    if (comm_) return comm_.get();
    if (!comm_status_.ok()) return comm_status_;
    collectives::CommOptions o;
    if (timeout_.count() > 0) o.timeout = absl::FromChrono(timeout_);  // else the knob
    o.p2p_bytes = 256;  // the smallest channels: its Send/Recv are unused
    auto comm = collectives::Communicator::Create(*host_->alloc, name_, size_, rank_, o);
    if (!comm.ok()) {
      comm_status_ = absl::Status(
          comm.status().code(),
          absl::StrCat("making the group's communicator (rank ", rank_, " of ", size_,
                       ", at the group's first collective): ", comm.status().message()));
      return comm_status_;
    }
    comm_ = *std::move(comm);
    return comm_.get();
  }

  // Point to point moves bytes: any element type, as Gloo's.
  static at::Tensor OneOfAnyType(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() != 1) throw std::invalid_argument("cxlrt: one tensor per call");
    CheckTensor(tensors[0]);
    return tensors[0];
  }

  void CheckPeer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw std::invalid_argument(absl::StrCat("cxlrt: rank ", rank_, ": ", what, " rank ", peer,
                                               ": not another rank of this group of ", size_));
    }
  }

  // "rank 1: recv from rank 0 (tag 3, 4096 bytes)": who, what, with whom.
  std::string Describe(const P2pOp& op, bool send) const {
    return absl::StrCat("rank ", rank_, ": ", send ? "send to rank " : "recv from ",
                        send          ? absl::StrCat(op.peer)
                        : op.peer < 0 ? std::string("any source")
                                      : absl::StrCat("rank ", op.peer),
                        " (tag ", op.tag, ", ", op.tensor.defined() ? op.tensor.nbytes() : 0,
                        " bytes)");
  }

  c10::intrusive_ptr<c10d::Work> PostP2p(c10d::OpType type, const at::Tensor& t, int peer,
                                         int tag) {
    auto op = std::make_shared<P2pOp>();
    op->work =
        c10::make_intrusive<CxlrtWork>(rank_, type, std::vector<at::Tensor>{t}, StreamOf({t}));
    op->tensor = t;
    op->peer = peer;
    op->tag = tag;
    op->since = std::chrono::steady_clock::now();
    const bool send = type == c10d::OpType::SEND;
    if (send) {
      op->header = {tag, t.nbytes(), t.numel(), static_cast<int64_t>(t.scalar_type())};
    }
    {
      std::lock_guard<std::mutex> l(p2p_mu_);
      if (p2p_stop_) throw std::runtime_error("cxlrt: the process group is being destroyed");
      inbox_.push_back({send, op});
      if (!p2p_thread_.joinable()) p2p_thread_ = std::thread([this] { P2pRun(); });
    }
    p2p_cv_.notify_one();
    return op->work;
  }

  // Completes `op` (error: null for success); CUDA ops on their stream.
  void Complete(P2pOp& op, std::exception_ptr error, int source = -1) {
    const std::optional<c10::Stream>& stream = op.work->stream();
    std::optional<c10::StreamGuard> on;
    if (stream) on.emplace(*stream);
    if (source >= 0) op.work->SetSource(source);
    op.work->Finish(error);
  }
  void Fail(P2pOp& op, bool send, absl::string_view why) {
    Complete(op, std::make_exception_ptr(
                     std::runtime_error(absl::StrCat("cxlrt: ", Describe(op, send), ": ", why))));
  }

  // The p2p thread: takes posted calls, moves what can move without
  // waiting for a peer, and when nothing could: yields for 1 ms after the
  // last move (a peer amid a message moves again within microseconds), then
  // naps, from 10 us up to 200 us (a peer's post wakes nobody, so the nap
  // bounds a message's latency), or sleeps until a call is posted when none
  // is pending.
  void P2pRun() {
    using Clock = std::chrono::steady_clock;
    Clock::time_point moved = Clock::now();
    int naps = 0;
    for (;;) {
      std::deque<std::pair<bool, std::shared_ptr<P2pOp>>> posted;
      {
        std::unique_lock<std::mutex> l(p2p_mu_);
        if (!p2p_stop_ && inbox_.empty()) {
          if (!Pending()) {
            p2p_cv_.wait(l, [&] { return p2p_stop_ || !inbox_.empty(); });
          } else if (Clock::now() - moved > std::chrono::milliseconds(1)) {
            const auto nap = std::chrono::microseconds(std::min(200, 10 << std::min(naps++, 5)));
            p2p_cv_.wait_for(l, nap, [&] { return p2p_stop_ || !inbox_.empty(); });
          }
        }
        if (p2p_stop_) break;
        posted.swap(inbox_);
      }
      if (!posted.empty()) moved = Clock::now();
      for (auto& [send, op] : posted) {
        if (!p2p_error_.empty()) {
          Fail(*op, send, p2p_error_);
        } else if (send) {
          sends_[op->peer].push_back(op);
        } else {
          PostRecv(op);
        }
      }
      if (Step()) {
        moved = Clock::now();
        naps = 0;
      } else {
        std::this_thread::yield();
      }
    }
    // Destroyed with calls pending: they fail rather than hang.
    const char* why = "the process group was destroyed with this call pending";
    for (auto& [send, op] : inbox_) Fail(*op, send, why);
    inbox_.clear();
    FailAll(why);
  }

  bool Pending() const {
    for (const auto& q : sends_) {
      if (!q.empty()) return true;
    }
    for (const auto& m : in_) {
      if (m) return true;
    }
    return !recvs_.empty();
  }

  void FailAll(absl::string_view why) {
    for (auto& q : sends_) {
      for (auto& op : q) Fail(*op, true, why);
      q.clear();
    }
    for (auto& m : in_) {
      if (m && m->recv) Fail(*m->recv, false, why);
      m.reset();
    }
    for (auto& m : unexpected_) {
      if (m->recv) Fail(*m->recv, false, why);
    }
    unexpected_.clear();
    for (auto& op : recvs_) Fail(*op, false, why);
    recvs_.clear();
  }

  // The p2p communicator failed (it is aborted): every call fails with it.
  void Broken(const P2pOp& op, bool send, const absl::Status& s) {
    p2p_error_ =
        absl::StrCat("p2p broken by an earlier failure: ", Describe(op, send), ": ", s.ToString());
    FailAll(p2p_error_);
  }

  static bool Matches(const P2pOp& recv, const P2pMessage& m) {
    return (recv.peer < 0 || recv.peer == m.peer) && recv.tag == m.header.tag;
  }

  // A posted receive takes the first message that arrived for it, else
  // waits, in posting order, for one.
  void PostRecv(const std::shared_ptr<P2pOp>& op) {
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (!Matches(*op, **it)) continue;
      std::shared_ptr<P2pMessage> m = *it;
      unexpected_.erase(it);
      m->recv = op;
      if (m->complete) Deliver(*m);  // else when its last piece arrives
      return;
    }
    recvs_.push_back(op);
  }

  // A complete message: to its receive, copied from the buffer if it went
  // there, or an error when the sizes differ.
  void Deliver(P2pMessage& m) {
    P2pOp& op = *m.recv;
    const P2pHeader& h = m.header;
    if (h.bytes != op.tensor.nbytes() || h.type != static_cast<int64_t>(op.tensor.scalar_type())) {
      return Fail(op, false,
                  absl::StrCat("rank ", m.peer, " sent ", h.numel, " elements of ",
                               c10::toString(static_cast<c10::ScalarType>(h.type)), " (", h.bytes,
                               " bytes) but this receive is of ", op.tensor.numel(), " ",
                               c10::toString(op.tensor.scalar_type())));
    }
    if (m.buffer.defined() && h.bytes > 0) {
      const std::optional<c10::Stream>& stream = op.work->stream();
      std::optional<c10::StreamGuard> on;
      if (stream) on.emplace(*stream);
      op.tensor.reshape({-1}).view(at::kByte).copy_(m.buffer);
    }
    Complete(op, nullptr, m.peer);
  }

  // Where message m's bytes go: the receive's tensor when matched with the
  // right size and type, else the buffer.
  uint8_t* Destination(P2pMessage& m) {
    if (m.recv && !m.buffer.defined() && m.header.bytes == m.recv->tensor.nbytes() &&
        m.header.type == static_cast<int64_t>(m.recv->tensor.scalar_type())) {
      return static_cast<uint8_t*>(m.recv->tensor.data_ptr());
    }
    if (!m.buffer.defined()) {
      m.buffer = at::empty({static_cast<int64_t>(m.header.bytes)}, at::kByte);
    }
    return m.buffer.data_ptr<uint8_t>();
  }

  // Moves whatever can move without waiting for a peer; true if anything did.
  bool Step() {
    bool moved = false;
    const uint64_t piece = p2p_->p2p_bytes();
    for (int p = 0; p < size_ && p2p_error_.empty(); ++p) {
      if (p == rank_) continue;
      // Sends to p, in posting order: header, then pieces, each only when
      // the channel has room for all of it.
      auto& q = sends_[p];
      while (!q.empty() && p2p_error_.empty()) {
        P2pOp& op = *q.front();
        if (!op.header_sent) {
          if (!p2p_->SendFits(p, sizeof(P2pHeader))) break;
          if (absl::Status s =
                  p2p_->Send(&op.header, sizeof(P2pHeader), collectives::DataType::kUint8, p);
              !s.ok()) {
            Broken(op, true, s);
            return true;
          }
          op.header_sent = moved = true;
          sent_at_[p] = std::chrono::steady_clock::now();
        }
        const uint64_t bytes = op.header.bytes;
        bool blocked = false;
        while (op.done < bytes) {
          const uint64_t len = std::min(piece, bytes - op.done);
          if (!p2p_->SendFits(p, len)) {
            blocked = true;
            break;
          }
          const std::optional<c10::Stream>& stream = op.work->stream();
          std::optional<c10::StreamGuard> on;
          if (stream) on.emplace(*stream);
          if (absl::Status s = p2p_->Send(
                  static_cast<const uint8_t*>(op.tensor.data_ptr()) + op.done, len,
                  collectives::DataType::kUint8, p, stream ? stream->native_handle() : nullptr);
              !s.ok()) {
            Broken(op, true, s);
            return true;
          }
          op.done += len;
          moved = true;
          sent_at_[p] = std::chrono::steady_clock::now();
        }
        if (blocked) break;
        Complete(op, nullptr);
        q.pop_front();
        sent_at_[p] = std::chrono::steady_clock::now();  // the next one's wait starts now
      }
      if (!p2p_error_.empty()) break;
      // Receives from p: a header only while a posted receive could take
      // a message from p (messages for no receive wait in the channel).
      if (!in_[p] && Wanted(p) && p2p_->RecvReady(p)) {
        auto m = std::make_shared<P2pMessage>();
        m->peer = p;
        if (absl::Status s =
                p2p_->Recv(&m->header, sizeof(P2pHeader), collectives::DataType::kUint8, p);
            !s.ok()) {
          P2pOp none;
          none.peer = p;
          none.tag = -1;
          Broken(none, false, s);
          return true;
        }
        moved = true;
        received_at_[p] = std::chrono::steady_clock::now();
        Arrived(m);
        in_[p] = m;
      }
      while (in_[p] && p2p_error_.empty()) {
        P2pMessage& m = *in_[p];
        if (m.done < m.header.bytes) {
          if (!p2p_->RecvReady(p)) break;
          const uint64_t len = std::min(piece, m.header.bytes - m.done);
          uint8_t* to = Destination(m) + m.done;
          const bool direct = !m.buffer.defined();
          std::optional<c10::Stream> stream;
          if (direct) stream = m.recv->work->stream();
          std::optional<c10::StreamGuard> on;
          if (stream) on.emplace(*stream);
          if (absl::Status s = p2p_->Recv(to, len, collectives::DataType::kUint8, p,
                                          stream ? stream->native_handle() : nullptr);
              !s.ok()) {
            P2pOp none;
            none.peer = p;
            none.tag = static_cast<int>(m.header.tag);
            Broken(m.recv ? *m.recv : none, false, s);
            return true;
          }
          m.done += len;
          moved = true;
          received_at_[p] = std::chrono::steady_clock::now();
          continue;
        }
        m.complete = true;
        if (m.recv) Deliver(m);
        in_[p].reset();
      }
    }
    if (p2p_error_.empty()) Expire();
    return moved;
  }

  // A posted receive could take the next message from p.
  bool Wanted(int p) const {
    for (const auto& op : recvs_) {
      if (op->peer < 0 || op->peer == p) return true;
    }
    return false;
  }

  // A header arrived: the first posted receive that matches takes the
  // message, unless an earlier message of that peer and tag still waits
  // for one (per (peer, tag) order); else it is buffered.
  void Arrived(const std::shared_ptr<P2pMessage>& m) {
    for (const auto& u : unexpected_) {
      if (u->peer == m->peer && u->header.tag == m->header.tag) {
        unexpected_.push_back(m);
        return;
      }
    }
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if (Matches(**it, *m)) {
        m->recv = *it;
        recvs_.erase(it);
        return;
      }
    }
    unexpected_.push_back(m);
  }

  // A call fails when neither it nor its channel has moved for the group's
  // timeout. One not yet begun on the channel fails alone; one cut in the
  // middle leaves the channel unusable, so every call fails then.
  void Expire() {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point now = Clock::now();
    const std::string why =
        absl::StrCat("Timed out after ", timeout_.count(), " ms: the peer did not take part");
    for (int p = 0; p < size_; ++p) {
      auto& q = sends_[p];
      if (q.empty() || now - std::max(q.front()->since, sent_at_[p]) <= timeout_) continue;
      P2pOp& op = *q.front();
      if (op.header_sent) {
        p2p_->Abort(absl::StrCat(Describe(op, true), ": ", why));
        return Broken(op, true, absl::DeadlineExceededError(why));
      }
      Fail(op, true, why);
      q.pop_front();
    }
    for (int p = 0; p < size_; ++p) {
      if (in_[p] && in_[p]->recv && now - received_at_[p] > timeout_) {
        P2pOp& op = *in_[p]->recv;
        p2p_->Abort(absl::StrCat(Describe(op, false), ": ", why));
        return Broken(op, false, absl::DeadlineExceededError(why));
      }
    }
    for (auto it = recvs_.begin(); it != recvs_.end();) {
      Clock::time_point moved = (*it)->since;
      for (int p = 0; p < size_; ++p) {
        if ((*it)->peer < 0 || (*it)->peer == p) moved = std::max(moved, received_at_[p]);
      }
      if (now - moved > timeout_) {
        Fail(**it, false, why);
        it = recvs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The group's store (monitored_barrier), as created.
  const c10::intrusive_ptr<c10d::Store> store_;
  uint64_t monitored_barriers_ = 0;  // calls so far: their store keys
  int64_t made_ = 0;                 // this making of the group's store keys (the constructor)
  const std::chrono::milliseconds timeout_;
  std::string name_;  // of the communicators, rank 0's choice
  std::shared_ptr<SharedHost> host_;
  std::unique_ptr<collectives::Communicator> comm_;  // at the first collective
  absl::Status comm_status_;                         // making comm_ failed
  std::atomic<uint64_t> seq_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool busy_ = false;  // a call is running (in the worker or a caller)
  bool stop_ = false;
  const bool always_queue_ = runtime::kTorchAsync.Get();
  std::thread worker_;  // at the first queued call

  // Point to point. The posting threads touch only inbox_ and p2p_stop_
  // (under p2p_mu_); the rest is the p2p thread's.
  std::unique_ptr<collectives::Communicator> p2p_;
  std::mutex p2p_mu_;
  std::condition_variable p2p_cv_;
  std::deque<std::pair<bool, std::shared_ptr<P2pOp>>> inbox_;  // (send?, call)
  bool p2p_stop_ = false;
  std::thread p2p_thread_;                                 // at the first p2p call
  std::vector<std::deque<std::shared_ptr<P2pOp>>> sends_;  // per peer, in order
  std::deque<std::shared_ptr<P2pOp>> recvs_;               // posted, no message yet, in order
  std::vector<std::shared_ptr<P2pMessage>> in_;            // per peer: the message arriving
  std::deque<std::shared_ptr<P2pMessage>> unexpected_;     // arrived before their receive
  std::string p2p_error_;                                  // the p2p communicator failed: why
  // Per peer: when a send to it or a receive from it last moved.
  std::vector<std::chrono::steady_clock::time_point> sent_at_, received_at_;
};

// The group torch_backend.py hands torch: torch's ProcessGroup named
// "cxlrt". Torch makes a plugin's group a ProcessGroup of type CUSTOM, whose
// getBackendName() ("custom") DDP's logger records
// (torch/csrc/distributed/c10d/logger.cpp: strs_map["backend_name"]).
class CxlrtProcessGroup : public c10d::ProcessGroup {
 public:
  using c10d::ProcessGroup::ProcessGroup;
  const std::string getBackendName() const override { return "cxlrt"; }
};

}  // namespace
}  // namespace cxlrt::torch_backend

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create", &cxlrt::torch_backend::CxlrtBackend::Create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("pool"),
        "A cxlrt c10d backend for rank `rank` of `size` over the pool `pool`.");
  py::class_<cxlrt::torch_backend::CxlrtProcessGroup, c10d::ProcessGroup,
             c10::intrusive_ptr<cxlrt::torch_backend::CxlrtProcessGroup>>(m, "ProcessGroup",
                                                                          py::dynamic_attr())
      .def(py::init<c10::intrusive_ptr<c10d::Store>, int, int>(), py::arg("store"), py::arg("rank"),
           py::arg("size"));
}
