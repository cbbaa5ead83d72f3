// Send and Recv: one channel per ordered pair of ranks (docs/collectives.md,
// "Send / Recv").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collectives/communicator.h"
#include "runtime/status_macros.h"

namespace cxlrt::collectives {

using algorithms::Chunks;

namespace {

// Runs one engine copy of a point-to-point chunk to completion.
absl::Status Finish(CopyEngine& e, CopyEngine::Ticket t, absl::Time deadline) {
  if (t == 0) return absl::OkStatus();
  return e.Wait(t, deadline);
}

}  // namespace

absl::Status Communicator::Send(const void* buf, size_t count, DataType type, int peer,
                                void* stream) {
  Quiesce();
  if (destroyed_ || !failed().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send to rank ", peer, " from rank ", rank_, " of ", nranks_));
  }
  // Device buffers move through the CUDA engine; host ones as before.
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor("Send", {buf}, stream));
  DeviceEngine* dev = DeviceOf(engine);
  deadline_ = absl::Now() + options_.timeout;
  const size_t bytes = count * SizeOf(type);
  const auto* in = static_cast<const uint8_t*>(buf);
  const PoolOffset line = P2pAt(rank_, peer);
  const PoolOffset consumed = line + offsetof(P2pLayout, consumed);
  for (size_t k = 0, at = 0; k < Chunks(bytes, p2p_bytes_); ++k, at += p2p_bytes_) {
    const size_t len = std::min<size_t>(p2p_bytes_, bytes - at);
    const uint64_t seq = ++sent_[peer];
    absl::Status s = runtime::WaitUntil([&] { return c_.LoadFlag(consumed) + 1 >= seq; }, deadline_,
                                        "the receiver", watch(), kDataPathYield, spins_);
    if (!s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("Send from rank ", rank_, " to rank ", peer,
                                                      " of ", name_, ": ", s.message())));
    }
    if (dev) {
      if (absl::Status d =
              Finish(*dev, dev->ToPool(P2pBufferAt(rank_, peer), in + at, len), deadline_);
          !d.ok()) {
        return Fail(absl::Status(d.code(), absl::StrCat("Send from rank ", rank_, " to rank ", peer,
                                                        ": the cuda copy engine: ", d.message())));
      }
    } else {
      c_.CopyToPool(P2pBufferAt(rank_, peer), in + at, len);
    }
    P2pLayout p = {};
    p.bytes = len;
    p.total = count;
    p.type = static_cast<uint64_t>(type);
    p.instance = instance_;
    PublishBody(line, &p, offsetof(P2pLayout, pad0));
    c_.StoreFlag(line, seq);
  }
  return EndOnStream(engine, stream);
}

absl::Status Communicator::Recv(void* buf, size_t count, DataType type, int peer, void* stream) {
  Quiesce();
  if (destroyed_ || !failed().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " is aborted or destroyed"));
  }
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recv from rank ", peer, " at rank ", rank_, " of ", nranks_));
  }
  CXLRT_ASSIGN_OR_RETURN(CopyEngine * engine, EngineFor("Recv", {buf}, stream));
  DeviceEngine* dev = DeviceOf(engine);
  deadline_ = absl::Now() + options_.timeout;
  const size_t bytes = count * SizeOf(type);
  auto* out = static_cast<uint8_t*>(buf);
  const PoolOffset line = P2pAt(peer, rank_);
  for (size_t k = 0, at = 0; k < Chunks(bytes, p2p_bytes_); ++k, at += p2p_bytes_) {
    const size_t len = std::min<size_t>(p2p_bytes_, bytes - at);
    const uint64_t seq = ++received_[peer];
    absl::Status s = runtime::WaitUntil([&] { return c_.LoadFlag(line) >= seq; }, deadline_,
                                        "the sender", watch(), kDataPathYield, spins_);
    if (!s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("Recv at rank ", rank_, " from rank ", peer,
                                                      " of ", name_, ": ", s.message())));
    }
    const P2pLayout p = c_.FetchObject<P2pLayout>(line);
    if (p.instance != instance_ || p.bytes > p2p_bytes_) {
      return Fail(absl::DataLossError(absl::StrCat(
          "Recv at rank ", rank_, " from rank ", peer, " of ", name_, ": the channel holds ",
          p.bytes, " bytes of communicator instance ", absl::Hex(p.instance), " (this one is ",
          absl::Hex(instance_), ", buffers of ", p2p_bytes_, " bytes)")));
    }
    if (p.total != count || p.type != static_cast<uint64_t>(type) || p.bytes != len) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, " called Recv(count=", count, ", ", DataTypeName(type),
                       ") but rank ", peer, " called Send(count=", p.total, ", ",
                       p.type < kNumDataTypes ? DataTypeName(static_cast<DataType>(p.type)) : "?",
                       ") on ", name_)));
    }
    if (len && dev) {
      const uint8_t* from = c_.BeginRead(P2pBufferAt(peer, rank_), len);
      if (absl::Status d = Finish(*dev, dev->FromPool(out + at, from, len), deadline_); !d.ok()) {
        return Fail(absl::Status(d.code(), absl::StrCat("Recv at rank ", rank_, " from rank ", peer,
                                                        ": the cuda copy engine: ", d.message())));
      }
    } else if (len) {
      c_.CopyFromPool(out + at, P2pBufferAt(peer, rank_), len);
    }
    c_.StoreFlag(P2pAt(peer, rank_) + offsetof(P2pLayout, consumed), seq);
  }
  return EndOnStream(engine, stream);
}

}  // namespace cxlrt::collectives
