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
// The class is declared here and defined by role: making and ending a
// group (process_group.cc), the collectives and the queue that runs them
// (collectives.cc), the calls Gloo answers beyond those (gloo_calls.cc),
// and point to point on the group's p2p thread (p2p.cc). Its Work and
// future: work.h. Thread safety: one thread at a time runs collectives (the
// caller or the worker, busy_); the p2p thread alone moves p2p calls;
// posting a call is safe from any thread.
#ifndef CXLRT_PYTHON_CSRC_TORCH_BACKEND_BACKEND_H_
#define CXLRT_PYTHON_CSRC_TORCH_BACKEND_BACKEND_H_

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "python/csrc/torch_backend/tensors.h"
#include "python/csrc/torch_backend/work.h"

namespace cxlrt::torch_backend {

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

// The process's attachment to the pool `uri`, made at its first use and
// shared while a backend holds it. `who` ("rank 1 of 2") prefixes its
// errors, thrown as std::runtime_error. Any thread.
std::shared_ptr<SharedHost> HostFor(const std::string& uri, const std::string& who);

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
               std::chrono::milliseconds timeout, const std::string& pool_uri);

  ~CxlrtBackend() override;

  const std::string getBackendName() const override { return "cxlrt"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override;

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;

  // all_to_all_single: split sizes count rows (dim 0); none given: even.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override;

  // all_to_all of tensor lists: tensors of one type, of any sizes (uneven:
  // MoE dispatch and combine) through AllToAllV; all of one size through
  // AllToAll (a round fewer).
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override;

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override;

  // --- Calls Gloo answers beyond the basic collectives (docs/python.md). ---

  // A sparse COO all-reduce (sum), as Gloo does it: every rank's coalesced
  // indices and values are all-gathered (padded to the largest count), and
  // their sum replaces the tensor.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;

  // Several tensors of one element type reduced as one buffer.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;

  // outputs[r][i] receives rank r's inputs[i]: one all-gather of every
  // rank's inputs flattened together.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override;

  // all_gather_into_tensor calls coalesced: outputs[i] (world size times
  // inputs[i]) holds every rank's inputs[i] in rank order.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override;

  // reduce_scatter_tensor calls coalesced: rank r gets the reduction of
  // every rank's shard r of inputs[i] (world size times outputs[i]) in
  // outputs[i]. Shard r of every input is packed together, so that one
  // reduce-scatter serves them all.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // Gloo's contract: every rank but 0 reports to rank 0, which waits up to
  // the timeout for each and names the first that did not come (every one,
  // with wait_all_ranks); then it answers every rank. Through the group's
  // store (keys per call), so the communicator is not involved and a
  // missing rank does not abort it.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Marks the group's communicators aborted for every rank, now (their
  // peers' next wait fails): the pods' backend (torch_pods.py) calls it
  // when a step between pods failed, so that the pod's other ranks fail at
  // once instead of at their deadline. Later calls fail.
  void abort() override;

  // destroy_process_group: ends the worker threads while Python still runs
  // (a worker drops finished jobs' tensors, Python objects; left to the
  // interpreter's exit, one doing so as Python finalizes is ended mid
  // destructor and the process aborts). Calls made after it fail.
  void shutdown() override;

  // Collectives called so far (equal on every rank of a group that calls
  // the same collectives; torch's desync checks compare them).
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  static c10::intrusive_ptr<c10d::Backend> Create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& pool_uri);

 private:
  struct Job {
    c10::intrusive_ptr<CxlrtWork> work;
    std::function<absl::Status(void* stream)> run;  // Named: makes the communicator first
  };

  static at::Tensor One(const std::vector<at::Tensor>& tensors);
  static void Same(const at::Tensor& t, const at::Tensor& like);

  c10::intrusive_ptr<c10d::Work> Enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<absl::Status(void* stream)> run);

  // Runs a call; CUDA calls on the caller's stream (the call's own tensor
  // work too, and the future's completion events).
  void Execute(const Job& job);

  void Run();

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
  std::string Prefixed(const char* call, absl::string_view what) const;
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
                 std::vector<size_t>& counts, std::vector<size_t>& displs) const;
  static bool Overlap(const at::Tensor& a, const at::Tensor& b);
  // The input of an all-gather (`in_is_part`: it is one rank's part of the
  // output) or of a reduce-scatter (the output is one part of it): itself
  // when apart from the output or in NCCL's in-place form (this rank's part
  // is the smaller one), which the collectives read correctly; otherwise a
  // copy, since the output would overwrite input bytes not yet read.
  at::Tensor Apart(const at::Tensor& in, const at::Tensor& out, bool in_is_part) const;
  // At least one tensor; all dense, of one element type and device.
  static void OneType(const std::vector<at::Tensor>& ts);
  // big[i] holds world size times small[i], of its type.
  void PairedBy(const std::vector<at::Tensor>& big, const std::vector<at::Tensor>& small,
                const char* bigname, const char* smallname) const;
  static at::Tensor Flatten(const std::vector<at::Tensor>& ts);
  static void Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& ts);

  c10::intrusive_ptr<c10d::Work> SparseAllreduce(const at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);

  // The collective communicator, made at the group's first collective
  // (every rank calls it); a failure to make it answers every later call.
  // REQUIRES: the caller runs calls (busy_).
  absl::StatusOr<collectives::Communicator*> Comm();

  // Point to point moves bytes: any element type, as Gloo's.
  static at::Tensor OneOfAnyType(const std::vector<at::Tensor>& tensors);

  void CheckPeer(int peer, const char* what) const;

  // "rank 1: recv from rank 0 (tag 3, 4096 bytes)": who, what, with whom.
  std::string Describe(const P2pOp& op, bool send) const;

  c10::intrusive_ptr<c10d::Work> PostP2p(c10d::OpType type, const at::Tensor& t, int peer, int tag);

  // Completes `op` (error: null for success); CUDA ops on their stream.
  void Complete(P2pOp& op, std::exception_ptr error, int source = -1);
  void Fail(P2pOp& op, bool send, absl::string_view why);

  // The p2p thread: takes posted calls, moves what can move without
  // waiting for a peer, and when nothing could: yields for 1 ms after the
  // last move (a peer amid a message moves again within microseconds), then
  // naps, from 10 us up to 200 us (a peer's post wakes nobody, so the nap
  // bounds a message's latency), or sleeps until a call is posted when none
  // is pending.
  void P2pRun();

  bool Pending() const;

  void FailAll(absl::string_view why);

  // The p2p communicator failed (it is aborted): every call fails with it.
  void Broken(const P2pOp& op, bool send, const absl::Status& s);

  static bool Matches(const P2pOp& recv, const P2pMessage& m);

  // A posted receive takes the first message that arrived for it, else
  // waits, in posting order, for one.
  void PostRecv(const std::shared_ptr<P2pOp>& op);

  // A complete message: to its receive, copied from the buffer if it went
  // there, or an error when the sizes differ.
  void Deliver(P2pMessage& m);

  // Where message m's bytes go: the receive's tensor when matched with the
  // right size and type, else the buffer.
  uint8_t* Destination(P2pMessage& m);

  // Moves whatever can move without waiting for a peer; true if anything did.
  bool Step();

  // A posted receive could take the next message from p.
  bool Wanted(int p) const;

  // A header arrived: the first posted receive that matches takes the
  // message, unless an earlier message of that peer and tag still waits
  // for one (per (peer, tag) order); else it is buffered.
  void Arrived(const std::shared_ptr<P2pMessage>& m);

  // A call fails when neither it nor its channel has moved for the group's
  // timeout. One not yet begun on the channel fails alone; one cut in the
  // middle leaves the channel unusable, so every call fails then.
  void Expire();

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

}  // namespace cxlrt::torch_backend

#endif  // CXLRT_PYTHON_CSRC_TORCH_BACKEND_BACKEND_H_
