#include "cxlrt/emulation/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/affinity.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::emulation {
namespace {

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

// Installs the Ctrl-C handler for the life of the launch and restores the
// previous one after.
class SignalScope {
 public:
  SignalScope() {
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    g_interrupted = 0;
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_, old_term_;
};

// One output stream of one rank, cut into lines.
struct Stream {
  int rank;
  int fd;      // read end, -1 once closed
  int out_fd;  // 1 or 2
  std::string partial;
};

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads what is there; writes every complete line with its prefix. At EOF
// (or `flush`) a last partial line is written too.
void Drain(Stream& s, bool flush) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !flush) break;
    close(s.fd);  // EOF, an error, or giving up on a stream a grandchild holds
    s.fd = -1;
  }
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    absl::StrAppend(&out, "[", s.rank, "] ", absl::string_view(s.partial).substr(start, nl - start),
                    "\n");
  }
  s.partial.erase(0, start);
  if (s.fd < 0 && !s.partial.empty()) {
    absl::StrAppend(&out, "[", s.rank, "] ", s.partial, "\n");
    s.partial.clear();
  }
  if (!out.empty()) WriteAll(s.out_fd, out);
}

struct Rank {
  pid_t pid = -1;
  int host = 0;
  bool running = false;
  int exit_code = 0;
};

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string Describe(int code) {
  if (code > 128)
    return absl::StrCat("was killed by signal ", code - 128, " (", strsignal(code - 128), ")");
  return absl::StrCat("exited with code ", code);
}

}  // namespace

RankPlacement PlaceRank(int r, int n, int h) {
  const int host = static_cast<int>(int64_t{r} * h / n);
  // Ranks of `host` are those r with r * h / n == host.
  int first = static_cast<int>((int64_t{host} * n + h - 1) / h);
  int end = static_cast<int>((int64_t{host + 1} * n + h - 1) / h);
  return {host, r - first, end - first};
}

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& o) {
  if (o.ranks < 1 || o.ranks > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("-n ", o.ranks, " is not in [1, 1024]"));
  }
  const int hosts = o.hosts.value_or(o.ranks);
  if (hosts < 1 || hosts > o.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("--hosts ", hosts, " must be in [1, ", o.ranks,
                                                   "] (one rank per host at least)"));
  }
  if (o.argv.empty())
    return absl::InvalidArgumentError("no command to run (cxlrt run -n N -- CMD)");

  // The pool: opened when it exists, else created (and later destroyed).
  const std::string uri_text = o.pool.value_or(absl::StrCat("emu://run-", getpid(), "?size=256M"));
  CXLRT_ASSIGN_OR_RETURN(runtime::PoolUri uri, runtime::ParsePoolUri(uri_text));
  bool created = false;
  uint32_t slots = 0;
  {
    auto pool = runtime::Pool::Open(uri_text);
    if (!pool.ok() && pool.status().code() == absl::StatusCode::kNotFound && uri.size) {
      pool = runtime::Pool::Create(uri_text);
      created = pool.ok();
    }
    if (!pool.ok()) return pool.status();
    slots = (*pool)->host_slots();
  }
  const std::string rank_uri = uri.ForOpeners();
  auto cleanup = [&] {
    if (created) (void)runtime::Pool::Destroy(rank_uri, {.force = true});
  };

  // Each host gets an equal share of the pool's slots.
  const int slots_per_host = static_cast<int>(slots) / hosts;
  const int most_per_host = (o.ranks + hosts - 1) / hosts;
  if (slots_per_host < most_per_host) {
    cleanup();
    return absl::InvalidArgumentError(
        absl::StrCat(uri.Identity(), " has ", slots, " host slots: too few for ", o.ranks,
                     " ranks on ", hosts, " hosts (", most_per_host,
                     " per host); create it with hosts=", most_per_host * hosts, " or more"));
  }

  std::vector<char*> argv;
  for (const std::string& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  CXLRT_ASSIGN_OR_RETURN(runtime::AffinityPlan affinity,
                         runtime::PlanAffinity(o.ranks, runtime::AffinitySetting()));
  CXLRT_LOG(kInfo) << "cxlrt run: affinity " << affinity.why;
  SignalScope signals;
  std::vector<Rank> ranks(o.ranks);
  std::vector<Stream> streams;
  std::map<pid_t, int> rank_of;
  fflush(nullptr);
  for (int r = 0; r < o.ranks; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot make pipes: ", strerror(errno)));
    }
    const RankPlacement p = PlaceRank(r, o.ranks, hosts);
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);  // the rank and whatever it starts are stopped together
      dup2(out[1], 1);
      dup2(err[1], 2);
      const std::pair<const char*, std::string> env[] = {
          {"CXLRT_RANK", absl::StrCat(r)},
          {"CXLRT_WORLD_SIZE", absl::StrCat(o.ranks)},
          {"CXLRT_HOST_ID", absl::StrCat(p.host)},
          {"CXLRT_SLOTS_PER_HOST", absl::StrCat(slots_per_host)},
          {"CXLRT_POOL", rank_uri},
          {"RANK", absl::StrCat(r)},
          {"WORLD_SIZE", absl::StrCat(o.ranks)},
          {"LOCAL_RANK", absl::StrCat(p.local_rank)},
          {"LOCAL_WORLD_SIZE", absl::StrCat(p.local_world_size)},
      };
      for (const auto& [k, v] : env) setenv(k, v.c_str(), 1);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      if (!affinity.cores.empty()) {
        if (absl::Status s = runtime::BindToCore(affinity.cores[r]); !s.ok()) {
          WriteAll(2, absl::StrCat("cxlrt run: rank ", r, ": ", s.message(), "\n"));
        }
        setenv("CXLRT_BOUND_CORE", absl::StrCat(affinity.cores[r]).c_str(), 1);
      }
      execvp(argv[0], argv.data());
      std::string msg =
          absl::StrCat("cxlrt run: cannot run '", o.argv[0], "': ", strerror(errno), "\n");
      WriteAll(2, msg);
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      for (Rank& k : ranks) {
        if (k.running) kill(-k.pid, SIGKILL);
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot fork rank ", r, ": ", strerror(errno)));
    }
    setpgid(pid, pid);  // also here: no race with the child's own call
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    ranks[r] = {pid, p.host, true, 0};
    rank_of[pid] = r;
    streams.push_back({r, out[0], 1, ""});
    streams.push_back({r, err[0], 2, ""});
  }

  LaunchResult result;
  int running = o.ranks;
  const absl::Time job_deadline =
      o.timeout > absl::ZeroDuration() ? absl::Now() + o.timeout : absl::InfiniteFuture();
  std::optional<absl::Time> kill_at;    // SIGKILL the rest then
  std::optional<absl::Time> reaped_at;  // all ranks gone; stop reading soon after
  int stopped = 0;
  auto stop_all = [&] {
    if (kill_at) return;
    for (Rank& k : ranks) {
      if (k.running) {
        kill(-k.pid, SIGTERM);
        ++stopped;
      }
    }
    kill_at = absl::Now() + o.grace;
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<Stream*> which;
    for (Stream& s : streams) {
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        which.push_back(&s);
      }
    }
    if (fds.empty() && running == 0) break;
    if (reaped_at && absl::Now() - *reaped_at > absl::Milliseconds(500)) {
      for (Stream* s : which) Drain(*s, /*flush=*/true);  // a grandchild holds it open
      break;
    }
    poll(fds.data(), fds.size(), 20);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents) Drain(*which[i], false);
    }

    int status;
    for (pid_t pid; running > 0 && (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = rank_of.find(pid);
      if (it == rank_of.end()) continue;
      Rank& k = ranks[it->second];
      k.running = false;
      k.exit_code = ExitCodeOf(status);
      --running;
      if (k.exit_code != 0 && !result.failed_rank && !kill_at) {
        result.failed_rank = it->second;
        result.exit_code = k.exit_code;
        result.message = absl::StrCat("rank ", it->second, " (host ", k.host, ", pid ", pid, ") ",
                                      Describe(k.exit_code), " first");
        stop_all();
      }
    }
    if (running == 0 && !reaped_at) reaped_at = absl::Now();

    if (g_interrupted && !kill_at) {
      result.exit_code = 130;
      result.message = "interrupted";
      stop_all();
    }
    if (absl::Now() > job_deadline && !kill_at) {
      result.exit_code = 124;
      result.message =
          absl::StrCat("the job ran past its timeout of ", absl::FormatDuration(o.timeout));
      stop_all();
    }
    if (kill_at && absl::Now() > *kill_at) {
      for (Rank& k : ranks) {
        if (k.running) kill(-k.pid, SIGKILL);
      }
      kill_at = absl::InfiniteFuture();  // once
    }
  }
  if (stopped > 0) {
    absl::StrAppend(&result.message, "; stopped ", stopped, result.failed_rank ? " other" : "",
                    " rank", stopped == 1 ? "" : "s");
  }
  fflush(nullptr);
  cleanup();
  return result;
}

}  // namespace cxlrt::emulation
