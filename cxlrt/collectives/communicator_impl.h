// The state of a Communicator and the code of each of its roles, behind
// the public header (communicator.h), as LevelDB's db_impl.h is behind
// db.h. Not installed. The roles live in their own files:
//
//   bootstrap.cc     rank and size from the launcher's environment; the
//                    options' unset values from the knobs
//   lifecycle.cc     Create: the block's plan, rank 0 making it, the others
//                    joining; the slots; Destroy and the waits for ranks to go
//   peer_watch.cc    ends a wait when a peer dies, leaves or aborts
//   call_path.cc     engine choice, Begin, the asynchronous queue, the end of
//                    a call on its stream, failure (Run and RunNow are here,
//                    below: every public call instantiates them)
//   p2p.cc           Send and Recv over the channels
//   communicator.cc  the public calls
//
// Data moves through the transport interface (transport.h); this
// communicator's ranks share one pool, so its transport is a PoolTransport
// (pool_transport.h), made by Join.
//
// The members keep the names they had as Communicator's own, so the
// history of each function reads across the split.
//
// Thread-safety: as Communicator's (one thread at a time); in asynchronous
// mode the proxy thread runs the queued calls, and the caller's thread
// touches only what Run says.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/comm_metrics.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/collectives/gpu_engine.h"
#include "cxlrt/collectives/pool_transport.h"
#include "cxlrt/collectives/stream_proxy.h"
#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::collectives_internal {

inline uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Slot and p2p buffer sizes a header may carry: a multiple of 64 in
// [64, 1 GiB], and for p2p buffers of 64 x kP2pSlots, so that each chunk
// slot is whole lines (rank 0 rounds what it is given up to that).
inline constexpr uint64_t kP2pAlign = 64 * collectives::kP2pSlots;

}  // namespace cxlrt::collectives_internal

namespace cxlrt::collectives {

struct Communicator::Impl {
  class PeerWatch;  // peer_watch.cc

  // --- Bootstrap (bootstrap.cc). ---
  // Resolves the options' unset values from the environment.
  Impl(allocator::Allocator& alloc, std::string name, int nranks, int rank,
       const CommOptions& options);

  // --- Lifecycle (lifecycle.cc): plan, join, destroy. ---
  absl::Status Join();
  // Allocates this rank's slots (striped over the pool's devices).
  absl::Status AllocateSlots();
  void FreeSlots();
  // Publishes the bytes of a flag line after its flag word (see .cc).
  void PublishBody(runtime::PoolOffset line, const void* obj, size_t size);
  absl::Status Destroy();
  // Rank 0's Destroy: waits until no rank can write the block any more.
  absl::Status AwaitEveryRankGone();
  // Whether the host of a rank that joined as `peer` is dead, fenced, free
  // or restarted (its process can write the pool no more).
  bool HostGone(const JoinLayout& peer) const;
  // Destroy after a failure: waits until every peer has read this rank's
  // published posts, or left, aborted or died (a peer may still be reading
  // one from its slots). kDeadlineExceeded naming the peer at `deadline`.
  absl::Status AwaitReadersDone(absl::Time deadline);
  // Join, rank 0, before it takes the stale block [block, block+size)
  // whose header is `old`: waits until each rank of that instance has
  // left, aborted or died. kAlreadyExists naming a rank alive at `deadline`.
  absl::Status AwaitStaleRanksGone(PoolOffset block, uint64_t size, const CommHeaderLayout& old,
                                   absl::Time deadline);

  // --- Where things lie in the block (comm_layout.h). ---
  PoolOffset RankAt(int r) const {
    return block_ + sizeof(CommHeaderLayout) + uint64_t(r) * sizeof(RankLayout);
  }
  // Channel s -> d (comm_layout.h, P2pLayout): chunk q's header line and
  // bytes, and the receiver's consumed counter.
  PoolOffset P2pAt(int s, int d) const {
    return block_ + p2p_offset_ + (uint64_t(s) * nranks_ + d) * sizeof(P2pLayout);
  }
  PoolOffset P2pChunkAt(int s, int d, uint64_t q) const {
    return P2pAt(s, d) + (q - 1) % kP2pSlots * sizeof(P2pChunkLayout);
  }
  PoolOffset P2pConsumedAt(int s, int d) const {
    return P2pAt(s, d) + offsetof(P2pLayout, consumed);
  }
  uint64_t p2p_chunk_bytes() const { return p2p_bytes_ / kP2pSlots; }  // a slot of the ring
  PoolOffset P2pBufferAt(int s, int d, uint64_t q) const {
    return block_ + p2p_buffers_offset_ + (uint64_t(s) * nranks_ + d) * p2p_bytes_ +
           (q - 1) % kP2pSlots * p2p_chunk_bytes();
  }

  // --- The call path (call_path.cc; Run and RunNow below). ---
  // nccl-tests' size of a call; AllToAllV's is set by AllToAllV itself.
  uint64_t CallBytes(CollKind kind, size_t count, DataType type) const {
    return kind == CollKind::kAllToAllV
               ? alltoallv_bytes_
               : collectives_internal::CommMetrics::CallBytes(kind, count, type, nranks_);
  }
  // Starts a collective: checks the communicator is usable and the
  // arguments, picks the engine for its buffers, numbers the call, and
  // hands the algorithm its context.
  absl::StatusOr<algorithms::Call> Begin(CollKind kind, DataType type, RedOp op, size_t count,
                                         int root, CopyEngine& engine);
  // OK, or why no call may start (destroyed, aborted).
  absl::Status Usable() const;
  // The same, with `failure` as the communicator's first error.
  absl::Status UsableAfter(const absl::Status& failure) const;
  // Asynchronous mode: waits for the queued calls before a call that runs
  // on the caller's thread.
  void Quiesce();
  // Runs `algorithm` as collective `kind` over buffers send and recv (either
  // may be null) ordered on `stream`.
  template <typename Algorithm>
  absl::Status Run(CollKind kind, DataType type, RedOp op, size_t count, int root, const void* send,
                   const void* recv, void* stream, Algorithm algorithm);
  // Run without the asynchronous queue: on the caller's thread.
  template <typename Algorithm>
  absl::Status RunNow(CollKind kind, DataType type, RedOp op, size_t count, int root,
                      const void* send, const void* recv, void* stream, Algorithm algorithm);
  // Communicator::Synchronize and AsyncError.
  absl::Status Synchronize();
  absl::Status AsyncError() const;
  // The engine for a call over `buffers`: the options' engine, else the
  // CUDA engine when one of them is GPU memory (made on first use), else
  // the CPU engine. Orders a GPU engine after `stream`.
  absl::StatusOr<CopyEngine*> EngineFor(const char* what,
                                        std::initializer_list<const void*> buffers, void* stream,
                                        bool start = true);
  // `engine` as the GPU engine, or null when it is another.
  GpuCopyEngine* GpuOf(CopyEngine* engine) const {
    return engine != nullptr && engine == gpu_engine_.get() ? gpu_engine_.get() : nullptr;
  }
  // After a call on `engine`: orders `stream` after it.
  absl::Status EndOnStream(CopyEngine* engine, void* stream);
  // Drains every engine this communicator used (CopyEngine::Drain).
  absl::Status DrainEngines(absl::Time deadline);
  // After a call failed with `error` on `engine`: drains the engine (its
  // copies write the caller's buffers) and returns `error`, noting a drain
  // that ran out.
  absl::Status SettleAfterError(CopyEngine& engine, absl::Status error);
  // Records the first error, tells the peers, returns it.
  absl::Status Fail(absl::Status s);
  // OK, or the first error (the communicator is then aborted).
  const absl::Status& failed() const;
  // Ends waits when a peer dies, leaves or aborts.
  runtime::WaitWatch* watch() const;
  // The pool offset of [p, p+len) when it lies in the pool.
  std::optional<PoolOffset> InPool(const void* p, size_t len) const;

  // --- Send and Recv (p2p.cc): Communicator's, on the channels. ---
  absl::Status Send(const void* buf, size_t count, DataType type, int peer, void* stream);
  absl::Status Recv(void* buf, size_t count, DataType type, int peer, void* stream);
  bool SendFits(int peer, size_t bytes) const;
  bool RecvReady(int peer) const;
  // The chunks a Send or Recv of `bytes` is cut into.
  size_t P2pChunkFor(size_t bytes) const;

  // --- Public calls with more to them than a forward (communicator.cc). ---
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                         absl::Span<const size_t> send_displs, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Span<const size_t> recv_displs,
                         DataType type, void* stream);
  absl::Status Barrier();
  absl::StatusOr<void*> Allocate(size_t bytes);
  absl::Status Free(void* p);
  // Writes back and drops this host's lines of a buffer, then frees it.
  absl::Status ReleaseBuffer(PoolOffset off);
  void Abort(absl::string_view why);

  // --- State. ---
  allocator::Allocator& alloc_;
  runtime::Pool& pool_;
  runtime::Coherence& c_;
  const std::string name_;  // the block's name: "comm/" + the user's name
  const int nranks_, rank_;
  // CommOptions with every knob resolved (the constructor's work).
  struct Settings {
    absl::Duration timeout;
    uint64_t slot_bytes;
    uint32_t depth;
    uint64_t chunk_bytes, p2p_bytes, oneshot_max;
    CopyEngine* engine;
    bool asynchronous;
  };
  Settings options_;
  PoolOffset block_ = 0;
  uint64_t slot_bytes_ = 0, p2p_bytes_ = 0;
  uint64_t p2p_offset_ = 0, p2p_buffers_offset_ = 0;
  uint32_t depth_ = 0;
  std::vector<PoolOffset> my_slots_;  // allocated by this rank, depth_ of them
  uint64_t instance_ = 0;
  std::vector<JoinLayout> peers_;  // as joined
  std::unique_ptr<PeerWatch> watch_;
  int spins_ = -1;  // spins before a wait yields; -1: CXLRT_WAIT_SPINS
  std::unique_ptr<CopyEngine> cpu_engine_;
  std::unique_ptr<GpuCopyEngine> gpu_engine_;  // on the first call with GPU buffers
  std::unique_ptr<PoolTransport> transport_;   // after Join

  uint64_t calls_ = 0;
  uint64_t alltoallv_bytes_ = 0;           // of the AllToAllV being started
  absl::Time deadline_;                    // of the current Send or Recv
  std::vector<uint64_t> sent_, received_;  // p2p chunks per peer
  std::vector<PoolOffset> buffers_;        // from Allocate
  bool destroyed_ = false;
  // Asynchronous mode: the proxy thread (made on the first call). Declared
  // last: it is joined before the engines and the transport go.
  std::atomic<GpuCopyEngine*> gpu_done_{nullptr};  // the engine the proxy reports to
  std::unique_ptr<StreamProxy> proxy_;
  bool made_block_ = false;  // rank 0 made the block (frees it if joining fails)
  // Calls, bytes and time per collective (after Join; see comm_metrics.h).
  std::unique_ptr<collectives_internal::CommMetrics> metrics_;
};

// Ends a wait early when a peer has died, was fenced, left or aborted, or
// when this host was fenced (peer_watch.cc).
class Communicator::Impl::PeerWatch : public runtime::WaitWatch {
 public:
  explicit PeerWatch(Impl& comm) : comm_(comm) {}
  absl::Status Check() override;

 private:
  Impl& comm_;
};

template <typename Algorithm>
absl::Status Communicator::Impl::Run(CollKind kind, DataType type, RedOp op, size_t count, int root,
                                     const void* send, const void* recv, void* stream,
                                     Algorithm algorithm) {
  if (options_.asynchronous) {
    // The caller's thread: the checks that need no transport (the proxy
    // owns it), the engine, a mark on the stream; the proxy runs the call
    // (docs/gpu.md, "Streams").
    CXLRT_RETURN_IF_ERROR(UsableAfter(AsyncError()));
    CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine,
                           EngineFor(CollKindName(kind), {send, recv}, stream, /*start=*/false));
    GpuCopyEngine* dev = GpuOf(engine);
    uint64_t mark = 0;
    if (dev) {
      CXLRT_ASSIGN_OR_RETURN(mark, dev->Mark(stream));
    }
    if (!proxy_) {
      proxy_ = std::make_unique<StreamProxy>([this](uint64_t seq) {
        if (GpuCopyEngine* d = gpu_done_.load(std::memory_order_acquire)) d->SetDone(seq);
      });
    }
    if (dev) gpu_done_.store(dev, std::memory_order_release);
    const uint64_t call_bytes = CallBytes(kind, count, type);  // AllToAllV's: now
    const uint64_t seq = proxy_->Enqueue([=, this]() -> absl::Status {
      CXLRT_RETURN_IF_ERROR(Usable());
      if (dev) CXLRT_RETURN_IF_ERROR(dev->StartAfterMark(mark));
      const auto probe = metrics_->Begin(kind, call_bytes);
      CXLRT_ASSIGN_OR_RETURN(algorithms::Call c, Begin(kind, type, op, count, root, *engine));
      absl::Status s = algorithm(c);
      if (s.ok()) metrics_->End(probe);
      return s.ok() ? s : SettleAfterError(*engine, std::move(s));
    });
    return dev ? dev->WaitDoneOn(stream, seq) : absl::OkStatus();
  }
  return RunNow(kind, type, op, count, root, send, recv, stream, algorithm);
}

template <typename Algorithm>
absl::Status Communicator::Impl::RunNow(CollKind kind, DataType type, RedOp op, size_t count,
                                        int root, const void* send, const void* recv, void* stream,
                                        Algorithm algorithm) {
  const auto probe = metrics_->Begin(kind, CallBytes(kind, count, type));
  CXLRT_RETURN_IF_ERROR(Usable());
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor(CollKindName(kind), {send, recv}, stream));
  CXLRT_ASSIGN_OR_RETURN(algorithms::Call c, Begin(kind, type, op, count, root, *engine));
  if (absl::Status s = algorithm(c); !s.ok()) return SettleAfterError(*engine, std::move(s));
  absl::Status s = EndOnStream(engine, stream);
  if (s.ok()) metrics_->End(probe);
  return s;
}

}  // namespace cxlrt::collectives
