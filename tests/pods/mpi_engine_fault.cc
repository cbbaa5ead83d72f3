// The failure paths of the MPI engine between pods (cxlrt/pods/mpi_engine.h),
// one mode per run under mpirun (tests/pods/run_fault.sh checks the
// results):
//   deadline: the last rank never joins a Split, an AllReduce, or sends what
//             the others Recv; every other rank's call returns
//             kDeadlineExceeded within its deadline plus a margin.
//   kill:     every rank loops over AllReduce; rank 1 SIGKILLs itself at
//             iteration 20; every other rank returns an error (the
//             deadline, or MPI's error as kAborted) within its deadline
//             plus a margin, never hangs.
//   notice:   rank 0 aborts its world engine while ranks 1 and 2 wait on
//             a Recv from it over a rail split from that world, with a
//             30 s deadline: each gets kAborted naming rank 0's reason
//             within the margin (the engine's abort notice); then all three
//             pass a Barrier on a second world engine, which heard nothing.
// Each rank writes one line, "PASS ..." or "FAIL ...", to
// $CXLRT_FAULT_OUT/rank.N, waits until the other reporting ranks have
// written theirs, and exits without MPI_Finalize (it would wait for the dead
// or absent rank).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/pods/mpi_engine.h"

namespace {

using cxlrt::collectives::DataType;
using cxlrt::collectives::RedOp;
using cxlrt::pods::InterPodEngine;
using cxlrt::pods::MpiEngine;

const absl::Duration kDeadline = absl::Milliseconds(1500);
const absl::Duration kMargin = absl::Seconds(2);

void Report(int rank, bool pass, const std::string& what) {
  const char* dir = std::getenv("CXLRT_FAULT_OUT");
  const std::string line = absl::StrCat(pass ? "PASS " : "FAIL ", what, "\n");
  std::fprintf(stderr, "rank %d: %s", rank, line.c_str());
  if (dir) std::ofstream(absl::StrCat(dir, "/rank.", rank)) << line;
}

// mpirun ends the whole job once a rank exits without MPI_Finalize (as
// these do, below), killing any rank still writing its report: so each
// waits, 10 s at most, until every rank of `reporters` has reported.
void AwaitReports(const std::vector<int>& reporters) {
  const char* dir = std::getenv("CXLRT_FAULT_OUT");
  if (dir == nullptr) return;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  for (int r : reporters) {
    const std::string path = absl::StrCat(dir, "/rank.", r);
    while (access(path.c_str(), F_OK) != 0 && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

// Checks that `s` is an error of one of `codes`, seen within the deadline
// plus the margin of `start`; appends what happened to `log`.
bool Expect(const absl::Status& s, absl::Time start, std::vector<absl::StatusCode> codes,
            const char* call, std::string* log) {
  const absl::Duration took = absl::Now() - start;
  bool code_ok = false;
  for (absl::StatusCode c : codes) code_ok |= s.code() == c;
  const bool in_time = took <= kDeadline + kMargin;
  absl::StrAppend(log, call, " -> ", s.ToString(), " after ", absl::FormatDuration(took), "; ");
  return code_ok && in_time;
}

// `w` and `other` are two engines over the same ranks: the first call that
// passes its deadline leaves its engine unusable.
int Deadline(InterPodEngine& w, InterPodEngine& other) {
  const int absent = w.size() - 1;
  if (w.rank() == absent) {
    // Alive, but never joins: sleeps past every deadline of the others.
    absl::SleepFor(3 * kDeadline + kMargin);
    Report(w.rank(), true, "the absent member slept through");
    return 0;
  }
  std::string log;
  bool ok = true;
  {
    // A Recv from the absent member names it.
    char buf[64];
    auto r = other.Recv(buf, sizeof buf, absent, 4);
    const absl::Time start = absl::Now();
    absl::Status s = r.ok() ? other.Wait(*r, start + kDeadline) : r.status();
    ok &= Expect(s, start, {absl::StatusCode::kDeadlineExceeded}, "Recv", &log);
    ok &=
        s.message().find(absl::StrCat("member ", absent, " has not sent it")) != std::string::npos;
  }
  {
    const absl::Time start = absl::Now();
    auto rail = w.Split(0, 0, start + kDeadline);
    ok &= Expect(rail.status(), start, {absl::StatusCode::kDeadlineExceeded}, "Split", &log);
  }
  return (Report(w.rank(), ok, log), ok ? 0 : 1);
}

int Kill(InterPodEngine& w) {
  std::vector<float> in(1024, 1.0f), out(1024);
  for (int i = 0;; ++i) {
    if (w.rank() == 1 && i == 20) raise(SIGKILL);
    auto t = w.AllReduce(in.data(), out.data(), in.size(), DataType::kFloat32, RedOp::kSum);
    const absl::Time start = absl::Now();
    absl::Status s = t.ok() ? w.Wait(*t, start + kDeadline) : t.status();
    if (s.ok()) {
      if (out[0] != static_cast<float>(w.size())) {
        Report(w.rank(), false, absl::StrCat("iteration ", i, ": sum ", out[0]));
        return 1;
      }
      if (i > 10000) {
        Report(w.rank(), false, "no error 10000 iterations after the kill");
        return 1;
      }
      continue;
    }
    std::string log = absl::StrCat("iteration ", i, ": ");
    const bool ok =
        Expect(s, start, {absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted},
               "AllReduce", &log);
    Report(w.rank(), ok && i >= 20, log);
    return ok ? 0 : 1;
  }
}

int Notice(InterPodEngine& w, InterPodEngine& other) {
  auto rail = w.Split(0, w.rank(), absl::Now() + absl::Seconds(20));
  if (!rail.ok()) return (Report(w.rank(), false, "Split: " + rail.status().ToString()), 1);
  std::string log;
  bool ok = true;
  if (w.rank() == 0) {
    absl::SleepFor(absl::Milliseconds(300));
    w.Abort("rank 0 gives up");
    log = "aborted; ";
  } else {
    char buf[8];
    auto r = (*rail)->Recv(buf, sizeof buf, 0, 5);
    const absl::Time start = absl::Now();
    absl::Status s = r.ok() ? (*rail)->Wait(*r, start + absl::Seconds(30)) : r.status();
    const absl::Duration took = absl::Now() - start;
    absl::StrAppend(&log, "Recv on the rail -> ", s.ToString(), " after ",
                    absl::FormatDuration(took), "; ");
    ok &= s.code() == absl::StatusCode::kAborted && took < kMargin &&
          s.message().find("world member 0 aborted: rank 0 gives up") != std::string::npos;
  }
  // Another world's engine heard nothing: it still works.
  auto bar = other.Barrier();
  absl::Status s = bar.ok() ? other.Wait(*bar, absl::Now() + absl::Seconds(20)) : bar.status();
  absl::StrAppend(&log, "Barrier on another world -> ", s.ToString());
  ok &= s.ok();
  return (Report(w.rank(), ok, log), ok ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -n 3 %s deadline|kill|notice\n", argv[0]);
    return 2;
  }
  auto w = MpiEngine::World(MPI_COMM_WORLD);
  if (!w.ok()) {
    std::fprintf(stderr, "MpiEngine::World: %s\n", w.status().ToString().c_str());
    return 1;
  }
  auto other = MpiEngine::World(MPI_COMM_WORLD);
  if (!other.ok()) {
    std::fprintf(stderr, "MpiEngine::World: %s\n", other.status().ToString().c_str());
    return 1;
  }
  const std::string mode = argv[1];
  int rc = 2;
  if (mode == "deadline") rc = Deadline(**w, **other);
  if (mode == "kill") rc = Kill(**w);
  if (mode == "notice") {
    rc = Notice(**w, **other);
    w->reset();  // flushes rank 0's notices before the exit below
  }
  if (rc == 2) std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  // The ranks that report in each mode (tests/pods/run_fault.sh).
  if (mode == "deadline") AwaitReports({0, 1});
  if (mode == "kill") AwaitReports({0, 2});
  if (mode == "notice") AwaitReports({0, 1, 2});
  std::fflush(nullptr);
  // No MPI_Finalize: a member is dead or absent, and it would wait for it.
  _exit(rc);
}
