// What the communicator tests share (communicator_*_test.cc): a reference
// for every collective computed element by element, apart from the
// kernels; one rank's run of a case, checked bit for bit; ranks run as
// forked processes over one pool (CollectivesTest, in the hardware and the
// simulated coherence domain); the case matrices.
// Thread-safety: a test's main thread, and each rank process on its own.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/coherence_domain.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {

// --- The reference: element by element, written apart from the kernels. ---

uint16_t RefBf16(float f);

float FromBf16(uint16_t b);

// Input element i of rank r, as a double (small integers and halves, so
// sums stay exact; products of 16-bit floats round only at the end).
double Value(DataType t, int r, size_t i);

void Store(DataType t, void* buf, size_t i, double v);

// Reduction of element i over ranks 0..n-1 in order, stored at out[o].
void RefReduce(DataType t, RedOp op, int n, size_t i, void* out, size_t o);

// --- One rank's run of a case. ---

struct Case {
  CollKind kind;
  DataType type;
  RedOp op;
  size_t count;  // NCCL's count argument of the call
  int root;
  bool in_place;
  bool in_pool;        // buffers from comm.Allocate (zero-copy)
  bool mixed = false;  // in_pool on rank 0 only: ranks disagree on zero-copy
};

std::string Name(const Case& c);

// Elements of the send and receive buffers of `c` at a rank of n.
std::pair<size_t, size_t> Sizes(const Case& c, int n);

// Runs `c` on `comm` and checks the result. Returns "" or what was wrong.
// `pool`: the rank's pool; inputs in pool-resident buffers that are posted
// in place (out of place) are written through its coherence layer: in the
// simulated domain they then sit in this host's cache until the collective
// writes them back, so a missing write-back shows as wrong bytes at peers.
std::string RunCase(Communicator& comm, const Case& c, runtime::Pool& pool);

// Calls case `c` on a communicator of either kind (collectives::Communicator,
// pods::MultiPodCommunicator: the same collective signatures). kBarrier and
// kAllToAllV (not in the case matrices) run a barrier.
template <typename Comm>
absl::Status CallCase(Comm& comm, const Case& c, const void* send, void* recv) {
  switch (c.kind) {
    case CollKind::kAllReduce:
      return comm.AllReduce(send, recv, c.count, c.type, c.op);
    case CollKind::kReduceScatter:
      return comm.ReduceScatter(send, recv, c.count, c.type, c.op);
    case CollKind::kAllGather:
      return comm.AllGather(send, recv, c.count, c.type);
    case CollKind::kBroadcast:
      return comm.Broadcast(send, recv, c.count, c.type, c.root);
    case CollKind::kReduce:
      return comm.Reduce(send, recv, c.count, c.type, c.op, c.root);
    case CollKind::kGather:
      return comm.Gather(send, recv, c.count, c.type, c.root);
    case CollKind::kScatter:
      return comm.Scatter(send, recv, c.count, c.type, c.root);
    case CollKind::kAllToAll:
      return comm.AllToAll(send, recv, c.count, c.type);
    case CollKind::kBarrier:
    case CollKind::kAllToAllV:
      return comm.Barrier();
  }
  return absl::InvalidArgumentError("unknown collective kind");
}

// --- Running ranks as processes. ---

struct RankHost {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
};

absl::StatusOr<RankHost> OpenRankHost(const std::string& uri,
                                      absl::Duration lease = absl::Milliseconds(1000));

// Waits up to `within` for rank 0 of `name` to publish its header; returns the
// block and header, or nullopt.
std::optional<std::pair<allocator::NamedBlock, CommHeaderLayout>> AwaitHeader(
    RankHost& h, const std::string& name, absl::Duration within);

class CollectivesTest : public ::testing::TestWithParam<runtime::CoherenceDomain> {
 protected:
  // More URI parameters for the pool (subclasses).
  virtual std::string Extra() const { return ""; }
  // A 512 MiB pool in the parameter's coherence domain.
  void SetUp() override;
  void TearDown() override;

  // Runs `body(comm, alloc)` in `n` rank processes over one communicator;
  // fails the test with a rank's error text. `body` returns "" for
  // success; rank r must exit with `expect_rc(r)` (0 by default).
  using Body = std::function<std::string(Communicator&, allocator::Allocator&)>;
  void RunRanks(int n, const Body& body, absl::Duration timeout = absl::Seconds(240),
                const CommOptions& options = {}, const std::string& name = "test",
                const std::function<int(int)>& expect_rc = nullptr);

  static constexpr size_t kErrPerRank = 1024;
  static constexpr size_t kErrBytes = 8 * kErrPerRank;
  // Set: every rank's communicator moves its bytes through the engine this
  // makes (for rank r, over its pool).
  std::function<std::unique_ptr<CopyEngine>(runtime::Coherence&, int)> engine_factory_;
  // The ranks' membership lease: short, so that tests of dead ranks end
  // quickly; long where many ranks share the cores and a starved heartbeat
  // must not get a live rank fenced.
  absl::Duration rank_lease_ = absl::Milliseconds(1000);
  ::cxlrt::testing::TempDir dir_;
  std::string create_, uri_;
  char* errors_ = nullptr;
};

// --- The cases. ---

std::vector<CollKind> AllKinds();

bool Reduces(CollKind k);

bool Rooted(CollKind k);

// Every collective x type x op at small counts (0, 1, odd, not divisible by
// the rank count), out of place and in place; then large messages (1 MiB
// and 16 MiB) for a few types, which cross the one-shot / two-shot switch
// and the slot-size chunking; then pool-resident buffers.
std::vector<Case> Matrix(int n, bool full);

std::string RunAll(Communicator& comm, const std::vector<Case>& cases, runtime::Pool& pool);

// Cases for the pipeline tests: every collective over many chunks, private
// and pool-resident, out of place and in place.
std::vector<Case> PipelineCases();

}  // namespace cxlrt::collectives
