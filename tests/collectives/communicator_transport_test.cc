// The transport under every collective, across emulated hosts (forked
// processes): chunks pipelined through small slots and rings of every
// depth; copy engines that complete late and out of order, in the CUDA
// engine's order, or publish the post lines themselves; a stalled rank;
// ranks that disagree on zero-copy; pool buffers posted in place or copied;
// mismatched calls and corrupt posts; slots striped over a pool's devices.
// Both the hardware and the simulated coherence domain.

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/membership.h"
#include "gtest/gtest.h"
#include "tests/collectives/communicator_test_util.h"
#include "tests/collectives/late_engine.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {
namespace {

using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::WaitExit;
using runtime::CoherenceDomain;

TEST_P(CollectivesTest, SmallSlotsPipelineLargeMessagesThroughManyChunks) {
  // Slots of 4 KiB against messages of 20 KiB and more: tens of chunks in
  // flight per call, at the shallowest and the deepest ring, and with
  // chunks smaller than the slot.
  const auto cases = PipelineCases();
  for (uint32_t depth : {2u, 8u}) {
    for (uint64_t chunk : {uint64_t{0}, uint64_t{1000}}) {
      SCOPED_TRACE(absl::StrCat("depth ", depth, ", chunk ", chunk));
      CommOptions o;
      o.slot_bytes = 4096;
      o.oneshot_max = 256;
      o.depth = depth;
      o.chunk_bytes = chunk;
      RunRanks(
          3,
          [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
            const uint64_t before = comm.posts();
            std::string e = RunAll(comm, cases, alloc.pool());
            if (e.empty() && comm.posts() - before < 5 * cases.size()) {
              return absl::StrCat(comm.posts() - before, " posts for ", cases.size(),
                                  " calls: the messages did not go in many chunks");
            }
            return e;
          },
          absl::Seconds(120), o);
      if (HasFailure()) return;
    }
  }
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactWhenTheEngineCompletesLateAndOutOfOrder) {
  // The algorithms must wait for each copy before publishing it, for each
  // reduction before posting its result, and for each read before marking
  // a post read: the late engine runs nothing when asked, and later in a
  // random order.
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    return std::make_unique<LateEngine>(c, 1234 + r);
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kBfloat16, RedOp::kAvg, 3, Rooted(k) ? 0 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) {
        return RunAll(comm, cases, alloc.pool());
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactUnderTheCudaEnginesOrdering) {
  // The CUDA engine's contract replayed on the CPU: no inline posts (device
  // buffers are not host-readable), every copy and reduction a ticket that
  // completes late and out of order. Tiny calls then go through slots too.
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    return std::make_unique<LateEngine>(c, 4321 + r, /*device_like=*/true);
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kFloat16, RedOp::kSum, 1, Rooted(k) ? 1 : -1, false, false});
    cases.push_back({k, DataType::kInt64, RedOp::kMax, 5, Rooted(k) ? 0 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) {
        return RunAll(comm, cases, alloc.pool());
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactWhenTheEnginePublishesThePostLines) {
  // CXLRT_CUDA_DOORBELL=copy replayed on the CPU: the engine writes each
  // post line and flag itself, late, after the copies behind it (as a
  // stream orders them), while the host goes on. A line published before
  // its bytes, or a slot reused before its peers read it, fails the checks.
  std::vector<LateEngine*> engines(3, nullptr);
  engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    auto e = std::make_unique<LateEngine>(c, 777 + r, /*device_like=*/true, /*publishes=*/true);
    engines[r] = e.get();
    return e;
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kFloat32, RedOp::kSum, 3, Rooted(k) ? 2 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        std::string e = RunAll(comm, cases, alloc.pool());
        if (e.empty() && engines[comm.rank()]->published() == 0) {
          return "the engine published no post line";
        }
        return e;
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, ARankStalledMidStreamDelaysTheOthersButNotTheirResults) {
  // Rank 1 stalls 300 ms before publishing its 7th post (inside a call of
  // many chunks): the others run ahead up to their rings and wait; every
  // result stays exact.
  CommOptions o;
  o.slot_bytes = 4096;
  o.oneshot_max = 256;
  const auto cases = PipelineCases();
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        if (comm.rank() == 1) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:stall=300:7");
          if (!armed.ok()) return armed.ToString();
        }
        const absl::Time start = absl::Now();
        std::string e = RunAll(comm, cases, alloc.pool());
        if (e.empty() && absl::Now() - start < absl::Milliseconds(300)) {
          return "the stall did not happen";
        }
        return e;
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, RanksThatDisagreeOnZeroCopyStillRunTheSameRounds) {
  // Rank 0's buffers lie in the pool, the others' do not: chunking must not
  // depend on it, or the ranks would run different numbers of rounds. No
  // rank dies: a long lease, as in EightRanksOnTwoCoresCompleteEveryCollective.
  rank_lease_ = absl::Seconds(10);
  std::vector<Case> cases;
  for (size_t count : {size_t{1000}, (size_t{3} << 20) / 4 + 5}) {
    for (CollKind k : AllKinds()) {
      for (int root : {0, 1}) {
        if (!Rooted(k) && root == 1) continue;
        cases.push_back(
            {k, DataType::kFloat32, RedOp::kSum, count, Rooted(k) ? root : -1, false, true, true});
      }
    }
  }
  RunRanks(3, [&](Communicator& comm, allocator::Allocator& alloc) {
    return RunAll(comm, cases, alloc.pool());
  });
}

TEST_P(CollectivesTest, APoolBufferOffItsElementsIsCopiedNotPostedInPlace) {
  // A peer refuses a post whose data is not aligned to the call's elements
  // (a hostile post made readers load misaligned floats), so a rank whose
  // pool-resident buffer is off its elements must copy it through its slot.
  RunRanks(2, [](Communicator& comm, allocator::Allocator&) -> std::string {
    constexpr size_t kCount = 20000;  // out-of-line: 80 KB
    auto buf = comm.Allocate(kCount * sizeof(float) + 8);
    if (!buf.ok()) return buf.status().ToString();
    auto* send = static_cast<uint8_t*>(*buf) + 2;  // off a float boundary
    for (size_t i = 0; i < kCount; ++i) {
      const float v = static_cast<float>(comm.rank() * 100000 + i);
      std::memcpy(send + i * sizeof(float), &v, sizeof(v));
    }
    std::vector<float> out(2 * kCount);
    absl::Status s = comm.AllGather(send, out.data(), kCount, DataType::kFloat32);
    if (!s.ok()) return "AllGather: " + s.ToString();
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        if (out[r * kCount + i] != static_cast<float>(r * 100000 + i)) {
          return absl::StrCat("element ", i, " of rank ", r, " is ", out[r * kCount + i]);
        }
      }
    }
    absl::Status freed = comm.Free(*buf);
    return freed.ok() ? "" : "Free: " + freed.ToString();
  });
}

TEST_P(CollectivesTest, AMismatchedCallIsAnErrorOnEveryRankNamingBoth) {
  RunRanks(2, [](Communicator& comm, allocator::Allocator&) -> std::string {
    std::vector<float> a(2048, 1.0f), b(2048);
    const size_t count = comm.rank() == 0 ? 1024 : 2048;
    absl::Status s = comm.AllReduce(a.data(), b.data(), count, DataType::kFloat32, RedOp::kSum);
    if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
    const std::string msg(s.message());
    if (msg.find("count=1024") == std::string::npos ||
        msg.find("count=2048") == std::string::npos || msg.find("rank 0") == std::string::npos ||
        msg.find("rank 1") == std::string::npos) {
      return "the message does not name both calls and ranks: " + msg;
    }
    s = comm.Barrier();
    if (s.code() != absl::StatusCode::kFailedPrecondition) {
      return "an aborted communicator ran a call: " + s.ToString();
    }
    return "";
  });
  // Different collectives, too.
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<int32_t> a(10, 1), b(30);
        absl::Status s = comm.rank() == 2
                             ? comm.AllGather(a.data(), b.data(), 10, DataType::kInt32)
                             : comm.Broadcast(a.data(), b.data(), 10, DataType::kInt32, 0);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
        if (std::string(s.message()).find("AllGather") == std::string::npos) {
          return "does not name the other call: " + s.ToString();
        }
        return "";
      },
      absl::Seconds(60), {}, "mixed");
}

// Issue 13, defect 7: a peer whose post says it holds fewer bytes than the
// call reads (here 8 inline bytes for a 64 KiB broadcast) is a corrupt
// post: kDataLoss, never a read past the post into other memory.
TEST_P(CollectivesTest, APostShorterThanTheCallIsDataLossNotAnOverRead) {
  CommOptions o;
  o.timeout = absl::Seconds(5);
  constexpr size_t kCount = 16384;  // floats: 64 KiB
  pid_t reader = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "short", 2, 0, o);
    if (!comm.ok()) return 3;
    std::vector<float> out(kCount, -1.0f);
    absl::Status s = (*comm)->Broadcast(nullptr, out.data(), kCount, DataType::kFloat32, 1);
    if (s.code() != absl::StatusCode::kDataLoss ||
        s.message().find("posted 8 bytes") == std::string::npos) {
      std::fprintf(stderr, "reader got %s\n", s.ToString().c_str());
      return 4;
    }
    (*comm)->Abort();
    return 0;
  });
  // The hostile rank 1: a live host that joins by hand and posts round 1
  // with the right call but 8 bytes.
  pid_t hostile = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    runtime::Coherence& c = h->pool->coherence();
    auto made = AwaitHeader(*h, "comm/short", absl::Seconds(5));
    if (!made) return 3;
    auto& [b, hdr] = *made;
    auto slot = h->alloc->Allocate(hdr.slot_bytes);
    if (!slot.ok()) return 4;
    const runtime::PoolOffset rank1 = b.offset + sizeof(CommHeaderLayout) + sizeof(RankLayout);
    JoinLayout me = {};
    me.instance = hdr.instance;
    me.host_slot = h->membership->slot();
    me.host_epoch = h->membership->epoch();
    me.pid = getpid();
    RingLayout ring = {};
    for (uint32_t i = 0; i < hdr.depth; ++i) ring.slot[i] = *slot;
    c.Publish(rank1 + 8, reinterpret_cast<uint8_t*>(&me) + 8, sizeof(me) - 8);
    c.Publish(rank1 + offsetof(RankLayout, ring), &ring, sizeof(ring));
    c.StoreFlag(rank1, static_cast<uint64_t>(JoinState::kJoined));
    PostLayout post = {};
    post.instance = hdr.instance;
    post.desc.kind = static_cast<uint8_t>(CollKind::kBroadcast);
    post.desc.type = static_cast<uint8_t>(DataType::kFloat32);
    post.desc.op = static_cast<uint8_t>(RedOp::kSum);
    post.desc.root = 1;
    post.desc.count = kCount;
    post.desc.call = 1;
    post.len = 8;
    const runtime::PoolOffset line = rank1 + offsetof(RankLayout, post) + sizeof(PostLayout);
    c.Publish(line + 8, reinterpret_cast<uint8_t*>(&post) + 8, sizeof(post) - 8);
    c.StoreFlag(line, 1);
    // Stay alive (and leave) once rank 0 has read the post.
    absl::SleepFor(absl::Seconds(2));
    c.StoreFlag(rank1, static_cast<uint64_t>(JoinState::kLeft));
    return 0;
  });
  EXPECT_EQ(WaitExit(reader, absl::Seconds(30)), 0);
  EXPECT_EQ(WaitExit(hostile, absl::Seconds(30)), 0);
}

// A pool of two devices: each rank's slots alternate devices by round
// parity and differ between neighbouring ranks, so every round spreads over
// both devices and a root's rounds rotate between them.
class StripedCollectivesTest : public CollectivesTest {
  std::string Extra() const override { return "&devices=2"; }
};

TEST_P(StripedCollectivesTest, SlotsAreStripedOverDevicesAndCollectivesStayExact) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    const runtime::DeviceMap& d = alloc.pool().devices();
    if (d.count() != 2) return absl::StrCat("the pool has ", d.count(), " devices");
    const uint32_t r = comm.rank();
    const std::vector<runtime::PoolOffset>& slots = comm.slots();
    for (uint32_t i = 0; i < slots.size(); ++i) {
      if (d.DeviceOf(slots[i]) != (r + i) % 2) {
        return absl::StrCat("rank ", r, "'s slot ", i, " is on device ", d.DeviceOf(slots[i]));
      }
    }
    std::vector<Case> cases;
    for (CollKind k : AllKinds()) {
      cases.push_back(
          {k, DataType::kFloat32, RedOp::kSum, 300000, Rooted(k) ? 2 : -1, false, false});
    }
    return RunAll(comm, cases, alloc.pool());
  });
}

INSTANTIATE_TEST_SUITE_P(Domains, CollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));
INSTANTIATE_TEST_SUITE_P(Domains, StripedCollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

}  // namespace
}  // namespace cxlrt::collectives
