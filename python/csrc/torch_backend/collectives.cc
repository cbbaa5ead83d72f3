// The torch backend's collectives (backend.h): each override checks its
// tensors and queues the call, and the queue runs it on the group's
// communicator.
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
#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/csrc/torch_backend/backend.h"

namespace cxlrt::torch_backend {

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return Guarded("reduce", [&] {
    at::Tensor t = One(tensors);
    const RedOp op = OpOf(opts.reduceOp);
    const int root = static_cast<int>(opts.rootRank);
    return Enqueue(
        c10d::OpType::REDUCE, {t}, Named("reduce", [=](collectives::Communicator& c, void* stream) {
          return c.Reduce(t.data_ptr(), t.data_ptr(), t.numel(), TypeOf(t), op, root, stream);
        }));
  });
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions&) {
  return Guarded("all_gather_into_tensor", [&] {
    CheckTensor(input);
    CheckTensor(output);
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      throw std::invalid_argument("cxlrt: the output must hold world size times the input");
    }
    at::Tensor out = output, in = Apart(input, output, /*in_is_part=*/true);
    return Enqueue(c10d::OpType::_ALLGATHER_BASE, {out},
                   Named("all_gather_into_tensor", [=](collectives::Communicator& c, void* stream) {
                     return c.AllGather(in.data_ptr(), out.data_ptr(), in.numel(), TypeOf(in),
                                        stream);
                   }));
  });
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return Guarded("reduce_scatter_tensor", [&] {
    CheckTensor(input);
    CheckTensor(output);
    if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      throw std::invalid_argument("cxlrt: the input must hold world size times the output");
    }
    at::Tensor out = output, in = Apart(input, output, /*in_is_part=*/false);
    const RedOp op = OpOf(opts.reduceOp);
    return Enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {out},
                   Named("reduce_scatter_tensor", [=](collectives::Communicator& c, void* stream) {
                     return c.ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), TypeOf(out),
                                            op, stream);
                   }));
  });
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions&) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions&) {
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
      even =
          even && inputs[j].numel() == inputs[0].numel() && outputs[j].numel() == inputs[0].numel();
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
          absl::Status s =
              even ? c.AllToAll(flat_in.data_ptr(), flat_out.data_ptr(), n, TypeOf(flat_in), stream)
                   : c.AllToAllV(flat_in.data_ptr(), sc, sd, flat_out.data_ptr(), rc, rd,
                                 TypeOf(flat_in), stream);
          if (s.ok()) {
            for (int r = 0; r < size_; ++r) {
              outs[r].view(-1).copy_(flat_out.narrow(0, rd[r], rc[r]));
            }
          }
          return s;
        }));
  });
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::barrier(const c10d::BarrierOptions&) {
  return Guarded("barrier", [&] {
    return Enqueue(
        c10d::OpType::BARRIER, {},
        Named("barrier", [](collectives::Communicator& c, void*) { return c.Barrier(); }));
  });
}

at::Tensor CxlrtBackend::One(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != 1) throw std::invalid_argument("cxlrt: one tensor per call");
  CheckTensor(tensors[0]);
  TypeOf(tensors[0]);
  return tensors[0];
}

void CxlrtBackend::Same(const at::Tensor& t, const at::Tensor& like) {
  CheckTensor(t);
  if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
    throw std::invalid_argument("cxlrt: the tensors must match in size and type");
  }
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::Enqueue(
    c10d::OpType type, std::vector<at::Tensor> outputs,
    std::function<absl::Status(void* stream)> run) {
  std::optional<c10::Stream> stream = StreamOf(outputs);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) throw std::runtime_error("cxlrt: the process group was shut down");
  }
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

void CxlrtBackend::Execute(const Job& job) {
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

void CxlrtBackend::Run() {
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

std::string CxlrtBackend::Prefixed(const char* call, absl::string_view what) const {
  absl::ConsumePrefix(&what, "cxlrt: ");
  return absl::StrCat("cxlrt: [Rank ", rank_, "] ", call, ": ", what);
}

void CxlrtBackend::RowSplits(const at::Tensor& t, const std::vector<int64_t>& splits,
                             const char* which, std::vector<size_t>& counts,
                             std::vector<size_t>& displs) const {
  if (t.dim() == 0) throw std::invalid_argument(absl::StrCat("cxlrt: the ", which, " is a scalar"));
  const int64_t rows = t.size(0), row = c10::multiply_integers(t.sizes().slice(1));
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    if (rows % size_ != 0) {
      throw std::invalid_argument(absl::StrCat("cxlrt: the ", which, "'s ", rows,
                                               " rows do not split evenly over ", size_, " ranks"));
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

bool CxlrtBackend::Overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

at::Tensor CxlrtBackend::Apart(const at::Tensor& in, const at::Tensor& out, bool in_is_part) const {
  if (!Overlap(in, out)) return in;
  const at::Tensor& part = in_is_part ? in : out;
  const at::Tensor& whole = in_is_part ? out : in;
  const auto* at = static_cast<const char*>(whole.data_ptr()) + rank_ * part.nbytes();
  return part.data_ptr() == at ? in : in.clone();
}

void CxlrtBackend::OneType(const std::vector<at::Tensor>& ts) {
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

void CxlrtBackend::PairedBy(const std::vector<at::Tensor>& big,
                            const std::vector<at::Tensor>& small, const char* bigname,
                            const char* smallname) const {
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

at::Tensor CxlrtBackend::Flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : ts) flat.push_back(t.reshape(-1));
  return at::cat(flat);
}

void CxlrtBackend::Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (const at::Tensor& t : ts) {
    t.view(-1).copy_(flat.narrow(0, off, t.numel()));
    off += t.numel();
  }
}

}  // namespace cxlrt::torch_backend
