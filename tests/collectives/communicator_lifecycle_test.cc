// The life of a communicator and its failures, across emulated hosts
// (forked processes): ranks killed mid-collective, a missing rank, a failed
// copy engine, asynchronous errors; slots and buffers kept until readers
// and engines are done; stale blocks of dead jobs; communicators re-created
// in a loop, with killed ranks, never writing a freed block; bad headers;
// the rank from the launcher's environment. Both the hardware and the
// simulated coherence domain.
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/runtime/checksum.h"
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

// Body of the lifecycle tests: 30 rounds of Create / AllReduce / Destroy
// of one name, with a canary block in the freed block's place.
std::string CycleCommunicators(Communicator& comm, allocator::Allocator& alloc, bool one_core) {
  if (one_core) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof(one), &one);
  }
  const int r = comm.rank(), n = comm.size();
  runtime::Coherence& c = alloc.pool().coherence();
  runtime::PoolOffset canary = 0;
  uint64_t canary_size = 0;
  auto canary_intact = [&]() -> std::string {
    std::vector<uint8_t> got(canary_size);
    c.Fetch(got.data(), canary, canary_size);
    for (uint64_t i = 0; i < canary_size; ++i) {
      if (got[i] != static_cast<uint8_t>(0xA5 ^ i)) {
        return absl::StrCat("canary byte ", i, " of the block freed by Destroy changed to ", got[i],
                            ": a rank wrote a freed communicator block");
      }
    }
    return "";
  };
  // Small Send/Recv channels: rank 0 fills and checks a canary the size of
  // the block every round, which with the default channels (9 MiB for 3
  // ranks) starves the others' heartbeats on one core under a sanitizer
  // past their lease (docs/allocator.md, "Limits").
  CommOptions small;
  small.p2p_bytes = 64 << 10;
  for (int it = 0; it < 30; ++it) {
    auto cy = Communicator::Create(alloc, "cycle", n, r, small);
    if (!cy.ok()) return absl::StrCat("round ", it, " Create: ", cy.status().ToString());
    uint64_t block_size = 0;
    if (r == 0) {
      auto b = alloc.Find("comm/cycle");
      if (!b.ok()) return b.status().ToString();
      block_size = b->size;
    }
    for (int call = 0; call < 3; ++call) {
      const int64_t x = 1000 * (it + 1) + r + call, want_base = 1000 * (it + 1) + call;
      int64_t y = 0;
      absl::Status s = (*cy)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
      if (!s.ok()) return absl::StrCat("round ", it, " AllReduce: ", s.ToString());
      const int64_t want = want_base * n + n * (n - 1) / 2;
      if (y != want) return absl::StrCat("round ", it, " AllReduce gave ", y, ", want ", want);
    }
    if (absl::Status d = (*cy)->Destroy(); !d.ok()) {
      return absl::StrCat("round ", it, " Destroy: ", d.ToString());
    }
    if (r == 0) {
      if (canary != 0) {
        if (std::string e = canary_intact(); !e.empty()) return e;
        (void)alloc.Free(canary);
      }
      auto got = alloc.Allocate(block_size, {.alignment = 2 << 20});
      if (!got.ok()) return got.status().ToString();
      canary = *got;
      canary_size = block_size;
      std::vector<uint8_t> fill(canary_size);
      for (uint64_t i = 0; i < canary_size; ++i) fill[i] = static_cast<uint8_t>(0xA5 ^ i);
      c.CopyToPool(canary, fill.data(), fill.size());
    }
  }
  // The others' last writes land before they leave the outer barrier.
  if (absl::Status s = comm.Barrier(); !s.ok()) return s.ToString();
  if (r == 0) {
    if (std::string e = canary_intact(); !e.empty()) return e;
    (void)alloc.Free(canary);
  }
  return "";
}

// A copy engine that fails (a GPU's sticky error) completes nothing again.
// A rank that meets it while it waits for a peer (which may be waiting for
// this rank's next post) must end the call with the engine's error at once,
// not with "waiting for rank j" at the deadline; the peer then gets
// kAborted. For a collective and for Send.
TEST_P(CollectivesTest, AFailedCopyEngineEndsTheCallWithItsErrorNotAtTheDeadline) {
  for (bool p2p : {false, true}) {
    SCOPED_TRACE(p2p ? "Send/Recv" : "AllReduce");
    engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
      auto e = std::make_unique<LateEngine>(c, 55 + r, /*device_like=*/true);
      if (r == 0) e->FailFrom(6);
      return e;
    };
    CommOptions o;
    o.slot_bytes = 8192;
    o.p2p_bytes = 1024;
    o.timeout = absl::Seconds(100);  // past the test's own limit
    RunRanks(
        2,
        [&](Communicator& comm, allocator::Allocator&) -> std::string {
          std::vector<float> x(100000, 1.0f), y(x.size());
          absl::Status s;
          for (int i = 0; i < 3 && s.ok(); ++i) {
            if (!p2p) {
              s = comm.AllReduce(x.data(), y.data(), x.size(), DataType::kFloat32, RedOp::kSum);
            } else {
              s = comm.rank() == 0 ? comm.Send(x.data(), x.size(), DataType::kFloat32, 1)
                                   : comm.Recv(y.data(), y.size(), DataType::kFloat32, 0);
            }
          }
          if (comm.rank() == 0) {
            if (s.code() != absl::StatusCode::kInternal ||
                std::string(s.message()).find("injected") == std::string::npos) {
              return "rank 0 did not report its engine's failure: " + s.ToString();
            }
          } else if (s.code() != absl::StatusCode::kAborted) {
            return "rank 1 did not see rank 0 abort: " + s.ToString();
          }
          return "";
        },
        absl::Seconds(60), o, "failing");
    if (HasFailure()) return;
  }
}

TEST_P(CollectivesTest, ARankKilledMidCollectiveAbortsTheOthersNamingIt) {
  // Rank 1 dies at its third round post; the others get kAborted naming
  // it within its lease (1 s), far before the 30 s timeout.
  CommOptions o;
  o.timeout = absl::Seconds(30);
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 1) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:3");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(1000, 1.0f), b(1000);
        const absl::Time start = absl::Now();
        absl::Status s;
        for (int i = 0; i < 10 && s.ok(); ++i) {
          s = comm.AllReduce(a.data(), b.data(), 1000, DataType::kFloat32, RedOp::kSum);
        }
        if (comm.rank() == 1) return "rank 1 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 1") == std::string::npos) {
          return "does not name rank 1: " + s.ToString();
        }
        if (absl::Now() - start > absl::Seconds(10)) return "took too long to notice";
        comm.Abort();
        return "";
      },
      absl::Seconds(60), o, "killed", [](int r) { return r == 1 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, ARankKilledMidPipelineAbortsTheOthersNamingIt) {
  // Rank 2 dies at its 9th post, inside one all-gather of many chunks
  // (4 KiB slots, 1 MB per rank), with the others' posts still in its ring:
  // they get kAborted naming it within its lease, not a hang.
  CommOptions o;
  o.timeout = absl::Seconds(30);
  o.slot_bytes = 4096;
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 2) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:9");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(250000, 1.0f), b(3 * 250000);
        const absl::Time start = absl::Now();
        absl::Status s = comm.AllGather(a.data(), b.data(), a.size(), DataType::kFloat32);
        if (comm.rank() == 2) return "rank 2 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 2") == std::string::npos) {
          return "does not name rank 2: " + s.ToString();
        }
        if (absl::Now() - start > absl::Seconds(10)) return "took too long to notice";
        comm.Abort();
        return "";
      },
      absl::Seconds(60), o, "killed-pipeline",
      [](int r) { return r == 2 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, AsynchronousErrorsReachSynchronizeAndTheNextCall) {
  // Rank 2 dies inside the queued calls: the others' Synchronize reports
  // kAborted naming it, and their next call is refused with that error.
  CommOptions o;
  o.asynchronous = true;
  o.timeout = absl::Seconds(30);
  o.slot_bytes = 4096;
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 2) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:30");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(100000, 1.0f), b(100000);
        for (int k = 0; k < 4; ++k) {
          absl::Status s =
              comm.AllReduce(a.data(), b.data(), a.size(), DataType::kFloat32, RedOp::kSum);
          if (!s.ok()) return "queueing failed: " + s.ToString();
        }
        absl::Status s = comm.Synchronize();
        if (comm.rank() == 2) return "rank 2 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 2") == std::string::npos) {
          return "does not name rank 2: " + s.ToString();
        }
        if (comm.AsyncError().code() != absl::StatusCode::kAborted) return "AsyncError lost it";
        absl::Status next = comm.AllReduce(a.data(), b.data(), 1, DataType::kFloat32, RedOp::kSum);
        if (next.code() != absl::StatusCode::kFailedPrecondition ||
            std::string(next.message()).find("rank 2") == std::string::npos) {
          return "the next call: " + next.ToString();
        }
        return "";
      },
      absl::Seconds(60), o, "async-killed",
      [](int r) { return r == 2 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, AMissingRankTimesOutWithADeadline) {
  CommOptions o;
  o.timeout = absl::Milliseconds(500);
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 1) {
          absl::SleepFor(absl::Seconds(2));  // never calls; stays alive
          comm.Abort();
          return "";
        }
        int32_t x = 1, y = 0;
        absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
        if (s.code() != absl::StatusCode::kDeadlineExceeded) return "no deadline: " + s.ToString();
        comm.Abort();
        // Rank 0's Destroy frees the block only once rank 1 can no longer
        // write it: while rank 1 lives and stays joined, Destroy times out
        // and keeps the block.
        absl::Status d = comm.Destroy();
        if (d.code() != absl::StatusCode::kDeadlineExceeded ||
            d.message().find("rank 1") == std::string::npos) {
          return "Destroy while rank 1 is joined: " + d.ToString();
        }
        return "";
      },
      absl::Seconds(60), o, "late");
}

// A CPU engine whose copies out of the pool start late: a reader that has
// seen a post and is slow to copy it (descheduled, or a GPU's DMA queued
// behind others).
class SlowReadEngine final : public CopyEngine {
 public:
  SlowReadEngine(runtime::Coherence& c, absl::Duration delay)
      : cpu_(MakeCpuEngine(c)), delay_(delay) {}
  const char* name() const override { return "slow reader (test)"; }
  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    return cpu_->ToPool(dst, src, n);
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    absl::SleepFor(delay_);
    return cpu_->FromPool(dst, pool_src, n);
  }
  Ticket Copy(void* dst, const void* src, size_t n) override { return cpu_->Copy(dst, src, n); }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    return cpu_->Reduce(t, op, out, srcs, n, count, avg_divisor);
  }
  bool Poll(Ticket t) override { return cpu_->Poll(t); }
  absl::Status Wait(Ticket t, absl::Time deadline) override { return cpu_->Wait(t, deadline); }

 private:
  std::unique_ptr<CopyEngine> cpu_;
  const absl::Duration delay_;
};

// Issue 25, defect 6: the root of a broadcast returns once its post is out,
// aborts and destroys its communicator, and its pool memory goes to the
// next allocation, filled with a pattern, while the reader (rank 0, slow
// to copy) still has the post to read. The reader must get the root's
// bytes or an error, never OK with the pattern (it got OK with 0 of
// 131,072 elements right when the root's Destroy freed its slots at once).
TEST_P(CollectivesTest, AnAbortedRootKeepsItsSlotsUntilTheReaderHasReadThem) {
  constexpr size_t kCount = 131072;
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    if (r != 0) return nullptr;
    return std::make_unique<SlowReadEngine>(c, absl::Milliseconds(500));
  };
  CommOptions o;
  o.slot_bytes = 1 << 20;
  o.timeout = absl::Seconds(20);
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        std::vector<float> buf(kCount);
        if (comm.rank() == 1) {
          for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(i + 1);
          absl::Status s = comm.Broadcast(buf.data(), buf.data(), kCount, DataType::kFloat32, 1);
          if (!s.ok()) return "root's Broadcast: " + s.ToString();
          const std::vector<PoolOffset> slots = comm.slots();
          comm.Abort();
          absl::Status d = comm.Destroy();
          if (!d.ok()) return "root's Destroy after its Abort: " + d.ToString();
          // The next allocations, filled with a pattern: the allocator hands
          // back a freed slot first.
          runtime::Coherence& c = alloc.pool().coherence();
          std::vector<uint8_t> pattern(*o.slot_bytes, 0xEE);
          std::vector<PoolOffset> mine;
          size_t reused = 0;
          for (int k = 0; k < 32 && reused < slots.size(); ++k) {
            auto got = alloc.Allocate(*o.slot_bytes, {.alignment = 4096});
            if (!got.ok()) break;
            mine.push_back(*got);
            c.CopyToPool(*got, pattern.data(), pattern.size());
            reused += std::find(slots.begin(), slots.end(), *got) != slots.end();
          }
          absl::SleepFor(absl::Seconds(1));  // the reader has read by then
          for (PoolOffset m : mine) (void)alloc.Free(m);
          return "";
        }
        absl::Status s = comm.Broadcast(nullptr, buf.data(), kCount, DataType::kFloat32, 1);
        std::string err;
        if (s.ok()) {
          size_t right = 0;
          for (size_t i = 0; i < kCount; ++i) right += buf[i] == static_cast<float>(i + 1);
          if (right != kCount) {
            err = absl::StrCat("the reader's Broadcast returned OK with ", right, " of ", kCount,
                               " elements right");
          }
        }
        (void)comm.Destroy();  // the root aborted: its barrier fails
        return err;
      },
      absl::Seconds(60), o, "reused");
}

// Issue 25, suspected: a call that fails returns only once its engine's
// copies have ended (they write the caller's buffers and this rank's
// slots), and Destroy frees the slots only once the engine is drained. The
// late engine leaves copies pending as a GPU's streams do; after the
// failed call none may remain, and none may write the slots' next owner.
TEST_P(CollectivesTest, AFailedCallAndDestroyDrainTheEngineBeforeTheBuffersAndSlotsGo) {
  LateEngine* mine = nullptr;  // in each rank's process
  engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    auto e = std::make_unique<LateEngine>(c, 77 + r, /*device_like=*/true);
    e->RunOnlyWhenWaited();
    mine = e.get();
    return e;
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.timeout = absl::Seconds(20);
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        // Different counts: the first post each rank checks is a mismatch,
        // with the chunks after it posted ahead and still copying.
        const size_t count = comm.rank() == 0 ? 100000 : 100016;
        std::vector<float> x(count, 1.0f), y(count);
        absl::Status s = comm.AllReduce(x.data(), y.data(), count, DataType::kFloat32, RedOp::kSum);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
        std::string err;
        if (mine->pending() != 0) {
          err = absl::StrCat(mine->pending(),
                             " copies of the failed call were still pending when it returned; ");
        }
        const std::vector<PoolOffset> slots = comm.slots();
        absl::Status d = comm.Destroy();
        if (!d.ok()) return err + "Destroy: " + d.ToString();
        if (mine->pending() != 0) {
          absl::StrAppend(&err, mine->pending(),
                          " copies were still pending when Destroy freed the slots; ");
        }
        // The slots' next owner fills them; then whatever the engine still
        // had runs (a GPU's copies land whenever they land).
        runtime::Coherence& c = alloc.pool().coherence();
        std::vector<uint8_t> pattern(*o.slot_bytes, 0xEE), got(*o.slot_bytes);
        std::vector<PoolOffset> next;
        for (size_t k = 0; k < 2 * slots.size(); ++k) {
          auto b = alloc.Allocate(*o.slot_bytes, {.alignment = 4096});
          if (!b.ok()) return b.status().ToString();
          next.push_back(*b);
          c.CopyToPool(*b, pattern.data(), pattern.size());
        }
        (void)mine->Drain(absl::InfiniteFuture());
        for (PoolOffset b : next) {
          c.Fetch(got.data(), b, got.size());
          if (got != pattern) {
            absl::StrAppend(&err, "a copy of the failed call wrote the block at 0x", absl::Hex(b),
                            " after Destroy freed it; ");
          }
          (void)alloc.Free(b);
        }
        return err;
      },
      absl::Seconds(60), o, "drained");
}

// Issue 25, defect 5: a job whose rank 0 was killed leaves its block with
// a dead maker, and its rank 1 alive. A new job's rank 0 must not re-make
// the block while that rank lives (its next call writes its post and
// abort lines into the block), and names it; once it has aborted, the
// block is taken.
TEST_P(CollectivesTest, AStaleBlockIsNotRemadeWhileARankOfTheOldJobLives) {
  struct Shared {
    int a1_joined, go, a1_done, b_tried;
    char a1_status[256], b0_status[512];
  };
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::memset(sh, 0, sizeof(Shared));
  auto await = [](const int* flag, int want) {
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= want;
  };
  CommOptions old_job;
  old_job.timeout = absl::Seconds(20);
  const pid_t a0 = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "stale", 2, 0, old_job);
    if (!comm.ok() || !await(&sh->a1_joined, 1)) return 3;
    raise(SIGKILL);  // dies without leaving
    return 4;
  });
  const pid_t a1 = Spawn([&]() -> int {
    // A long lease: a heartbeat starved on a loaded machine must not make
    // this live rank look dead to the new job.
    auto h = OpenRankHost(uri_, absl::Seconds(4));
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "stale", 2, 1, old_job);
    if (!comm.ok()) return 3;
    __atomic_store_n(&sh->a1_joined, 1, __ATOMIC_RELEASE);
    if (!await(&sh->go, 1)) return 4;  // idle meanwhile: joined, alive
    int64_t x = 1, y = 0;
    absl::Status s = (*comm)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
    std::snprintf(sh->a1_status, sizeof(sh->a1_status), "%s", s.ToString().c_str());
    (*comm)->Abort();
    (void)(*comm)->Destroy();
    __atomic_store_n(&sh->a1_done, 1, __ATOMIC_RELEASE);
    return s.code() == absl::StatusCode::kAborted ? 0 : 5;
  });
  EXPECT_EQ(WaitExit(a0, absl::Seconds(60)), 128 + SIGKILL);
  CommOptions new_job;
  new_job.timeout = absl::Seconds(5);  // past rank 0's lease: its block is stale by then
  std::vector<pid_t> b;
  for (int r = 0; r < 2; ++r) {
    b.push_back(Spawn([&, r]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      auto comm = Communicator::Create(*h->alloc, "stale", 2, r, new_job);
      if (r == 0) {
        std::snprintf(sh->b0_status, sizeof(sh->b0_status), "%s", comm.status().ToString().c_str());
      }
      __atomic_add_fetch(&sh->b_tried, 1, __ATOMIC_ACQ_REL);
      if (!comm.ok()) return 10;
      // The old rank's call comes while this instance lives.
      if (!await(&sh->a1_done, 1)) return 11;
      int64_t x = 10 + r, y = 0;
      absl::Status s = (*comm)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
      return s.ok() && y == 21 ? 0 : 12;
    }));
  }
  EXPECT_TRUE(await(&sh->b_tried, 2));
  __atomic_store_n(&sh->go, 1, __ATOMIC_RELEASE);
  const int b0 = WaitExit(b[0], absl::Seconds(60));
  EXPECT_EQ(WaitExit(b[1], absl::Seconds(60)), 10);
  EXPECT_EQ(b0, 10) << "the new job's rank 0 re-made the block while rank 1 of the old job was "
                       "alive (exit "
                    << b0
                    << "; 12: the old rank's call then broke the new instance): " << sh->b0_status;
  const std::string said = sh->b0_status;
  EXPECT_NE(said.find("ALREADY_EXISTS"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1"), std::string::npos) << said;
  EXPECT_NE(said.find(absl::StrCat("pid ", a1)), std::string::npos) << said;
  EXPECT_EQ(WaitExit(a1, absl::Seconds(60)), 0) << sh->a1_status;
  munmap(sh, 4096);
  // The old rank aborted and left: a new job takes the block.
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        int64_t x = 10 + comm.rank(), y = 0;
        absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
        if (!s.ok()) return s.ToString();
        return y == 21 ? "" : absl::StrCat("AllReduce gave ", y);
      },
      absl::Seconds(60), {}, "stale");
}

// Issue 13, defects 2-4: communicators of one name created, used,
// destroyed and re-created in a loop, ranks on one core and on two. Each
// all-reduce result is checked (a rank that joined the previous instance
// got 1002 instead of 2002), and after each Destroy rank 0 fills a canary
// block the size of the freed one, which the allocator hands it at the same
// place: a rank still writing the old instance changes it (72 bytes of it,
// before Destroy waited for every rank).

TEST_P(CollectivesTest, ReCreatedCommunicatorsNeverMixInstancesOrWriteFreedBlocks) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    return CycleCommunicators(comm, alloc, /*one_core=*/false);
  });
}

TEST_P(CollectivesTest, ReCreatedCommunicatorsOnOneCoreNeverMixInstances) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    return CycleCommunicators(comm, alloc, /*one_core=*/true);
  });
}

// The lifecycle stress with killed ranks: six generations of ranks (fresh
// processes, so fresh hosts) create, use and destroy one name; in four a
// rank dies at a round post (rank 0 too, leaving its block to the next
// generation's rank 0 to replace). Every result before the death is
// checked, every survivor must see kAborted naming the dead rank, and each
// freed block gets a canary (a durable named block in its place) that is
// checked after every later generation: no rank of any generation writes
// outside its own block. The checks run in a child too: a parent with host
// threads must not fork (a child can inherit a lock a thread held, as
// ASan's allocator showed).
TEST_P(CollectivesTest, ReCreatedCommunicatorsSurviveKilledRanksAndWriteNoFreedBlock) {
  struct Shared {
    uint64_t block_offset, block_size;  // this generation's, from its rank 0
    int canaries;                       // canary/0 .. canary/N-1
    char error[512];
  };
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  sh->canaries = 0;
  auto seed = [](int k) { return static_cast<uint8_t>(0x5A + k); };
  // In a child: checks every canary; then, when `add` and the generation's
  // block was freed, puts a canary in its place; when `remove`, frees them.
  auto check = [&](int gen, bool add, bool remove) -> int {
    return WaitExit(Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      runtime::Coherence& c = h->pool->coherence();
      for (int k = 0; k < sh->canaries; ++k) {
        auto b = h->alloc->Find(absl::StrCat("canary/", k));
        if (!b.ok()) return 3;
        std::vector<uint8_t> got(b->size);
        c.Fetch(got.data(), b->offset, b->size);
        for (uint64_t i = 0; i < b->size; ++i) {
          if (got[i] != static_cast<uint8_t>(seed(k) ^ i)) {
            std::snprintf(sh->error, sizeof(sh->error),
                          "a rank of generation %d wrote byte %llu of freed block 0x%llx", gen,
                          static_cast<unsigned long long>(i),
                          static_cast<unsigned long long>(b->offset));
            return 4;
          }
        }
        if (remove && !h->alloc->FreeNamed(absl::StrCat("canary/", k)).ok()) return 5;
      }
      if (add && sh->block_size != 0 && absl::IsNotFound(h->alloc->Find("comm/life").status())) {
        const int k = sh->canaries;
        auto got = h->alloc->AllocateNamed(absl::StrCat("canary/", k), sh->block_size,
                                           {.alignment = 2 << 20});
        if (!got.ok()) return 6;
        std::vector<uint8_t> fill(sh->block_size);
        for (uint64_t i = 0; i < fill.size(); ++i) fill[i] = static_cast<uint8_t>(seed(k) ^ i);
        c.CopyToPool(*got, fill.data(), fill.size());
        ++sh->canaries;
      }
      return 0;
    }));
  };
  const int kVictims[] = {-1, 1, 0, 2, -1, 0};
  CommOptions o;
  o.timeout = absl::Seconds(30);
  for (int gen = 0; gen < 6; ++gen) {
    SCOPED_TRACE(absl::StrCat("generation ", gen));
    const int victim = kVictims[gen];
    const int die_at = 2 + gen % 3;  // the victim's post that kills it
    sh->block_offset = sh->block_size = 0;
    RunRanks(
        3,
        [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
          const int r = comm.rank();
          if (r == 0) {
            auto b = alloc.Find("comm/life");
            if (!b.ok()) return b.status().ToString();
            sh->block_offset = b->offset;
            sh->block_size = b->size;
          }
          if (r == victim) {
            absl::Status armed =
                runtime::ArmFaults(absl::StrCat("coll.round.posted:crash:", die_at));
            if (!armed.ok()) return armed.ToString();
          }
          for (int call = 0; call < 6; ++call) {
            const int64_t base = 1000 * (gen + 1) + 10 * call, x = base + r;
            int64_t y = 0;
            absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
            if (s.ok()) {
              if (y != 3 * base + 3) {
                return absl::StrCat("call ", call, " gave ", y, ", want ", 3 * base + 3);
              }
              continue;
            }
            if (victim < 0) return absl::StrCat("call ", call, ": ", s.ToString());
            if (s.code() != absl::StatusCode::kAborted ||
                s.message().find(absl::StrCat("rank ", victim)) == std::string::npos) {
              return absl::StrCat("call ", call, " after rank ", victim,
                                  " died: not kAborted naming it: ", s.ToString());
            }
            comm.Abort();
            break;
          }
          if (r == victim) return "survived its crash point";
          return "";
        },
        absl::Seconds(90), o, "life",
        [&](int r) { return r == victim ? runtime::kFaultExitCode : 0; });
    if (HasFailure()) break;
    // A freed block gets a canary in its place; a block left by a dead rank
    // 0 stays for the next generation to replace.
    ASSERT_EQ(check(gen, /*add=*/true, /*remove=*/false), 0) << sh->error;
  }
  EXPECT_GE(sh->canaries, 3) << "Destroy freed too few blocks to check";
  EXPECT_EQ(check(6, /*add=*/false, /*remove=*/true), 0) << sh->error;
  munmap(sh, 4096);
}

// Issue 13, defect 8: a header whose p2p_bytes is 0 (Send/Recv divided by
// it) or absurd (the plan's product overflowed) is refused at join.
TEST_P(CollectivesTest, AJoinerRefusesAHeaderWithBadBufferSizes) {
  for (uint64_t bad : {uint64_t{0}, uint64_t{1} << 62, uint64_t{100}}) {
    CommOptions o;
    o.timeout = absl::Seconds(3);
    pid_t maker = Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      auto comm = Communicator::Create(*h->alloc, "badhdr", 2, 0, o);
      return comm.ok() ? 3 : 0;  // rank 1 never joins: a deadline
    });
    pid_t joiner = Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      runtime::Coherence& c = h->pool->coherence();
      // Wait for rank 0's header, then damage it as a hostile pool would
      // (a valid checksum over the bad size).
      auto made = AwaitHeader(*h, "comm/badhdr", absl::Seconds(3));
      if (!made) return 4;
      auto& [b, hdr] = *made;
      hdr.p2p_bytes = bad;
      hdr.checksum = runtime::Crc32c(&hdr, offsetof(CommHeaderLayout, checksum));
      c.PublishObject(b.offset, hdr);
      auto comm = Communicator::Create(*h->alloc, "badhdr", 2, 1, o);
      if (comm.ok()) return 5;
      if (comm.status().code() != absl::StatusCode::kDataLoss ||
          comm.status().message().find("p2p_bytes") == std::string::npos) {
        std::fprintf(stderr, "joiner got %s\n", comm.status().ToString().c_str());
        return 6;
      }
      return 0;
    });
    EXPECT_EQ(WaitExit(joiner, absl::Seconds(30)), 0) << "p2p_bytes " << bad;
    EXPECT_EQ(WaitExit(maker, absl::Seconds(30)), 0);
  }
}

TEST(RankFromEnvironmentTest, ReadsEveryLauncherAndRejectsNonsense) {
  const char* const kVars[] = {
      "CXLRT_RANK", "CXLRT_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "PMI_RANK",   "PMI_SIZE",         "SLURM_PROCID",         "SLURM_NTASKS",
      "RANK",       "WORLD_SIZE"};
  for (const char* v : kVars) unsetenv(v);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kNotFound);
  const struct {
    const char *rank, *size, *source;
  } kCases[] = {{"RANK", "WORLD_SIZE", "torchrun"},
                {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
                {"PMI_RANK", "PMI_SIZE", "mpirun (PMI)"},
                {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"},
                {"CXLRT_RANK", "CXLRT_WORLD_SIZE", "cxlrt run"}};
  // Each launcher is found; an earlier row of the table wins over later ones.
  for (const auto& c : kCases) {
    setenv(c.rank, "3", 1);
    setenv(c.size, "4", 1);
    auto info = RankFromEnvironment();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->rank, 3);
    EXPECT_EQ(info->nranks, 4);
    EXPECT_EQ(info->source, c.source);
  }
  setenv("CXLRT_RANK", "4", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  setenv("CXLRT_RANK", "two", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv("CXLRT_WORLD_SIZE");
  setenv("CXLRT_RANK", "1", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* v : kVars) unsetenv(v);
}

INSTANTIATE_TEST_SUITE_P(Domains, CollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

// A rank whose pool-resident send buffer is posted in place gives up at
// its deadline while a peer, stalled before its own post, has yet to read
// it; the caller then writes the buffer again (it is the caller's once the
// call returned). The peer, resuming, must not return OK with those bytes.
TEST_P(CollectivesTest, APeerDoesNotReadAnInPlaceBufferItsRankGaveUpOn) {
  CommOptions o;
  o.timeout = absl::Milliseconds(1500);  // the joins too: time to fork and join
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        const int r = comm.rank();
        const size_t k = 4096;
        std::vector<float> mine(2 * k), recv(2 * k, -1.0f);
        for (size_t i = 0; i < 2 * k; ++i) mine[i] = float(r * 100000 + i);
        const std::vector<size_t> cnt = {k, k}, dis = {0, k};
        if (r == 1) {
          // Its data post (the second post line it writes) waits 3 s
          // before its flag.
          absl::Status armed = runtime::ArmFaults("coll.round.posted:stall=3000:2");
          if (!armed.ok()) return armed.ToString();
          absl::Status s =
              comm.AllToAllV(mine.data(), cnt, dis, recv.data(), cnt, dis, DataType::kFloat32);
          if (!s.ok()) return "";  // an error: what it should be
          for (size_t i = 0; i < k; ++i) {
            if (recv[i] != float(r * k + i)) {
              return absl::StrCat("OK, but element ", i, " from rank 0 is ", recv[i], ", not ",
                                  float(r * k + i), " (rank 0 had given up and rewritten it)");
            }
          }
          return "";
        }
        auto p = comm.Allocate(mine.size() * sizeof(float));
        if (!p.ok()) return p.status().ToString();
        runtime::Coherence& c = alloc.pool().coherence();
        const auto at = static_cast<runtime::PoolOffset>(static_cast<uint8_t*>(*p) -
                                                         alloc.pool().backend().base());
        c.Invalidate(at, mine.size() * sizeof(float));
        c.Write(at, mine.data(), mine.size() * sizeof(float));
        absl::Status s = comm.AllToAllV(*p, cnt, dis, recv.data(), cnt, dis, DataType::kFloat32);
        if (s.ok()) return "rank 0 did not time out: " + s.ToString();
        // The caller's again: rewritten and published.
        const std::vector<float> junk(mine.size(), 7.0f);
        c.Publish(at, junk.data(), junk.size() * sizeof(float));
        absl::SleepFor(absl::Milliseconds(3500));  // rank 1 reads meanwhile
        return "";
      },
      absl::Seconds(60), o, "v-giveup");
}

}  // namespace
}  // namespace cxlrt::collectives
