// One emulated host for tests: this process's own open of a pool, its
// membership and its allocator (each open of a pool in one process is a
// separate host). Returns errors instead of asserting: forked children use
// it too.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::testing {

struct TestHost {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
};

struct TestHostOptions {
  bool create_pool = false;      // Pool::Create(uri) instead of Open
  std::optional<uint32_t> slot;  // else any free slot
  // A lease (the heartbeat beats four times per lease, at most every 40 ms);
  // else the configured default.
  std::optional<absl::Duration> lease;
  absl::Duration tick = absl::Milliseconds(1);  // the allocator's; zero: none
};

// Options that create the pool.
inline TestHostOptions Creating() {
  TestHostOptions o;
  o.create_pool = true;
  return o;
}

inline absl::StatusOr<TestHost> AttachTestHost(const std::string& uri,
                                               const TestHostOptions& o = {}) {
  TestHost h;
  CXLRT_ASSIGN_OR_RETURN(h.pool,
                         o.create_pool ? runtime::Pool::Create(uri) : runtime::Pool::Open(uri));
  runtime::AttachOptions ao;
  ao.host_id = -1;
  ao.slot = o.slot;
  if (o.lease) {
    ao.lease = *o.lease;
    ao.heartbeat = std::min(absl::Milliseconds(40), *o.lease / 4);
  }
  CXLRT_ASSIGN_OR_RETURN(h.membership, runtime::Membership::Attach(*h.pool, ao));
  allocator::AllocatorOptions opts;
  opts.tick = o.tick;
  CXLRT_ASSIGN_OR_RETURN(h.alloc, allocator::Allocator::Open(*h.pool, *h.membership, opts));
  return h;
}

}  // namespace cxlrt::testing
