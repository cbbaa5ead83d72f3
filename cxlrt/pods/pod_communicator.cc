// The hierarchical communicator (pod_communicator.h): its lifecycle and
// public calls; the algorithms are in pod_algorithms.cc.
#include "cxlrt/pods/pod_communicator.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/pods/pod_communicator_impl.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {

using collectives::Communicator;
using Ticket = InterPodEngine::Ticket;

namespace {
constexpr uint64_t kDefaultChunkBytes = uint64_t{4} << 20;
}  // namespace

// --- Lifecycle and the public calls. ---

namespace {
// All-gathers every rank's PodOptions::chunk_bytes over `world`;
// kInvalidArgument naming the first rank whose value differs from rank
// 0's: every rank sees the same values, so every rank refuses alike and
// none goes on to a call that cannot match.
absl::Status CheckSameChunkBytes(const std::string& name, uint64_t mine, InterPodEngine& world,
                                 absl::Time deadline) {
  std::vector<uint64_t> all(world.size());
  CXLRT_ASSIGN_OR_RETURN(Ticket t,
                         world.AllGather(&mine, all.data(), 1, collectives::DataType::kUint64));
  CXLRT_RETURN_IF_ERROR(world.Wait(t, deadline));
  for (int r = 0; r < world.size(); ++r) {
    if (all[r] != all[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pods/", name, ": PodOptions::chunk_bytes differs between ranks: ", all[0],
                       " at world rank 0, ", all[r], " at world rank ", r,
                       " (every rank must pass the same value, or none)"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

MultiPodCommunicator::MultiPodCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultiPodCommunicator::~MultiPodCommunicator() = default;

absl::StatusOr<std::unique_ptr<MultiPodCommunicator>> MultiPodCommunicator::Create(
    allocator::Allocator& pod_alloc, absl::string_view name, std::unique_ptr<InterPodEngine> world,
    const CommOptions& options, const PodOptions& pod_options) {
  if (world == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("pods/", name, ": no world engine"));
  }
  auto impl = std::make_unique<Impl>();
  impl->name = std::string(name);
  // The pool communicator's timeout, resolved as it resolves it: the
  // engine waits must not outlast a deadline the user shortened with
  // CXLRT_COMM_TIMEOUT_MS.
  impl->timeout = options.timeout.value_or(absl::Milliseconds(collectives::kCommTimeoutMs.Get()));
  impl->chunk_bytes = pod_options.chunk_bytes != 0 ? pod_options.chunk_bytes : kDefaultChunkBytes;
  const absl::Time deadline = absl::Now() + impl->timeout;
  CXLRT_ASSIGN_OR_RETURN(impl->layout, DiscoverLayout(pod_alloc.pool().header(), *world, deadline));
  const PodLayout& l = impl->layout;
  if (l.npods > 1) {
    // Every rank must cut calls into the same chunks, or their engine
    // operations would not match: refused here, naming both values.
    CXLRT_RETURN_IF_ERROR(CheckSameChunkBytes(impl->name, impl->chunk_bytes, *world, deadline));
  }
  CommOptions po = options;
  po.asynchronous = false;
  auto pod =
      Communicator::Create(pod_alloc, absl::StrCat("pods/", name), l.pod_size, l.local_rank, po);
  if (!pod.ok()) {
    world->Abort(pod.status().message());
    return pod.status();
  }
  impl->pod = *std::move(pod);
  if (l.npods > 1) {
    auto rail = world->Split(l.local_rank, l.pod, deadline);
    if (!rail.ok()) {
      impl->pod->Abort(rail.status().message());
      world->Abort(rail.status().message());
      return rail.status();
    }
    impl->rail = *std::move(rail);
  }
  impl->world = std::move(world);
  return std::unique_ptr<MultiPodCommunicator>(new MultiPodCommunicator(std::move(impl)));
}

int MultiPodCommunicator::rank() const { return impl_->layout.rank; }
int MultiPodCommunicator::size() const { return impl_->layout.world_size; }
int MultiPodCommunicator::pod() const { return impl_->layout.pod; }
int MultiPodCommunicator::npods() const { return impl_->layout.npods; }
int MultiPodCommunicator::local_rank() const { return impl_->layout.local_rank; }
int MultiPodCommunicator::pod_size() const { return impl_->layout.pod_size; }
const PodLayout& MultiPodCommunicator::layout() const { return impl_->layout; }
TierTimes MultiPodCommunicator::tier_times() const { return impl_->times; }
void MultiPodCommunicator::ResetTierTimes() { impl_->times = TierTimes{}; }

namespace {
absl::Status BadRoot(const std::string& name, int rank, const char* what, int root, int n) {
  return absl::InvalidArgumentError(absl::StrCat("pods/", name, " rank ", rank, ": ", what,
                                                 " root ", root, " is not a rank of ", n));
}
}  // namespace

absl::Status MultiPodCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                             DataType type, RedOp op) {
  Impl& m = *impl_;
  return m.Run("AllReduce", [&] {
    if (m.layout.npods == 1) return m.pod->AllReduce(send, recv, count, type, op);
    return m.AllReduce(send, recv, count, type, op);
  });
}

absl::Status MultiPodCommunicator::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                                 DataType type, RedOp op) {
  Impl& m = *impl_;
  return m.Run("ReduceScatter", [&] {
    if (m.layout.npods == 1) return m.pod->ReduceScatter(send, recv, recvcount, type, op);
    return m.ReduceScatter(send, recv, recvcount, type, op);
  });
}

absl::Status MultiPodCommunicator::AllGather(const void* send, void* recv, size_t sendcount,
                                             DataType type) {
  Impl& m = *impl_;
  return m.Run("AllGather", [&] {
    if (m.layout.npods == 1) return m.pod->AllGather(send, recv, sendcount, type);
    return m.AllGather(send, recv, sendcount, type);
  });
}

absl::Status MultiPodCommunicator::Broadcast(const void* send, void* recv, size_t count,
                                             DataType type, int root) {
  Impl& m = *impl_;
  return m.Run("Broadcast", [&] {
    if (m.layout.npods == 1) return m.pod->Broadcast(send, recv, count, type, root);
    if (root < 0 || root >= size()) return BadRoot(m.name, rank(), "Broadcast", root, size());
    return m.Broadcast(send, recv, count, type, root);
  });
}

absl::Status MultiPodCommunicator::Reduce(const void* send, void* recv, size_t count, DataType type,
                                          RedOp op, int root) {
  Impl& m = *impl_;
  return m.Run("Reduce", [&] {
    if (m.layout.npods == 1) return m.pod->Reduce(send, recv, count, type, op, root);
    if (root < 0 || root >= size()) return BadRoot(m.name, rank(), "Reduce", root, size());
    return m.Reduce(send, recv, count, type, op, root);
  });
}

absl::Status MultiPodCommunicator::Gather(const void* send, void* recv, size_t sendcount,
                                          DataType type, int root) {
  Impl& m = *impl_;
  return m.Run("Gather", [&] {
    if (m.layout.npods == 1) return m.pod->Gather(send, recv, sendcount, type, root);
    if (root < 0 || root >= size()) return BadRoot(m.name, rank(), "Gather", root, size());
    return m.Gather(send, recv, sendcount, type, root);
  });
}

absl::Status MultiPodCommunicator::Scatter(const void* send, void* recv, size_t recvcount,
                                           DataType type, int root) {
  Impl& m = *impl_;
  return m.Run("Scatter", [&] {
    if (m.layout.npods == 1) return m.pod->Scatter(send, recv, recvcount, type, root);
    if (root < 0 || root >= size()) return BadRoot(m.name, rank(), "Scatter", root, size());
    return m.Scatter(send, recv, recvcount, type, root);
  });
}

absl::Status MultiPodCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                            DataType type) {
  Impl& m = *impl_;
  return m.Run("AllToAll", [&]() -> absl::Status {
    if (m.layout.npods == 1) return m.pod->AllToAll(send, recv, count, type);
    const size_t N = m.n();
    std::vector<size_t> counts(N, count), displs(N);
    for (size_t j = 0; j < N; ++j) displs[j] = j * count;
    if (send == recv) {
      // In place: the pieces go out from a copy, in the communicator's
      // staging (it outlives an engine operation that an error leaves in
      // flight until the engines are destroyed).
      const size_t bytes = N * count * SizeOf(type);
      uint8_t* copy = m.Scratch(0, bytes);
      std::memcpy(copy, send, bytes);
      send = copy;
    }
    return m.AllToAllV(send, counts, displs, recv, counts, displs, type);
  });
}

absl::Status MultiPodCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                             absl::Span<const size_t> send_displs, void* recv,
                                             absl::Span<const size_t> recv_counts,
                                             absl::Span<const size_t> recv_displs, DataType type) {
  Impl& m = *impl_;
  return m.Run("AllToAllV", [&] {
    if (m.layout.npods == 1) {
      return m.pod->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, type);
    }
    return m.AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, type);
  });
}

absl::Status MultiPodCommunicator::Barrier() {
  Impl& m = *impl_;
  return m.Run("Barrier", [&] {
    if (m.layout.npods == 1) return m.pod->Barrier();
    return m.Barrier();
  });
}

absl::Status MultiPodCommunicator::Send(const void* buf, size_t count, DataType type, int peer) {
  Impl& m = *impl_;
  return m.Run("Send", [&] { return m.SendRecv(true, const_cast<void*>(buf), count, type, peer); });
}

absl::Status MultiPodCommunicator::Recv(void* buf, size_t count, DataType type, int peer) {
  Impl& m = *impl_;
  return m.Run("Recv", [&] { return m.SendRecv(false, buf, count, type, peer); });
}

absl::Status MultiPodCommunicator::Destroy() {
  Impl& m = *impl_;
  absl::Status s = m.pod ? m.pod->Destroy() : absl::OkStatus();
  m.rail.reset();
  m.world.reset();
  if (m.failed.ok()) m.failed = absl::FailedPreconditionError("the communicator was destroyed");
  return s;
}

void MultiPodCommunicator::Abort(absl::string_view why) {
  Impl& m = *impl_;
  if (m.failed.ok()) m.failed = absl::AbortedError(why);
  m.AbortAll(why);
}

}  // namespace cxlrt::pods
