// `cxlrt run --pods` (launcher.h, docs/collectives.md, "Beyond one pool"): emulated pods on one
// machine, each with its own pool, the ranks started by mpirun.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cxlrt/emulation/launcher.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::emulation {
namespace {

volatile sig_atomic_t g_pods_interrupted = 0;
void OnPodsSignal(int) { g_pods_interrupted = 1; }

// Each rank runs under this shell, which mpirun starts once per rank with
// its pod's variables (-x): it adds the per-rank ones, runs the program
// and records its exit code (mpirun, told not to stop the job when a rank
// fails, exits 0 whatever the ranks did).
constexpr char kRankShim[] = R"sh(
status_dir=$CXLRT_RUN_STATUS
first=$CXLRT_POD_FIRST
unset CXLRT_RUN_STATUS CXLRT_POD_FIRST
CXLRT_RANK=$OMPI_COMM_WORLD_RANK
CXLRT_LOCAL_RANK=$((CXLRT_RANK - first))
CXLRT_HOST_ID=$CXLRT_LOCAL_RANK
RANK=$CXLRT_RANK
export CXLRT_RANK CXLRT_LOCAL_RANK CXLRT_HOST_ID RANK
"$@"
rc=$?
echo "$rc" > "$status_dir/rank.$CXLRT_RANK"
exit "$rc"
)sh";

std::string FindOnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string DescribeCode(int code) {
  if (code > 128) {
    return absl::StrCat("was killed by signal ", code - 128, " (", strsignal(code - 128), ")");
  }
  return absl::StrCat("exited with code ", code);
}

// One pod's pool: opened, or created (and destroyed by the destructor).
struct PodPool {
  std::string opener_uri;
  uint32_t slots = 0;
  bool created = false;
  ~PodPool() {
    if (created) (void)runtime::Pool::Destroy(opener_uri, {.force = true});
  }
};

absl::StatusOr<std::unique_ptr<PodPool>> MakePodPool(const std::optional<std::string>& base,
                                                     int pod) {
  std::string text = absl::StrCat("emu://run-", getpid(), "-pod", pod, "?size=256M");
  if (base) {
    CXLRT_ASSIGN_OR_RETURN(runtime::PoolUri uri, runtime::ParsePoolUri(*base));
    if (uri.scheme != runtime::PoolScheme::kEmu) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pool ", *base,
                       " with --pods: each pod needs a pool of its own, so the URI must be an "
                       "emu:// one whose name gets the pod's index"));
    }
    uri.name = absl::StrCat(uri.name, "-pod", pod);
    if (uri.name.size() > 64) {
      return absl::InvalidArgumentError(absl::StrCat("--pool ", *base, ": the pod pool name ",
                                                     uri.name, " is longer than 64 characters"));
    }
    text = uri.ToString();
  }
  CXLRT_ASSIGN_OR_RETURN(runtime::PoolUri uri, runtime::ParsePoolUri(text));
  auto out = std::make_unique<PodPool>();
  auto pool = runtime::Pool::Open(text);
  if (!pool.ok() && pool.status().code() == absl::StatusCode::kNotFound && uri.size) {
    pool = runtime::Pool::Create(text);
    out->created = pool.ok();
  }
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrCat("pod ", pod, "'s pool: ", pool.status().message()));
  }
  out->slots = (*pool)->host_slots();
  out->opener_uri = uri.ForOpeners();
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PodPlacement>> PlacePods(int ranks, int pods,
                                                    const std::vector<int>& pod_sizes) {
  std::vector<PodPlacement> out;
  if (!pod_sizes.empty()) {
    if (pods != 0 && pods != static_cast<int>(pod_sizes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pods ", pods, " but --pod-sizes names ", pod_sizes.size(), " pods"));
    }
    int first = 0;
    for (size_t p = 0; p < pod_sizes.size(); ++p) {
      if (pod_sizes[p] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pod-sizes: pod ", p, " has ", pod_sizes[p], " ranks (at least 1)"));
      }
      out.push_back({first, pod_sizes[p]});
      first += pod_sizes[p];
    }
    if (ranks != 0 && ranks != first) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pod-sizes add up to ", first, " ranks but -n is ", ranks));
    }
    if (first > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(first, " ranks: at most 1024"));
    }
    return out;
  }
  if (ranks < 1 || ranks > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("-n ", ranks, " is not in [1, 1024]"));
  }
  if (pods < 1 || pods > ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pods ", pods, " must be in [1, ", ranks, "] (one rank per pod at least)"));
  }
  for (int p = 0; p < pods; ++p) {
    const int first = static_cast<int>(int64_t{ranks} * p / pods);
    const int end = static_cast<int>(int64_t{ranks} * (p + 1) / pods);
    out.push_back({first, end - first});
  }
  return out;
}

absl::StatusOr<LaunchResult> LaunchPods(const PodLaunchOptions& o) {
  CXLRT_ASSIGN_OR_RETURN(std::vector<PodPlacement> pods, PlacePods(o.ranks, o.pods, o.pod_sizes));
  const int ranks = pods.back().first + pods.back().size;
  if (o.argv.empty()) {
    return absl::InvalidArgumentError("no command to run (cxlrt run --pods P -n N -- CMD)");
  }
  const std::string mpirun = FindOnPath(o.mpirun.empty() ? "mpirun" : o.mpirun);
  if (mpirun.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cxlrt run --pods starts the ranks with Open MPI's mpirun, and there is no ",
                     o.mpirun.empty() ? "mpirun on PATH" : o.mpirun,
                     ": install Open MPI (apt-get install openmpi-bin libopenmpi-dev, or "
                     "scripts/install-deps.sh)"));
  }

  std::vector<std::unique_ptr<PodPool>> pools;  // destroyed (when made here) on every return
  for (size_t p = 0; p < pods.size(); ++p) {
    CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<PodPool> pool, MakePodPool(o.pool, static_cast<int>(p)));
    if (pool->slots < static_cast<uint32_t>(pods[p].size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pod ", p, "'s pool ", pool->opener_uri, " has ", pool->slots,
          " host slots: too few for ", pods[p].size,
          " ranks (one emulated host each); create it with hosts=", pods[p].size, " or more"));
    }
    pools.push_back(std::move(pool));
  }

  char dir_template[] = "/tmp/cxlrt-run-pods-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot make a directory in /tmp: ", strerror(errno)));
  }
  const std::string status_dir = dir_template;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_dir{status_dir};

  // mpirun's command: loopback TCP between the ranks (the engine between
  // pods really crosses a network stack), as many ranks as asked whatever
  // the cores, no binding, and a failed rank does not stop the others:
  // neither by its exit code nor by exiting without MPI_Finalize, which is
  // how a rank whose engine broke leaves (mpi_engine.h; without
  // orte_allowed_exit_without_sync mpirun kills every other rank then,
  // before it can report its own error).
  std::vector<std::string> args = {mpirun};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* a :
       {"--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp", "--mca",
        "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", "--mca",
        "orte_abort_on_non_zero_status", "0", "--mca", "orte_allowed_exit_without_sync", "1"}) {
    args.push_back(a);
  }
  for (size_t p = 0; p < pods.size(); ++p) {
    if (p > 0) args.push_back(":");
    args.push_back("-n");
    args.push_back(absl::StrCat(pods[p].size));
    const std::pair<const char*, std::string> env[] = {
        {"CXLRT_POOL", pools[p]->opener_uri},
        {"CXLRT_POD", absl::StrCat(p)},
        {"CXLRT_PODS", absl::StrCat(pods.size())},
        {"CXLRT_POD_SIZE", absl::StrCat(pods[p].size)},
        {"CXLRT_POD_FIRST", absl::StrCat(pods[p].first)},
        {"CXLRT_WORLD_SIZE", absl::StrCat(ranks)},
        {"CXLRT_SLOTS_PER_HOST", absl::StrCat(pools[p]->slots / pods[p].size)},
        {"CXLRT_RUN_STATUS", status_dir},
        {"WORLD_SIZE", absl::StrCat(ranks)},
        {"LOCAL_RANK", "0"},
        {"LOCAL_WORLD_SIZE", "1"},
    };
    for (const auto& [k, v] : env) {
      args.push_back("-x");
      args.push_back(absl::StrCat(k, "=", v));
    }
    for (const char* a : {"/bin/sh", "-c", kRankShim, "cxlrt-rank"}) args.push_back(a);
    for (const std::string& a : o.argv) args.push_back(a);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  struct sigaction sa = {}, old_int, old_term;
  sa.sa_handler = OnPodsSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_pods_interrupted = 0;
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(argv[0], argv.data());
    const std::string msg =
        absl::StrCat("cxlrt run: cannot run ", args[0], ": ", strerror(errno), "\n");
    (void)!write(2, msg.data(), msg.size());
    _exit(127);
  }
  if (pid < 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    return absl::ResourceExhaustedError(absl::StrCat("cannot fork mpirun: ", strerror(errno)));
  }
  setpgid(pid, pid);

  LaunchResult result;
  const absl::Time job_deadline =
      o.timeout > absl::ZeroDuration() ? absl::Now() + o.timeout : absl::InfiniteFuture();
  std::optional<absl::Time> kill_at;
  int mpirun_code = 0;
  while (true) {
    int status;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      mpirun_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                      : (WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1);
      break;
    }
    if (r < 0 && errno != EINTR) break;
    if (!kill_at && (g_pods_interrupted || absl::Now() > job_deadline)) {
      result.exit_code = g_pods_interrupted ? 130 : 124;
      result.message = g_pods_interrupted ? "interrupted"
                                          : absl::StrCat("the job ran past its timeout of ",
                                                         absl::FormatDuration(o.timeout));
      kill(pid, SIGTERM);  // mpirun stops its ranks
      kill_at = absl::Now() + o.grace;
    }
    if (kill_at && absl::Now() > *kill_at) {
      kill(-pid, SIGKILL);
      kill_at = absl::InfiniteFuture();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (result.exit_code != 0) return result;

  // What each rank did, by rank order.
  std::vector<int> unfinished;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream f(absl::StrCat(status_dir, "/rank.", r));
    int code = -1;
    if (!(f >> code)) {
      unfinished.push_back(r);
      continue;
    }
    if (code != 0 && !result.failed_rank) {
      int pod = 0;
      while (pod + 1 < static_cast<int>(pods.size()) && pods[pod + 1].first <= r) ++pod;
      result.failed_rank = r;
      result.exit_code = code;
      result.message = absl::StrCat("rank ", r, " (pod ", pod, ", local rank ", r - pods[pod].first,
                                    ") ", DescribeCode(code));
    }
  }
  if (!unfinished.empty()) {
    absl::StrAppend(&result.message, result.message.empty() ? "" : "; ", unfinished.size(),
                    " rank(s) did not finish (first: rank ", unfinished[0],
                    "): killed by mpirun, or never started");
    if (result.exit_code == 0) result.exit_code = mpirun_code != 0 ? mpirun_code : 1;
  }
  if (result.exit_code == 0 && mpirun_code != 0) {
    result.exit_code = mpirun_code;
    result.message = absl::StrCat("mpirun ", DescribeCode(mpirun_code));
  }
  return result;
}

}  // namespace cxlrt::emulation
