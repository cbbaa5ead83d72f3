// Fault points: a crash kills the process at that step, a stall stalls, a
// corruption damages the line just written; and what each leaves behind is
// what the survivors can handle.
#include "cxlrt/runtime/fault.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::WaitExit;

AttachOptions Fast(std::optional<uint32_t> slot = std::nullopt) {
  AttachOptions o;
  o.slot = slot;
  o.lease = absl::Milliseconds(400);
  o.heartbeat = absl::Milliseconds(20);
  return o;
}

TEST(FaultSpecTest, ParsesEveryAction) {
  auto rules = ParseFaultSpec(
      "bakery.locked:crash,membership.heartbeat:stall=250:3,"
      "coherence.publish:corrupt:2,alloc.tick.begin:stop:4");
  CXLRT_ASSERT_OK(rules);
  ASSERT_EQ(rules->size(), 4u);
  EXPECT_EQ((*rules)[0].action, FaultAction::kCrash);
  EXPECT_EQ((*rules)[0].count, 1u);
  EXPECT_EQ((*rules)[1].action, FaultAction::kStall);
  EXPECT_EQ((*rules)[1].stall_ms, 250u);
  EXPECT_EQ((*rules)[1].count, 3u);
  EXPECT_EQ((*rules)[2].action, FaultAction::kCorrupt);
  EXPECT_EQ((*rules)[3].action, FaultAction::kStop);
  EXPECT_EQ((*rules)[3].count, 4u);
  CXLRT_EXPECT_OK(ParseFaultSpec(""));
}

// `stop` stops the process at the point's count-th hit, and it runs on
// from there after SIGCONT.
TEST(FaultStopTest, StopsTheProcessUntilContinued) {
  pid_t pid = Spawn([] {
    if (!ArmFaults("coll.post.begin:stop:2").ok()) return 10;
    CXLRT_FAULT_POINT("coll.post.begin");  // first hit: runs on
    CXLRT_FAULT_POINT("coll.post.begin");  // second: stops here
    return 0;
  });
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the child did not stop (status " << status << ")";
  EXPECT_EQ(WSTOPSIG(status), SIGSTOP);
  kill(pid, SIGCONT);
  EXPECT_EQ(WaitExit(pid), 0);
}

TEST(FaultSpecTest, BadSpecsNameTheBadPart) {
  CXLRT_EXPECT_ERROR(ParseFaultSpec("nowhere:crash"), absl::StatusCode::kInvalidArgument,
                     "unknown fault point 'nowhere'");
  CXLRT_EXPECT_ERROR(ParseFaultSpec("bakery.locked:explode"), absl::StatusCode::kInvalidArgument,
                     "fault action 'explode'");
  CXLRT_EXPECT_ERROR(ParseFaultSpec("bakery.locked:stall=x"), absl::StatusCode::kInvalidArgument,
                     "stall=MS");
  CXLRT_EXPECT_ERROR(ParseFaultSpec("bakery.locked:crash:0"), absl::StatusCode::kInvalidArgument,
                     "fault count '0'");
  CXLRT_EXPECT_ERROR(ParseFaultSpec("bakery.locked"), absl::StatusCode::kInvalidArgument,
                     "point:action");
}

TEST(FaultSpecTest, DocsListEveryPoint) {
  std::ifstream in(CXLRT_SOURCE_DIR "/docs/faults.md");
  ASSERT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  size_t rows = 0;
  for (const FaultPointInfo& p : FaultPoints()) {
    EXPECT_NE(doc.find(absl::StrCat("| `", p.name, "` | ", p.where, " |")), std::string::npos)
        << "docs/faults.md lacks or differs on " << p.name;
  }
  for (size_t at = doc.find("\n| `"); at != std::string::npos; at = doc.find("\n| `", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, FaultPoints().size()) << "docs/faults.md lists points the code does not have";
}

class FaultTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(FaultTest, ACrashBeforeTheMagicLeavesAnUnfinishedPool) {
  const std::string uri = PoolUri(dir_);
  pid_t child = Spawn([&] {
    if (!ArmFaults("pool.create.before_magic:crash").ok()) return 1;
    (void)Pool::Create(uri);
    return 2;  // not reached
  });
  EXPECT_EQ(WaitExit(child), kFaultExitCode);
  CXLRT_EXPECT_ERROR(Pool::Open(OpenUri(uri)), absl::StatusCode::kDataLoss,
                     "creation did not finish");
  CXLRT_EXPECT_OK(Pool::Destroy(OpenUri(uri)));
}

TEST_F(FaultTest, ACorruptedHeaderIsCaughtAtOpen) {
  const std::string uri = PoolUri(dir_);
  pid_t child = Spawn([&] {
    if (!ArmFaults("pool.create.before_magic:corrupt").ok()) return 1;
    return Pool::Create(uri).ok() ? 0 : 2;
  });
  EXPECT_EQ(WaitExit(child), 0);
  CXLRT_EXPECT_ERROR(Pool::Open(OpenUri(uri)), absl::StatusCode::kDataLoss, "header checksum");
}

TEST_F(FaultTest, PublishCorruptionHitsTheCountedWrite) {
  auto pool = Pool::Create(PoolUri(dir_));
  CXLRT_ASSERT_OK(pool);
  Coherence& c = (*pool)->coherence();
  const PoolOffset at = (*pool)->header().heap_offset;
  CXLRT_ASSERT_OK(ArmFaults("coherence.publish:corrupt:2"));
  const uint64_t v = 0x1122334455667788;
  c.PublishObject(at, v);
  c.PublishObject(at + 64, v);
  c.PublishObject(at + 128, v);
  CXLRT_ASSERT_OK(ArmFaults(""));
  EXPECT_EQ(c.FetchObject<uint64_t>(at), v);
  EXPECT_EQ(c.FetchObject<uint64_t>(at + 64), v ^ (0xFFull << 56))
      << "the second publish was not damaged";
  EXPECT_EQ(c.FetchObject<uint64_t>(at + 128), v);
}

TEST_F(FaultTest, AStallPointStalls) {
  auto pool = Pool::Create(PoolUri(dir_));
  CXLRT_ASSERT_OK(pool);
  auto m = Membership::Attach(**pool, Fast());
  CXLRT_ASSERT_OK(m);
  CXLRT_ASSERT_OK(ArmFaults("bakery.locked:stall=300"));
  const absl::Time start = absl::Now();
  CXLRT_EXPECT_OK((*m)->WithPoolLock([] { return absl::OkStatus(); }));
  const absl::Duration took = absl::Now() - start;
  CXLRT_ASSERT_OK(ArmFaults(""));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
}

// A host that dies between writing its control line and its owner line is
// attached with a stale record: survivors see it dead, fence it, release it,
// and the pool checks clean.
TEST_F(FaultTest, AHostCrashedMidAttachIsFencedAndItsSlotReused) {
  const std::string uri = OpenUri([&] {
    std::string u = PoolUri(dir_);
    EXPECT_TRUE(Pool::Create(u).ok());
    return u;
  }());
  pid_t child = Spawn([&] {
    if (!ArmFaults("membership.claim.after_control:crash").ok()) return 1;
    auto pool = Pool::Open(uri);
    if (!pool.ok()) return 2;
    (void)Membership::Attach(**pool, Fast(0));
    return 3;
  });
  ASSERT_EQ(WaitExit(child), kFaultExitCode);
  auto pool = Pool::Open(uri);
  CXLRT_ASSERT_OK(pool);
  auto r = (*pool)->ReadHost(0);
  CXLRT_ASSERT_OK(r);
  EXPECT_EQ(r->state, SlotState::kAttached);
  EXPECT_FALSE(r->owner_current) << "the owner line was never stamped with the new epoch";
  CXLRT_EXPECT_OK((*pool)->Check());
  auto m = Membership::Attach(**pool, Fast());
  CXLRT_ASSERT_OK(m);
  EXPECT_NE((*m)->slot(), 0u);
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while ((*m)->Host(0)->liveness != Liveness::kDead && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CXLRT_ASSERT_OK((*m)->Fence(0));
  CXLRT_ASSERT_OK((*m)->Release(0));
  CXLRT_EXPECT_OK((*pool)->Check());
}

// A heartbeat stalled past the lease makes the host look dead; it then
// learns that it was fenced.
TEST_F(FaultTest, AHeartbeatStallPastTheLeaseGetsTheHostFenced) {
  const std::string uri = OpenUri([&] {
    std::string u = PoolUri(dir_);
    EXPECT_TRUE(Pool::Create(u).ok());
    return u;
  }());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = Spawn([&] {
    auto pool = Pool::Open(uri);
    if (!pool.ok()) return 2;
    auto m = Membership::Attach(**pool, Fast(0));
    if (!m.ok()) return 3;
    if (!ArmFaults("membership.heartbeat:stall=1500:3").ok()) return 4;
    char c = 1;
    if (write(ready[1], &c, 1) != 1) return 5;
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (!(*m)->fenced() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
    return (*m)->fenced() ? 0 : 6;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  auto pool = Pool::Open(uri);
  CXLRT_ASSERT_OK(pool);
  auto m = Membership::Attach(**pool, Fast());
  CXLRT_ASSERT_OK(m);
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while ((*m)->Host(0)->liveness != Liveness::kDead && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CXLRT_ASSERT_OK((*m)->Fence(0));
  EXPECT_EQ(WaitExit(child), 0) << "6: the stalled host never learned it was fenced";
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace cxlrt::runtime
