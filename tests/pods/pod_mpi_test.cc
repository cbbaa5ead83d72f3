// The hierarchical communicator over the Open MPI engine, end to end, as a
// user runs it: one process per rank under `cxlrt run --pods P -n N` (or
// --pod-sizes), each rank's pod pool from CXLRT_POOL, the communicator from
// the front door (cxlrt/pods/mpi_communicator.h). run_pod_mpi_test.sh runs
// it in both coherence domains and checks what every rank printed.
//
//   pod_mpi_test full|quick   every collective exact against the single-pool
//                             reference (pod_case.h; "full": more types and
//                             ops), chunks of 4 KiB so that long calls span
//                             many; all-to-all-v with random splits
//                             including zeros; Send/Recv around a ring that
//                             crosses the pods, in order; Barrier; Destroy.
//   pod_mpi_test kill VICTIM  a loop of collectives in which world rank
//                             VICTIM SIGKILLs itself: every other rank, in
//                             every pod, must get kAborted before its
//                             timeout (CXLRT_COMM_TIMEOUT_MS) ends, never
//                             OK, never a hang.
//
// Every rank prints one line, "rank R: PASS ..." or "rank R: FAIL ...", and
// exits 0 or 1; after a failure it exits at once (no MPI_Finalize, which
// would wait for a dead rank).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/cxlrt.h"
#include "cxlrt/pods/mpi_communicator.h"
#include "tests/pods/pod_case.h"

namespace cxlrt::pods {
namespace {

using collectives::Case;

// Around the ring of all ranks (so every pair of neighbouring pods is
// crossed), a message smaller and one larger than a chunk, each way in
// order; then three messages from rank 0 to the last rank.
std::string RunSendRecv(MultiPodCommunicator& c) {
  const int n = c.size(), me = c.rank();
  const int to = (me + 1) % n, from = (me + n - 1) % n;
  for (size_t count : {size_t{1001}, size_t{100003}}) {
    std::vector<float> out(count), in(count);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(me * 1000 + i % 997);
    auto send = [&] { return c.Send(out.data(), count, DataType::kFloat32, to); };
    auto recv = [&] { return c.Recv(in.data(), count, DataType::kFloat32, from); };
    absl::Status s = me % 2 == 0 ? send() : recv();
    if (s.ok()) s = me % 2 == 0 ? recv() : send();
    if (!s.ok()) return absl::StrCat("Send/Recv ring: ", s.ToString());
    for (size_t i = 0; i < count; ++i) {
      if (in[i] != static_cast<float>(from * 1000 + i % 997)) {
        return absl::StrCat("Send/Recv ring: element ", i, " from rank ", from, " is wrong");
      }
    }
  }
  if (me == 0 || me == n - 1) {
    for (int k = 0; k < 3; ++k) {
      int64_t v = me == 0 ? 100 + k : -1;
      absl::Status s =
          me == 0 ? c.Send(&v, 1, DataType::kInt64, n - 1) : c.Recv(&v, 1, DataType::kInt64, 0);
      if (!s.ok()) return absl::StrCat("Send/Recv 0 -> ", n - 1, ": ", s.ToString());
      if (v != 100 + k) return absl::StrCat("message ", k, " from rank 0 arrived as ", v);
    }
  }
  return "";
}

std::string RunEverything(MultiPodCommunicator& comm, bool full) {
  const int mpi_rank = std::atoi(std::getenv("CXLRT_RANK") ? std::getenv("CXLRT_RANK") : "-1");
  if (comm.rank() != mpi_rank) {
    return absl::StrCat("rank ", comm.rank(), " but cxlrt run made this CXLRT_RANK ", mpi_rank);
  }
  const char* pods = std::getenv("CXLRT_PODS");
  if (pods == nullptr || comm.npods() != std::atoi(pods)) {
    return absl::StrCat(comm.npods(), " pods, but cxlrt run made ", pods ? pods : "none");
  }
  for (const Case& c : PodMatrix(comm.size(), full)) {
    std::string e = RunPodCase(comm, c);
    if (!e.empty()) return e;
  }
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::string e = RunAllToAllV(comm, seed, seed % 2 ? DataType::kBfloat16 : DataType::kInt64);
    if (!e.empty()) return e;
  }
  std::string e = RunSendRecv(comm);
  if (!e.empty()) return e;
  absl::Status s = comm.Barrier();
  if (!s.ok()) return "Barrier: " + s.ToString();
  s = comm.Destroy();
  if (!s.ok()) return "Destroy: " + s.ToString();
  return "";
}

// A loop of collectives; `victim` kills itself at iteration 5. Returns ""
// when this survivor saw the right error in time.
std::string RunKill(MultiPodCommunicator& comm, int victim) {
  const absl::Duration timeout = absl::Milliseconds(collectives::kCommTimeoutMs.Get());
  std::vector<float> a(20000, 1.0f), b(20000);
  absl::Status s;
  absl::Time died = absl::InfiniteFuture();
  int i = 0;
  for (; i < 2000 && s.ok(); ++i) {
    if (i == 5) died = absl::Now();
    if (comm.rank() == victim && i == 5) raise(SIGKILL);
    switch (i % 3) {
      case 0:
        s = comm.AllReduce(a.data(), b.data(), a.size(), DataType::kFloat32, RedOp::kSum);
        break;
      case 1:
        s = comm.AllGather(a.data(), b.data(), a.size() / comm.size(), DataType::kFloat32);
        break;
      default:
        s = comm.Broadcast(a.data(), a.data(), a.size(), DataType::kFloat32, 0);
        break;
    }
  }
  if (s.ok()) return "every call succeeded with a rank dead";
  // kAborted, before the deadline, in the victim's pod and the others: its
  // pod-mates see it dead through the pool, and their engines' abort
  // notices reach the other pods (a rank that heard none would wait for
  // the deadline: kDeadlineExceeded).
  if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
  const absl::Duration took = absl::Now() - died;
  if (took > timeout) {
    return absl::StrCat("noticed after ", absl::FormatDuration(took), " (timeout ",
                        absl::FormatDuration(timeout), "): ", s.ToString());
  }
  if (comm.Barrier().code() != absl::StatusCode::kFailedPrecondition) {
    return "usable after the error";
  }
  return absl::StrCat("call ", i - 1, " -> ", s.ToString(), " after ", absl::FormatDuration(took));
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "full" && mode != "quick" && !(mode == "kill" && argc > 2)) {
    std::fprintf(stderr, "usage: pod_mpi_test full|quick|kill VICTIM (under cxlrt run --pods)\n");
    return 2;
  }
  const char* rank_env = std::getenv("CXLRT_RANK");
  const std::string me = rank_env ? rank_env : "?";
  auto fail = [&](const std::string& why) {
    std::printf("rank %s: FAIL %s\n", me.c_str(), why.c_str());
    std::fflush(stdout);
    _exit(1);
  };
  auto host = Host::Open();
  if (!host.ok()) fail("Host::Open: " + host.status().ToString());
  CommOptions options;  // timeout: CXLRT_COMM_TIMEOUT_MS
  options.slot_bytes = 64 << 10;
  PodOptions pod_options;
  pod_options.chunk_bytes = 4096;  // 20011 elements span many chunks
  auto comm = CreateOverMpi(host->allocator(), "t", MPI_COMM_WORLD, options, pod_options);
  if (!comm.ok()) fail("CreateOverMpi: " + comm.status().ToString());
  if (mode == "kill") {
    const int victim = std::atoi(argv[2]);
    const std::string r = RunKill(**comm, victim);
    if (r.find("call ") != 0) fail(r);
    std::printf("rank %s: PASS %s\n", me.c_str(), r.c_str());
    std::fflush(stdout);
    _exit(0);  // a rank is dead: no leaving barriers, no MPI_Finalize
  }
  const std::string e = RunEverything(**comm, mode == "full");
  if (!e.empty()) fail(e);
  std::printf("rank %s: PASS %s, %d ranks in %d pods\n", me.c_str(), mode.c_str(), (*comm)->size(),
              (*comm)->npods());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace cxlrt::pods

int main(int argc, char** argv) { return cxlrt::pods::Main(argc, argv); }
