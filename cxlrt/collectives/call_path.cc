// The call path of a collective: the engine for its buffers, Begin (checks,
// the call's number, the algorithm's context), the asynchronous queue, the
// end of a call on its stream, and failure. Run and RunNow, which every
// public call instantiates, are in communicator_impl.h.
#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/runtime/membership.h"

namespace cxlrt::collectives {

absl::Status Communicator::Impl::DrainEngines(absl::Time deadline) {
  for (CopyEngine* e : {options_.engine, static_cast<CopyEngine*>(gpu_engine_.get())}) {
    if (e == nullptr) continue;
    if (absl::Status s = e->Drain(deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", rank_, " of ", name_, ": the ", e->name(),
                                                 " copy engine: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::Impl::SettleAfterError(CopyEngine& engine, absl::Status error) {
  // The caller may reuse or free its buffers once the call returns: copies
  // into them (and out of them) end first, as they do before an OK return.
  absl::Status s = engine.Drain(absl::Now() + options_.timeout);
  if (s.ok()) return error;
  return absl::Status(error.code(), absl::StrCat(error.message(), " (and the ", engine.name(),
                                                 " copy engine: ", s.message(),
                                                 ": its copies may still write the buffers)"));
}

absl::Status Communicator::Impl::Fail(absl::Status s) { return transport_->Fail(std::move(s)); }

const absl::Status& Communicator::Impl::failed() const { return transport_->failed(); }

runtime::WaitWatch* Communicator::Impl::watch() const { return watch_.get(); }

std::optional<PoolOffset> Communicator::Impl::InPool(const void* p, size_t len) const {
  return algorithms::PoolOffsetOf(pool_.backend().base(), pool_.size(), p, len);
}

absl::StatusOr<CopyEngine*> Communicator::Impl::EngineFor(
    const char* what, std::initializer_list<const void*> buffers, void* stream, bool start) {
  if (options_.engine) return options_.engine;
  // Pool buffers are reachable by either engine; the others decide.
  const void* gpu_buffer = nullptr;
  const void* host = nullptr;
  for (const void* b : buffers) {
    if (b == nullptr || InPool(b, 1)) continue;
    (gpu::KindOf(b) == runtime::MemoryKind::kGpu ? gpu_buffer : host) = b;
  }
  if (gpu_buffer == nullptr) {
    if (stream != nullptr) CXLRT_RETURN_IF_ERROR(gpu::StreamSynchronize(stream));
    return cpu_engine_.get();
  }
  if (host != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " on rank ", rank_, " of ", name_, ": buffer ",
        absl::Hex(reinterpret_cast<uintptr_t>(gpu_buffer)), " is GPU memory but ",
        absl::Hex(reinterpret_cast<uintptr_t>(host)),
        " is host memory outside the pool; give a call's buffers in one kind (or host buffers "
        "from Allocate)"));
  }
  if (!gpu_engine_) {
    auto e = MakeGpuCopyEngine(c_, pool_.backend().base(), pool_.size());
    if (!e.ok()) {
      return absl::Status(e.status().code(),
                          absl::StrCat(what, " on rank ", rank_, " of ", name_,
                                       " with GPU buffers: ", e.status().message()));
    }
    gpu_engine_ = *std::move(e);
  }
  if (start) CXLRT_RETURN_IF_ERROR(gpu_engine_->StartAfter(stream));
  return gpu_engine_.get();
}

absl::Status Communicator::Impl::EndOnStream(CopyEngine* engine, void* stream) {
  GpuCopyEngine* dev = GpuOf(engine);
  return dev ? dev->FinishBefore(stream) : absl::OkStatus();
}

absl::StatusOr<algorithms::Call> Communicator::Impl::Begin(CollKind kind, DataType type, RedOp op,
                                                           size_t count, int root,
                                                           CopyEngine& engine) {
  if (root >= nranks_ || (root < 0 && (kind == CollKind::kBroadcast || kind == CollKind::kReduce ||
                                       kind == CollKind::kGather || kind == CollKind::kScatter))) {
    return absl::InvalidArgumentError(
        absl::StrCat(CollKindName(kind), ": root ", root, " is not a rank of ", nranks_));
  }
  if (static_cast<int>(type) >= kNumDataTypes || static_cast<int>(op) >= kNumRedOps) {
    return absl::InvalidArgumentError(absl::StrCat(CollKindName(kind), ": unknown type or op"));
  }
  // This host's slots are written from here on: the lease, and the slot
  // read from the pool (each post checks the lease again).
  CXLRT_RETURN_IF_ERROR(alloc_.membership().ConfirmLease());
  CallDesc d;
  d.kind = static_cast<uint8_t>(kind);
  d.type = static_cast<uint8_t>(type);
  d.op = static_cast<uint8_t>(op);
  d.root = root;
  d.count = count;
  d.call = ++calls_;
  transport_->BeginCall(d, options_.timeout, &engine);
  return algorithms::Call{.t = *transport_,
                          .e = engine,
                          .type = type,
                          .es = SizeOf(type),
                          .coherence = c_,
                          .pool_base = pool_.backend().base(),
                          .pool_size = pool_.size(),
                          .chunk_override = options_.chunk_bytes,
                          .oneshot_max = options_.oneshot_max};
}

absl::Status Communicator::Impl::Usable() const { return UsableAfter(failed()); }

absl::Status Communicator::Impl::UsableAfter(const absl::Status& failure) const {
  if (destroyed_) return absl::FailedPreconditionError(name_ + " was destroyed");
  if (!failure.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " was aborted by an earlier error: ", failure.message()));
  }
  return absl::OkStatus();
}

void Communicator::Impl::Quiesce() {
  if (proxy_) (void)proxy_->Drain();
}

absl::Status Communicator::Impl::Synchronize() {
  if (!proxy_) return absl::OkStatus();
  return proxy_->Drain();
}

absl::Status Communicator::Impl::AsyncError() const {
  return proxy_ ? proxy_->error() : absl::OkStatus();
}

}  // namespace cxlrt::collectives
