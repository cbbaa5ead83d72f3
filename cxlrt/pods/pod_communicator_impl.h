// The state of a MultiPodCommunicator (pod_communicator.h) and what its
// parts share: the error policy of both tiers, timed pod steps and engine
// waits, the chunk pipeline. pod_communicator.cc holds the lifecycle and
// the public calls, pod_algorithms.cc the algorithms. Not installed.
// Thread-safety: as MultiPodCommunicator (one thread at a time).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/pods/pod_communicator.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {

struct MultiPodCommunicator::Impl {
  using Ticket = InterPodEngine::Ticket;

  PodLayout layout;
  std::string name;
  absl::Duration timeout;
  uint64_t chunk_bytes;
  std::unique_ptr<collectives::Communicator> pod;  // the pod's pool communicator
  std::unique_ptr<InterPodEngine> world;           // every rank
  std::unique_ptr<InterPodEngine> rail;            // local index l, one per pod that has it
  absl::Status failed;                             // the first error; then unusable
  TierTimes times;
  // Staging of the algorithms, taken at the start of a call (so an engine
  // operation in flight never sees a buffer move); grown, never shrunk:
  // about two chunks' worth for the pipelined collectives, the whole
  // buffer for gather and scatter.
  std::vector<uint8_t> scratch[6];

  ~Impl() {
    // Leaves in the same order on every rank: the pod, the rail, the world.
    pod.reset();
    rail.reset();
    world.reset();
  }

  absl::Time Deadline() const { return absl::Now() + timeout; }
  size_t n() const { return static_cast<size_t>(layout.world_size); }
  int m() const { return layout.min_pod_size; }

  uint8_t* Scratch(int i, size_t bytes) {
    if (scratch[i].size() < bytes) scratch[i].resize(bytes);
    return scratch[i].data();
  }

  // Runs one call: refuses after an error; on a new error aborts both
  // tiers so that every rank learns within its deadline.
  absl::Status Run(const char* what, const std::function<absl::Status()>& body) {
    if (!failed.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pods/", name, " rank ", layout.rank, ": ", what,
                       " after an earlier error: ", failed.message()));
    }
    absl::Status s = body();
    if (!s.ok()) {
      failed = s;
      const std::string why =
          absl::StrCat("rank ", layout.rank, " (pod ", layout.pod, " local ", layout.local_rank,
                       ") failed in ", what, ": ", s.message());
      AbortAll(why);
    }
    return s;
  }

  // Aborts both tiers, then lets the engines go: an engine operation still
  // running (on the pool engine's worker, or in MPI) may write the
  // caller's buffers until its engine is destroyed, and the caller gets
  // them back when the call returns (inter_pod.h).
  void AbortAll(absl::string_view why) {
    pod->Abort(why);
    if (rail) rail->Abort(why);
    if (world) world->Abort(why);
    rail.reset();
    world.reset();
  }

  // A pod step, timed.
  absl::Status PodStep(const std::function<absl::Status()>& step) {
    const absl::Time t0 = absl::Now();
    absl::Status s = step();
    times.pod += absl::Now() - t0;
    return s;
  }

  absl::Status EngineWait(InterPodEngine& e, Ticket t) {
    const absl::Time t0 = absl::Now();
    absl::Status s = e.Wait(t, Deadline());
    times.engine_wait += absl::Now() - t0;
    ++times.engine_ops;
    return s;
  }

  // The chunk pipeline: pre(k) and post(k) are pod steps, start(k) starts
  // the engine's step of chunk k (or nothing). The engine's step of chunk
  // k runs while pre(k + 1) and post(k - 1) do.
  using Start = std::function<absl::StatusOr<std::optional<Ticket>>(size_t)>;
  using Step = std::function<absl::Status(size_t)>;
  absl::Status Pipeline(size_t chunks, InterPodEngine* e, const Step& pre, const Start& start,
                        const Step& post) {
    if (chunks == 0) return absl::OkStatus();
    CXLRT_RETURN_IF_ERROR(PodStep([&] { return pre(0); }));
    absl::StatusOr<std::optional<Ticket>> t = start(0);
    for (size_t k = 0; k < chunks; ++k) {
      if (!t.ok()) return t.status();
      if (k + 1 < chunks) CXLRT_RETURN_IF_ERROR(PodStep([&] { return pre(k + 1); }));
      if (t->has_value()) CXLRT_RETURN_IF_ERROR(EngineWait(*e, t->value()));
      if (k + 1 < chunks) t = start(k + 1);
      CXLRT_RETURN_IF_ERROR(PodStep([&] { return post(k); }));
    }
    return absl::OkStatus();
  }

  size_t ChunkElems(DataType type) const {
    return std::max<size_t>(static_cast<size_t>(m()), chunk_bytes / SizeOf(type));
  }

  absl::Status DivideForAvg(void* buf, size_t count, DataType type) {
    if (count == 0) return absl::OkStatus();
    const void* src[1] = {buf};
    collectives::Reduce(type, RedOp::kAvg, buf, src, 1, count, static_cast<int>(n()));
    return absl::OkStatus();
  }

  size_t ShardLen(size_t len, int s) const;
  absl::Status ReduceShards(const uint8_t* in, size_t len, uint8_t* t, uint8_t* junk, DataType type,
                            RedOp rop);
  absl::Status ShareShards(uint8_t* out, size_t len, const uint8_t* t, DataType type);
  struct Shards;
  void CopyRegion(bool to_blocks, uint8_t* packed, uint8_t* blocks, size_t stride, size_t off,
                  size_t L, int q, size_t from, size_t n, size_t es) const;

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, RedOp op);
  absl::Status ReduceScatter(const void* send, void* recv, size_t rc, DataType type, RedOp op);
  absl::Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root);
  absl::Status Reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                      int root);
  absl::Status AllGather(const void* send, void* recv, size_t count, DataType type);
  struct Rooted;
  Rooted PlanRooted(size_t count, DataType type, int root);
  absl::Status Gather(const void* send, void* recv, size_t count, DataType type, int root);
  absl::Status Scatter(const void* send, void* recv, size_t count, DataType type, int root);
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> sc, absl::Span<const size_t> sd,
                         void* recv, absl::Span<const size_t> rc, absl::Span<const size_t> rd,
                         DataType type);
  absl::Status Barrier();
  absl::Status SendRecv(bool send, void* buf, size_t count, DataType type, int peer);
};

}  // namespace cxlrt::pods
