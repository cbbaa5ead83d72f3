#include "cxlrt/cxlrt.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/metrics/http_exporter.h"
#include "cxlrt/metrics/pool_metrics.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt {

// What a host's objects use. Members are destroyed in reverse order: the
// allocator closes before the host detaches, and both before the pool is
// unmapped. Each destructor logs its own errors; Close() reports them.
struct Host::State {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
  // Publishes this process's metrics into the pool (docs/metrics.md); last,
  // so it stops before the allocator it allocates from closes.
  std::unique_ptr<metrics::MetricsPublisher> publisher;

  // Closes the allocator and detaches; returns the first error.
  absl::Status Shutdown() {
    publisher.reset();
    absl::Status closed = alloc->Close();
    absl::Status detached = membership->Detach();
    return closed.ok() ? detached : closed;
  }
};

namespace {

absl::StatusOr<std::unique_ptr<runtime::Pool>> OpenPool(absl::string_view uri, bool create) {
  auto pool = runtime::Pool::Open(uri);
  if (pool.ok() || !create) return pool;
  if (absl::IsNotFound(pool.status())) {
    pool = runtime::Pool::Create(uri);
    if (!absl::IsAlreadyExists(pool.status())) return pool;
    pool = runtime::Pool::Open(uri);  // raced a creator
  }
  // A creator that won the race writes the header last, so an Open in the
  // meantime finds it zero (kDataLoss). Wait for it, for a bounded time: a
  // creator that died leaves that error.
  constexpr absl::Duration kCreatorWait = absl::Seconds(10);
  const absl::Time deadline = absl::Now() + kCreatorWait;
  while (absl::IsDataLoss(pool.status()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
    pool = runtime::Pool::Open(uri);
  }
  if (absl::IsDataLoss(pool.status())) {
    return absl::DataLossError(absl::StrCat(pool.status().message(), " (waited ",
                                            absl::FormatDuration(kCreatorWait),
                                            " for another process creating it)"));
  }
  return pool;
}

// An object made from a host, with the share of the host's state it uses;
// declared first, the share is dropped after the object.
template <typename T>
struct WithHost {
  std::shared_ptr<void> host;
  std::unique_ptr<T> object;
};

// A shared_ptr to `object` that owns `host` too.
template <typename T>
std::shared_ptr<T> Holding(std::shared_ptr<void> host, std::unique_ptr<T> object) {
  auto both = std::make_shared<WithHost<T>>(WithHost<T>{std::move(host), std::move(object)});
  T* raw = both->object.get();
  return std::shared_ptr<T>(std::move(both), raw);
}

}  // namespace

absl::StatusOr<Host> Host::Open(absl::string_view uri, const HostOptions& options) {
  std::string name(uri);
  if (name.empty()) {
    const std::optional<std::string> env = runtime::PoolUriFromEnvironment();
    if (!env) {
      return absl::InvalidArgumentError(
          "no pool URI given and CXLRT_POOL is not set (cxlrt run sets it; or pass a URI such "
          "as emu://job1?size=1G)");
    }
    name = *env;
  }
  auto state = std::make_shared<State>();
  CXLRT_ASSIGN_OR_RETURN(state->pool, OpenPool(name, options.create));
  CXLRT_ASSIGN_OR_RETURN(state->membership,
                         runtime::Membership::Attach(*state->pool, options.attach));
  CXLRT_ASSIGN_OR_RETURN(state->alloc, allocator::Allocator::Open(*state->pool, *state->membership,
                                                                  options.allocator));
  state->publisher =
      std::make_unique<metrics::MetricsPublisher>(*state->pool, *state->membership, *state->alloc);
  if (absl::Status s = metrics::ServeProcessMetricsFromEnvironment(); !s.ok()) {
    // The pool-wide view still has this host's metrics: not worth failing for.
    CXLRT_LOG(kError) << "not serving this process's metrics: " << s;
  }
  return Host(std::move(state));
}

absl::StatusOr<std::shared_ptr<Host::State>> Host::Share() const {
  if (state_ == nullptr) return absl::FailedPreconditionError("the host is closed");
  return state_;
}

absl::StatusOr<std::shared_ptr<kv::Store>> Host::OpenStore(const kv::StoreOptions& options) const {
  CXLRT_ASSIGN_OR_RETURN(std::shared_ptr<State> state, Share());
  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<kv::Store> store, kv::Store::Open(*state->alloc, options));
  return Holding(std::move(state), std::move(store));
}

absl::StatusOr<std::shared_ptr<collectives::Communicator>> Host::CreateCommunicator(
    absl::string_view name, int nranks, int rank, const collectives::CommOptions& options) const {
  CXLRT_ASSIGN_OR_RETURN(std::shared_ptr<State> state, Share());
  CXLRT_ASSIGN_OR_RETURN(
      std::unique_ptr<collectives::Communicator> comm,
      collectives::Communicator::Create(*state->alloc, name, nranks, rank, options));
  return Holding(std::move(state), std::move(comm));
}

absl::Status Host::Close() {
  std::shared_ptr<State> state = std::move(state_);
  state_ = nullptr;
  // use_count is exact for the last share: no other handle can copy it.
  if (state == nullptr || state.use_count() > 1) return absl::OkStatus();
  return state->Shutdown();
}

runtime::Pool& Host::pool() const { return *state_->pool; }
runtime::Membership& Host::membership() const { return *state_->membership; }
allocator::Allocator& Host::allocator() const { return *state_->alloc; }

}  // namespace cxlrt
