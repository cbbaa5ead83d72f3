// `cxlrt run`, the local multi-host launcher: what every rank is told, how
// a failure or Ctrl-C stops the job, and what the exit code says.
#include "cxlrt/emulation/launcher.h"

#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/cli_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::emulation {
namespace {

using ::cxlrt::testing::Cxlrt;
using ::cxlrt::testing::CxlrtStdout;
using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Quote;
using ::cxlrt::testing::TempDir;

TEST(PlaceRankTest, RanksGoToHostsInBlocks) {
  // 5 ranks over 2 hosts: ranks 0-2 on host 0, 3-4 on host 1.
  std::vector<RankPlacement> got;
  for (int r = 0; r < 5; ++r) got.push_back(PlaceRank(r, 5, 2));
  EXPECT_EQ(got[0].host, 0);
  EXPECT_EQ(got[2].host, 0);
  EXPECT_EQ(got[3].host, 1);
  EXPECT_EQ(got[2].local_rank, 2);
  EXPECT_EQ(got[2].local_world_size, 3);
  EXPECT_EQ(got[4].local_rank, 1);
  EXPECT_EQ(got[4].local_world_size, 2);
  for (int n = 1; n <= 9; ++n) {
    for (int h = 1; h <= n; ++h) {
      std::map<int, int> per_host;
      for (int r = 0; r < n; ++r) {
        RankPlacement p = PlaceRank(r, n, h);
        ASSERT_GE(p.host, 0);
        ASSERT_LT(p.host, h);
        ASSERT_LT(p.local_rank, p.local_world_size);
        ++per_host[p.host];
      }
      ASSERT_EQ(static_cast<int>(per_host.size()), h) << "a host got no rank: n=" << n;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(PlaceRank(r, n, h).local_world_size, per_host[PlaceRank(r, n, h).host]);
      }
    }
  }
}

// "[r] text" lines of `out`, by rank.
std::map<int, std::vector<std::string>> LinesByRank(const std::string& out) {
  std::map<int, std::vector<std::string>> by_rank;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.size() < 4 || line[0] != '[') continue;
    size_t close = line.find("] ");
    int r = 0;
    if (close == absl::string_view::npos || !absl::SimpleAtoi(line.substr(1, close - 1), &r)) {
      continue;
    }
    by_rank[r].push_back(std::string(line.substr(close + 2)));
  }
  return by_rank;
}

TEST(LauncherTest, EveryRankIsToldWhoAndWhereItIs) {
  TempDir dir;
  const std::string create = PoolUri(dir, "hosts=16", "16M");
  auto r = CxlrtStdout("run -n 5 --hosts 2 --pool " + Quote(create) +
                       " -- sh -c 'echo $CXLRT_RANK $CXLRT_WORLD_SIZE $CXLRT_HOST_ID "
                       "$CXLRT_SLOTS_PER_HOST $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE "
                       "$CXLRT_POOL'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = LinesByRank(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  for (int rank = 0; rank < 5; ++rank) {
    ASSERT_EQ(lines[rank].size(), 1u) << r.out;
    RankPlacement p = PlaceRank(rank, 5, 2);
    std::string want = absl::StrCat(rank, " 5 ", p.host, " 8 ", rank, " 5 ", p.local_rank, " ",
                                    p.local_world_size, " ", OpenUri(create));
    EXPECT_EQ(lines[rank][0], want);
  }
  // The launcher made the pool, so it removed it too.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the job's pool was left behind";
}

TEST(LauncherTest, RanksAttachToThePoolAsHostsAndSeeEachOther) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "16M");
  auto r = Cxlrt("run -n 2 --pool " + Quote(create) + " -- " + CXLRT_BIN +
                 " pool attach --seconds 1.5 --interval-ms 200");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = LinesByRank(r.out);
  for (int rank = 0; rank < 2; ++rank) {
    bool saw_other = false;
    for (const std::string& l : lines[rank]) saw_other |= l.find("alive") != std::string::npos;
    EXPECT_TRUE(saw_other) << "rank " << rank << " never saw the other host:\n" << r.out;
  }
  // Host ids keep each rank in its own slot range: rank 1 is host 1.
  EXPECT_NE(r.out.find("[1] [slot 32] attached"), std::string::npos) << r.out;
}

TEST(LauncherTest, AFailedRankStopsTheOthersAndItsCodeIsTheJobsCode) {
  TempDir dir;
  const absl::Time start = absl::Now();
  auto r = Cxlrt("run -n 4 --pool " + Quote(PoolUri(dir)) +
                 " -- sh -c 'if [ $RANK = 2 ]; then sleep 0.2; exit 5; fi; sleep 60'");
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the others were not stopped";
  EXPECT_NE(r.out.find("rank 2 (host 2, pid"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with code 5 first; stopped 3 other ranks"), std::string::npos)
      << r.out;
}

TEST(LauncherTest, ARankKilledByASignalIsNamedWithIt) {
  TempDir dir;
  auto r = Cxlrt("run -n 2 --pool " + Quote(PoolUri(dir)) +
                 " -- sh -c 'if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  EXPECT_NE(r.out.find("rank 1 (host 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("signal 9"), std::string::npos) << r.out;
}

TEST(LauncherTest, ACommandThatCannotRunIs127) {
  TempDir dir;
  auto r = Cxlrt("run -n 2 --pool " + Quote(PoolUri(dir)) + " -- /nonexistent/program");
  EXPECT_EQ(r.code, 127) << r.out;
  EXPECT_NE(r.out.find("cannot run '/nonexistent/program'"), std::string::npos) << r.out;
}

TEST(LauncherTest, OutputLinesArePrefixedAndKeptWhole) {
  TempDir dir;
  auto r = Cxlrt("run -n 2 --pool " + Quote(PoolUri(dir)) +
                 " -- sh -c 'i=0; while [ $i -lt 200 ]; do echo line-$RANK-$i; i=$((i+1)); "
                 "done; printf no-newline-$RANK'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = LinesByRank(r.out);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(lines[rank].size(), 201u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(lines[rank][i], absl::StrCat("line-", rank, "-", i));
    EXPECT_EQ(lines[rank][200], absl::StrCat("no-newline-", rank));
  }
}

TEST(LauncherTest, CtrlCStopsEveryRank) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  pid_t launcher = fork();
  if (launcher == 0) {
    execl(CXLRT_BIN, CXLRT_BIN, "run", "-n", "3", "--pool", PoolUri(dir).c_str(), "--", "sh", "-c",
          ("echo $$ >> " + pids + "; sleep 60").c_str(), nullptr);
    _exit(99);
  }
  // Wait for the three ranks to start.
  for (int i = 0; i < 500; ++i) {
    std::ifstream f(pids);
    std::string all((std::istreambuf_iterator<char>(f)), {});
    if (std::count(all.begin(), all.end(), '\n') == 3) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(launcher, SIGINT);
  EXPECT_EQ(::cxlrt::testing::WaitExit(launcher, absl::Seconds(20)), 130);
  std::ifstream f(pids);
  int pid, seen = 0;
  while (f >> pid) {
    ++seen;
    EXPECT_NE(kill(pid, 0), 0) << "rank pid " << pid << " still runs after Ctrl-C";
  }
  EXPECT_EQ(seen, 3);
}

TEST(LauncherTest, AJobPastItsTimeoutIsStopped) {
  TempDir dir;
  auto r = Cxlrt("run -n 2 --timeout 0.5 --pool " + Quote(PoolUri(dir)) + " -- sleep 60");
  EXPECT_EQ(r.code, 124) << r.out;
  EXPECT_NE(r.out.find("timeout"), std::string::npos) << r.out;
}

TEST(LauncherTest, AnExistingPoolIsUsedAndKept) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "16M");
  ASSERT_EQ(Cxlrt("pool create " + Quote(create)).code, 0);
  auto r = Cxlrt("run -n 2 --pool " + Quote(OpenUri(create)) + " -- true");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Cxlrt("pool check " + Quote(OpenUri(create))).code, 0) << "the pool was removed";
}

TEST(LauncherTest, BadRequestsAreClearErrors) {
  TempDir dir;
  auto r = Cxlrt("run -n 2 --hosts 3 -- true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hosts 3 must be in [1, 2]"), std::string::npos) << r.out;
  r = Cxlrt("run -n 2 -- ");
  EXPECT_EQ(r.code, 2) << r.out;
  r = Cxlrt("run -n 20 --hosts 1 --pool " + Quote(PoolUri(dir, "hosts=8")) + " -- true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("too few for 20 ranks"), std::string::npos) << r.out;
  r = Cxlrt("run -n 2 --pool " + Quote(OpenUri(PoolUri(dir))) + " -- true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no pool"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cxlrt::emulation
