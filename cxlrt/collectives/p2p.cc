// Send and Recv: one channel per ordered pair of ranks, a ring of
// kP2pSlots chunks (comm_layout.h, P2pLayout; docs/collectives.md,
// "Send / Recv"). A chunk's bytes move through the call's copy engine: the
// sender publishes a chunk once its copy into the pool has completed, and
// the receiver marks it consumed once its copy out has, each in chunk
// order. The sender fills chunk q + 1 while the receiver empties chunk q,
// and an engine that completes late (a GPU's) has several chunks in flight.
#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives {

using algorithms::Chunks;

namespace {

// A chunk whose engine copy may still be in flight.
struct InFlight {
  uint64_t q;  // its number on the channel
  size_t len;
  CopyEngine::Ticket t;
};

// Runs `finish` on the chunks at the front of `flight` whose copies have
// completed, in chunk order; with `wait`, on all of them.
template <typename Finish>
absl::Status Retire(CopyEngine& e, std::deque<InFlight>& flight, bool wait, absl::Time deadline,
                    Finish&& finish) {
  for (; !flight.empty(); flight.pop_front()) {
    const InFlight& f = flight.front();
    const absl::StatusOr<bool> done = e.Settle(f.t, wait, deadline);
    if (!done.ok()) {
      return absl::Status(
          done.status().code(),
          absl::StrCat("the ", e.name(), " copy engine: ", done.status().message()));
    }
    if (!*done) return absl::OkStatus();
    finish(f);
  }
  return absl::OkStatus();
}

}  // namespace

size_t Communicator::Impl::P2pChunkFor(size_t bytes) const {
  // A quarter of the message, so that even a message of one slot's size
  // pipelines over the ring; at least 16 KiB (each chunk costs a flag
  // handoff and a header), at most the slot. Sender and receiver cut alike:
  // both know the message's size (a receiver whose size differs reports
  // the mismatch before it uses the cut).
  const size_t quarter = (bytes / kP2pSlots + 4095) / 4096 * 4096;
  return std::min<size_t>(p2p_chunk_bytes(), std::max<size_t>(quarter, 16 << 10));
}

bool Communicator::Impl::SendFits(int peer, size_t bytes) const {
  if (peer < 0 || peer >= nranks_ || peer == rank_ || destroyed_) return false;
  // The receiver's consumed counter only grows, so room seen now stays.
  const uint64_t unconsumed = sent_[peer] - c_.LoadFlag(P2pConsumedAt(rank_, peer));
  return unconsumed + Chunks(bytes, P2pChunkFor(bytes)) <= kP2pSlots;
}

bool Communicator::Impl::RecvReady(int peer) const {
  if (peer < 0 || peer >= nranks_ || peer == rank_ || destroyed_) return false;
  const uint64_t q = received_[peer] + 1;
  return c_.LoadFlag(P2pChunkAt(peer, rank_, q)) >= q;
}

absl::Status Communicator::Impl::Send(const void* buf, size_t count, DataType type, int peer,
                                      void* stream) {
  Quiesce();
  if (destroyed_ || !failed().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send to rank ", peer, " from rank ", rank_, " of ", nranks_));
  }
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor("Send", {buf}, stream));
  runtime::Membership& m = alloc_.membership();
  CXLRT_RETURN_IF_ERROR(m.ConfirmLease());  // the channel is this host's to write
  deadline_ = absl::Now() + options_.timeout;
  // Copies still in flight read `buf` and write the channel: they end
  // before the error returns (SettleAfterError).
  auto failed = [&](const absl::Status& s) {
    return SettleAfterError(
        *engine,
        Fail(absl::Status(s.code(), absl::StrCat("Send from rank ", rank_, " to rank ", peer,
                                                 " of ", name_, ": ", s.message()))));
  };
  const size_t bytes = count * SizeOf(type), chunk = P2pChunkFor(bytes);
  const auto probe = metrics_->Begin(collectives_internal::CommMetrics::kSend, bytes);
  const auto* in = static_cast<const uint8_t*>(buf);
  const PoolOffset consumed = P2pConsumedAt(rank_, peer);
  std::deque<InFlight> copying;
  auto publish = [&](bool wait) {
    return Retire(*engine, copying, wait, deadline_, [&](const InFlight& f) {
      P2pChunkLayout h = {};
      h.bytes = f.len;
      h.total = count;
      h.type = static_cast<uint64_t>(type);
      h.instance = instance_;
      const PoolOffset line = P2pChunkAt(rank_, peer, f.q);
      PublishBody(line, &h, offsetof(P2pChunkLayout, pad));
      c_.StoreFlag(line, f.q);
    });
  };
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    const uint64_t q = ++sent_[peer];
    // Chunk q reuses the slot of chunk q - kP2pSlots. While waiting for the
    // receiver to consume that one, publish what completed: it may be
    // waiting for exactly that.
    absl::Status progress;
    absl::Status s = runtime::WaitUntil(
        [&] {
          progress = publish(/*wait=*/false);
          return !progress.ok() || c_.LoadFlag(consumed) + kP2pSlots >= q;
        },
        deadline_, "the receiver", watch(), kDataPathYield, spins_);
    if (!progress.ok()) return failed(progress);
    if (!s.ok()) return failed(s);
    if (!m.LeaseHeld()) {
      if (absl::Status l = m.CheckLease(); !l.ok()) return failed(l);
    }
    copying.push_back({q, len, engine->ToPool(P2pBufferAt(rank_, peer, q), in + at, len)});
    if (absl::Status p = publish(/*wait=*/false); !p.ok()) return failed(p);
  }
  // Send returns once its last chunk is in the pool.
  if (absl::Status p = publish(/*wait=*/true); !p.ok()) return failed(p);
  absl::Status s = EndOnStream(engine, stream);
  if (s.ok()) metrics_->End(probe);
  return s;
}

absl::Status Communicator::Impl::Recv(void* buf, size_t count, DataType type, int peer,
                                      void* stream) {
  Quiesce();
  if (destroyed_ || !failed().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recv from rank ", peer, " at rank ", rank_, " of ", nranks_));
  }
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor("Recv", {buf}, stream));
  // It writes the channel's consumed counter, this host's to write.
  CXLRT_RETURN_IF_ERROR(alloc_.membership().ConfirmLease());
  deadline_ = absl::Now() + options_.timeout;
  // Copies still in flight write `buf`: they end before the error returns.
  auto failed = [&](const absl::Status& s) {
    return SettleAfterError(
        *engine,
        Fail(absl::Status(s.code(), absl::StrCat("Recv at rank ", rank_, " from rank ", peer,
                                                 " of ", name_, ": ", s.message()))));
  };
  const size_t bytes = count * SizeOf(type), chunk = P2pChunkFor(bytes);
  const auto probe = metrics_->Begin(collectives_internal::CommMetrics::kRecv, bytes);
  auto* out = static_cast<uint8_t*>(buf);
  const PoolOffset consumed = P2pConsumedAt(peer, rank_);
  std::deque<InFlight> reading;
  // A chunk is the sender's again once its bytes are out of the pool.
  auto release = [&](bool wait) {
    return Retire(*engine, reading, wait, deadline_,
                  [&](const InFlight& f) { c_.StoreFlag(consumed, f.q); });
  };
  for (size_t k = 0, at = 0; k < Chunks(bytes, chunk); ++k, at += chunk) {
    const size_t len = std::min(chunk, bytes - at);
    const uint64_t q = ++received_[peer];
    const PoolOffset line = P2pChunkAt(peer, rank_, q);
    absl::Status progress;
    absl::Status s = runtime::WaitUntil(
        [&] {
          progress = release(/*wait=*/false);
          return !progress.ok() || c_.LoadFlag(line) >= q;
        },
        deadline_, "the sender", watch(), kDataPathYield, spins_);
    if (!progress.ok()) return failed(progress);
    if (!s.ok()) return failed(s);
    // The sender writes this slot again only after we consume chunk q, so
    // its line holds exactly chunk q; anything else is a corrupt channel.
    const P2pChunkLayout p = c_.FetchObject<P2pChunkLayout>(line);
    if (p.posted != q || p.instance != instance_ || p.bytes > p2p_chunk_bytes()) {
      return failed(absl::DataLossError(absl::StrCat(
          "the channel's chunk line holds chunk ", p.posted, " (", p.bytes,
          " bytes) of communicator instance ", absl::Hex(p.instance), ", not chunk ", q,
          " of at most ", p2p_chunk_bytes(), " bytes of this one (", absl::Hex(instance_), ")")));
    }
    if (p.total != count || p.type != static_cast<uint64_t>(type) || p.bytes != len) {
      return SettleAfterError(
          *engine, Fail(absl::InvalidArgumentError(absl::StrCat(
                       "rank ", rank_, " called Recv(count=", count, ", ", DataTypeName(type),
                       ") but rank ", peer, " called Send(count=", p.total, ", ",
                       p.type < kNumDataTypes ? DataTypeName(static_cast<DataType>(p.type)) : "?",
                       ") on ", name_))));
    }
    const CopyEngine::Ticket t =
        len ? engine->FromPool(out + at, c_.BeginRead(P2pBufferAt(peer, rank_, q), len), len) : 0;
    reading.push_back({q, len, t});
    if (absl::Status r = release(/*wait=*/false); !r.ok()) return failed(r);
  }
  if (absl::Status r = release(/*wait=*/true); !r.ok()) return failed(r);
  absl::Status s = EndOnStream(engine, stream);
  if (s.ok()) metrics_->End(probe);
  return s;
}

}  // namespace cxlrt::collectives
