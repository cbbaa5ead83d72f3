// The front door: one call opens (or creates) a pool, attaches this process
// to it as a host and opens the host's allocator; the KV store and
// communicators are made from the Host it returns.
//
//   absl::StatusOr<cxlrt::Host> host = cxlrt::Host::Open();  // CXLRT_POOL
//   auto store = host->OpenStore();  // std::shared_ptr<kv::Store>
//   (*store)->Put("llama-8b", "seq-7/blk-0", data, size);
//
// Without it a program holds four objects (Pool, Membership, Allocator,
// Store), each of which must outlive the next. Here a Host is a handle on
// that shared state, as the Python package's Host is: copies share it, and
// a Store or Communicator made from a Host holds a share too, so it stays
// usable after every Host handle is gone. The state closes when its last
// share goes, in reverse order: the allocator closes (this host's private
// blocks are reclaimed), the host detaches, the pool is unmapped.
//
// Thread-safety: copies of a Host may be used from any threads at once; one
// Host object, like a std::shared_ptr, must not be closed (Close, assigned
// to) while another thread uses it. What it makes follows its own class's
// rules (a Store: any thread; a Communicator: one thread at a time).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt {

struct HostOptions {
  // Creates the pool when the URI names none (the URI then needs size=).
  // When several processes create it at once, one does and the others open
  // it. false: a missing pool is kNotFound.
  bool create = false;
  // Where this process attaches (default: the slots of CXLRT_HOST_ID, else
  // the first free one) and its lease.
  runtime::AttachOptions attach;
  allocator::AllocatorOptions allocator;
};

class Host {
 public:
  // Opens the pool `uri` names ("": the CXLRT_POOL variable, which
  // `cxlrt run` sets), attaches as a host and opens the allocator.
  // kInvalidArgument: no URI and CXLRT_POOL unset, or a bad URI (the
  // message names it); kNotFound: no such pool and !options.create; and
  // the errors of Pool::Open / Create, Membership::Attach and
  // Allocator::Open.
  static absl::StatusOr<Host> Open(absl::string_view uri = "", const HostOptions& options = {});

  // The pool's KV store (made when options.create and the pool has none;
  // kv::Store::Open says what else it returns). The Store keeps this
  // host's state alive until it is destroyed. kFailedPrecondition when this
  // handle is closed.
  absl::StatusOr<std::shared_ptr<kv::Store>> OpenStore(const kv::StoreOptions& options = {}) const;

  // Creates or joins communicator `name` as `rank` of `nranks` (both -1:
  // from the launcher's environment; Communicator::Create says what it
  // returns). The Communicator keeps this host's state alive; destroying
  // it leaves the communicator (a barrier, Communicator::Destroy).
  // kFailedPrecondition when this handle is closed.
  absl::StatusOr<std::shared_ptr<collectives::Communicator>> CreateCommunicator(
      absl::string_view name, int nranks = -1, int rank = -1,
      const collectives::CommOptions& options = {}) const;

  // Drops this handle's share of the state. When it was the last share,
  // closes the allocator and detaches, and returns the first error of
  // those steps; otherwise returns OK and the state closes when the last
  // Store, Communicator or Host copy using it goes (errors are logged then).
  // Later calls on this handle return kFailedPrecondition; Close again is OK.
  absl::Status Close();
  bool closed() const { return state_ == nullptr; }

  // The parts, for what the front door does not cover (named blocks,
  // liveness of other hosts). REQUIRES: !closed(); the reference lives as
  // long as a share of the state (this handle, a copy, or what it made).
  runtime::Pool& pool() const;
  runtime::Membership& membership() const;
  allocator::Allocator& allocator() const;

 private:
  struct State;
  explicit Host(std::shared_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<std::shared_ptr<State>> Share() const;

  std::shared_ptr<State> state_;
};

}  // namespace cxlrt
