// The public calls of a Communicator (communicator.h): the collectives hand
// their algorithm to the call path (communicator_impl.h, Run); the rest
// forward to the role that does them (communicator_impl.h lists the files).
#include "cxlrt/collectives/communicator.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives {

void Communicator::Impl::Abort(absl::string_view why) {
  Quiesce();
  (void)Fail(absl::AbortedError(absl::StrCat(name_, " rank ", rank_, ": ", why)));
}

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     RedOp op, void* stream) {
  return impl_->Run(
      CollKind::kAllReduce, type, op, count, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::AllReduce(c, send, recv, count, op); });
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, size_t recvcount,
                                         DataType type, RedOp op, void* stream) {
  return impl_->Run(
      CollKind::kReduceScatter, type, op, recvcount, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::ReduceScatter(c, send, recv, recvcount, op); });
}

absl::Status Communicator::AllGather(const void* send, void* recv, size_t sendcount, DataType type,
                                     void* stream) {
  return impl_->Run(
      CollKind::kAllGather, type, RedOp::kSum, sendcount, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::AllGather(c, send, recv, sendcount); });
}

absl::Status Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type,
                                     int root, void* stream) {
  return impl_->Run(
      CollKind::kBroadcast, type, RedOp::kSum, count, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Broadcast(c, send, recv, count, root); });
}

absl::Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType type,
                                  RedOp op, int root, void* stream) {
  return impl_->Run(
      CollKind::kReduce, type, op, count, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Reduce(c, send, recv, count, op, root); });
}

absl::Status Communicator::Gather(const void* send, void* recv, size_t sendcount, DataType type,
                                  int root, void* stream) {
  return impl_->Run(
      CollKind::kGather, type, RedOp::kSum, sendcount, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Gather(c, send, recv, sendcount, root); });
}

absl::Status Communicator::Scatter(const void* send, void* recv, size_t recvcount, DataType type,
                                   int root, void* stream) {
  return impl_->Run(
      CollKind::kScatter, type, RedOp::kSum, recvcount, root, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::Scatter(c, send, recv, recvcount, root); });
}

absl::Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType type,
                                    void* stream) {
  return impl_->Run(
      CollKind::kAllToAll, type, RedOp::kSum, count, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::AllToAll(c, send, recv, count); });
}

absl::Status Communicator::Impl::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                           absl::Span<const size_t> send_displs, void* recv,
                                           absl::Span<const size_t> recv_counts,
                                           absl::Span<const size_t> recv_displs, DataType type,
                                           void* stream) {
  const size_t n = static_cast<size_t>(nranks_);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", rank_, " of ", name_, ": counts and displacements need ",
                     n, " entries each, got ", send_counts.size(), ", ", send_displs.size(), ", ",
                     recv_counts.size(), ", ", recv_displs.size()));
  }
  // The extents each buffer is read or written in.
  const size_t es = SizeOf(type);
  // Every piece must lie in the address space above its buffer: a
  // displacement plus count that wraps (size_t, or the address once scaled
  // by the element size) would read or write far outside it.
  auto check_pieces = [&](const char* which, const void* buf, absl::Span<const size_t> counts,
                          absl::Span<const size_t> displs) -> absl::Status {
    const uintptr_t room = UINTPTR_MAX - reinterpret_cast<uintptr_t>(buf);
    for (size_t j = 0; j < n; ++j) {
      if (counts[j] == 0) continue;
      if (displs[j] > SIZE_MAX - counts[j] || displs[j] + counts[j] > room / es) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllToAllV on rank ", rank_, " of ", name_, ": the ", which,
                         " piece of rank ", j, " (", counts[j], " elements at displacement ",
                         displs[j], ") runs past the end of the address space"));
      }
    }
    return absl::OkStatus();
  };
  CXLRT_RETURN_IF_ERROR(check_pieces("send", send, send_counts, send_displs));
  CXLRT_RETURN_IF_ERROR(check_pieces("receive", recv, recv_counts, recv_displs));
  // Two receive pieces that share an element would be written by two
  // peers' copies in whatever order they run.
  {
    std::vector<size_t> order;
    for (size_t j = 0; j < n; ++j) {
      if (recv_counts[j] > 0) order.push_back(j);
    }
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return recv_displs[x] < recv_displs[y]; });
    for (size_t k = 1; k < order.size(); ++k) {
      const size_t a = order[k - 1], b = order[k];
      if (recv_displs[a] + recv_counts[a] > recv_displs[b]) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllToAllV on rank ", rank_, " of ", name_,
                         ": the receive pieces of ranks ", a, " and ", b, " overlap (elements [",
                         recv_displs[a], ", ", recv_displs[a] + recv_counts[a], ") and [",
                         recv_displs[b], ", ", recv_displs[b] + recv_counts[b], "))"));
      }
    }
  }
  auto extent = [](absl::Span<const size_t> counts, absl::Span<const size_t> displs) {
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t j = 0; j < counts.size(); ++j) {
      if (counts[j] == 0) continue;
      lo = std::min(lo, displs[j]);
      hi = std::max(hi, displs[j] + counts[j]);
    }
    return std::pair(lo, hi);
  };
  const auto [slo, shi] = extent(send_counts, send_displs);
  const auto [rlo, rhi] = extent(recv_counts, recv_displs);
  const auto* sb = static_cast<const uint8_t*>(send);
  const auto* rb = static_cast<const uint8_t*>(recv);
  if (slo < shi && rlo < rhi && sb + slo * es < rb + rhi * es && rb + rlo * es < sb + shi * es) {
    // A peer's piece would overwrite bytes this rank has yet to post.
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", rank_, " of ", name_,
                     ": the send and receive buffers overlap (in place is not supported)"));
  }
  // Copies: an asynchronous call runs after the caller's spans are gone.
  std::vector<size_t> sc(send_counts.begin(), send_counts.end()),
      sd(send_displs.begin(), send_displs.end()), rc(recv_counts.begin(), recv_counts.end()),
      rd(recv_displs.begin(), recv_displs.end());
  size_t sent = 0, got = 0;
  for (size_t n : send_counts) sent += n;
  for (size_t n : recv_counts) got += n;
  alltoallv_bytes_ = std::max(sent, got) * es;
  return Run(
      CollKind::kAllToAllV, type, RedOp::kSum, 0, -1, send, recv, stream,
      [=](algorithms::Call& c) { return algorithms::AllToAllV(c, send, sc, sd, recv, rc, rd); });
}

absl::Status Communicator::Impl::Barrier() {
  Quiesce();
  return RunNow(CollKind::kBarrier, DataType::kUint8, RedOp::kSum, 0, -1, nullptr, nullptr, nullptr,
                [](algorithms::Call& c) { return algorithms::Barrier(c); });
}

absl::StatusOr<void*> Communicator::Impl::Allocate(size_t bytes) {
  Quiesce();
  CXLRT_ASSIGN_OR_RETURN(PoolOffset off,
                         alloc_.Allocate(std::max<size_t>(bytes, 1), {.alignment = 4096}));
  buffers_.push_back(off);
  return static_cast<void*>(pool_.backend().base() + off);
}

absl::Status Communicator::Impl::Free(void* p) {
  Quiesce();
  auto off = InPool(p, 1);
  auto it = off ? std::find(buffers_.begin(), buffers_.end(), *off) : buffers_.end();
  if (it == buffers_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Free: ", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                     " is not a buffer this communicator allocated"));
  }
  buffers_.erase(it);
  return ReleaseBuffer(*off);
}

// A buffer's lines this host still caches (a caller's writes never posted,
// say a broadcast's non-root input) are written back and dropped before the
// block goes back to the allocator: left dirty, a later eviction would write
// them over the block's next user on another host (the simulated domain
// aborts on it; non-coherent hardware would do it silently).
absl::Status Communicator::Impl::ReleaseBuffer(PoolOffset off) {
  if (auto n = alloc_.BlockSize(off); n.ok()) {
    pool_.coherence().Flush(off, *n);
    pool_.coherence().Invalidate(off, *n);
  }
  return alloc_.Free(off);
}

// --- Forwards to the roles. ---

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool Communicator::destroyed() const { return impl_->destroyed_; }
int Communicator::rank() const { return impl_->rank_; }
int Communicator::size() const { return impl_->nranks_; }
const std::string& Communicator::name() const { return impl_->name_; }
uint64_t Communicator::posts() const { return impl_->transport_->staged(); }
uint64_t Communicator::p2p_bytes() const { return impl_->p2p_bytes_; }
const std::vector<PoolOffset>& Communicator::slots() const { return impl_->my_slots_; }

absl::Status Communicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                     absl::Span<const size_t> send_displs, void* recv,
                                     absl::Span<const size_t> recv_counts,
                                     absl::Span<const size_t> recv_displs, DataType type,
                                     void* stream) {
  return impl_->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, type,
                          stream);
}
absl::Status Communicator::Barrier() { return impl_->Barrier(); }
absl::Status Communicator::Synchronize() { return impl_->Synchronize(); }
absl::Status Communicator::AsyncError() const { return impl_->AsyncError(); }
absl::Status Communicator::Send(const void* buf, size_t count, DataType type, int peer,
                                void* stream) {
  return impl_->Send(buf, count, type, peer, stream);
}
absl::Status Communicator::Recv(void* buf, size_t count, DataType type, int peer, void* stream) {
  return impl_->Recv(buf, count, type, peer, stream);
}
bool Communicator::SendFits(int peer, size_t bytes) const { return impl_->SendFits(peer, bytes); }
bool Communicator::RecvReady(int peer) const { return impl_->RecvReady(peer); }
absl::StatusOr<void*> Communicator::Allocate(size_t bytes) { return impl_->Allocate(bytes); }
absl::Status Communicator::Free(void* p) { return impl_->Free(p); }
absl::Status Communicator::Destroy() { return impl_->Destroy(); }
void Communicator::Abort(absl::string_view why) { impl_->Abort(why); }

}  // namespace cxlrt::collectives
