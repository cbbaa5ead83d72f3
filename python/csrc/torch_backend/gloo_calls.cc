// The calls Gloo answers beyond the basic collectives (backend.h,
// docs/python.md): sparse all-reduce, the coalesced calls, and
// monitored_barrier through the group's store.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "python/csrc/torch_backend/backend.h"

namespace cxlrt::torch_backend {

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return Guarded("reduce_scatter_tensor_coalesced", [&] {
    OneType(inputs);
    PairedBy(inputs, outputs, "input", "output");
    const RedOp op = OpOf(opts.reduceOp);
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return Enqueue(c10d::OpType::COALESCED, outs,
                   Named("reduce_scatter_tensor_coalesced",
                         [=, this](collectives::Communicator& c, void* stream) {
                           std::vector<at::Tensor> shards;
                           for (const at::Tensor& t : ins) shards.push_back(t.reshape({size_, -1}));
                           at::Tensor packed = at::cat(shards, 1).contiguous();
                           at::Tensor mine = at::empty({packed.size(1)}, packed.options());
                           absl::Status s = c.ReduceScatter(packed.data_ptr(), mine.data_ptr(),
                                                            mine.numel(), TypeOf(mine), op, stream);
                           if (s.ok()) Unflatten(mine, outs);
                           return s;
                         }));
  });
}

void CxlrtBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
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
    why = absl::StrCat("Rank ", missing[0], " failed to pass monitoredBarrier in ", timeout.count(),
                       " ms");
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

c10::intrusive_ptr<c10d::Work> CxlrtBackend::SparseAllreduce(const at::Tensor& tensor,
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

}  // namespace cxlrt::torch_backend
