// `cxlrt bench ... --plot FILE.png`: the benchmark runs in JSON mode with
// its standard output going to FILE.json (beside the plot, kept), then the
// plotter (python/cxlrt/plot.py, matplotlib) draws FILE.png from it.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace cxlrt::tools {
namespace {

bool IsFile(const std::string& path) { return !path.empty() && access(path.c_str(), R_OK) == 0; }

// $CXLRT_PLOTTER, else the source tree's plot.py (a build tree), else the
// installed share/cxlrt/plot.py beside bin/cxlrt.
std::string FindPlotter() {
  if (const char* p = std::getenv("CXLRT_PLOTTER"); p != nullptr && *p != '\0') return p;
#ifdef CXLRT_PLOTTER_SOURCE
  if (IsFile(CXLRT_PLOTTER_SOURCE)) return CXLRT_PLOTTER_SOURCE;
#endif
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/'));
    const std::string installed = dir + "/../share/cxlrt/plot.py";
    if (IsFile(installed)) return installed;
  }
  return "";
}

// FILE.png -> FILE.json; a name without a suffix gets ".json" added.
std::string JsonPathFor(const std::string& plot) {
  const size_t slash = plot.rfind('/');
  const size_t dot = plot.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      plot.substr(dot) == ".json") {
    return plot + ".json";
  }
  return plot.substr(0, dot) + ".json";
}

}  // namespace

int BenchWithPlot(const std::string& what, const std::string& plot, bool print_json,
                  const std::function<int()>& bench) {
  const std::string plotter = FindPlotter();
  if (plotter.empty()) {
    std::fprintf(stderr,
                 "cxlrt bench %s: --plot: cannot find the plotter (python/cxlrt/plot.py; set "
                 "CXLRT_PLOTTER to its path)\n",
                 what.c_str());
    return 2;
  }
  const std::string json_path = JsonPathFor(plot);
  const int fd = open(json_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "cxlrt bench %s: --plot: cannot write %s: %s\n", what.c_str(),
                 json_path.c_str(), std::strerror(errno));
    return 2;
  }
  // Standard output into the JSON file for the benchmark's run (its forked
  // ranks inherit it), then back.
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  if (saved < 0 || dup2(fd, STDOUT_FILENO) < 0) {
    std::fprintf(stderr, "cxlrt bench %s: --plot: dup2: %s\n", what.c_str(), std::strerror(errno));
    close(fd);
    return 1;
  }
  close(fd);
  const int rc = bench();
  std::fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  if (print_json) {
    if (FILE* f = std::fopen(json_path.c_str(), "r")) {
      char buf[1 << 16];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) std::fwrite(buf, 1, n, stdout);
      std::fclose(f);
      std::fflush(stdout);
    }
  }
  if (rc != 0) {
    std::fprintf(stderr, "cxlrt bench %s: the benchmark failed (exit %d); no plot (its JSON: %s)\n",
                 what.c_str(), rc, json_path.c_str());
    return rc;
  }

  const char* env_python = std::getenv("CXLRT_PYTHON");
  // Debian's interpreter, which sees python3-matplotlib (scripts/install-deps.sh).
  const std::string python = env_python != nullptr && *env_python != '\0' ? env_python
                             : IsFile("/usr/bin/python3")                 ? "/usr/bin/python3"
                                                                          : "python3";
  std::vector<std::string> args = {python, plotter, "-o", plot, "--title", "cxlrt bench " + what};
  if (!print_json) args.push_back("--summary");  // the series as text where the table was
  args.push_back(json_path);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "cxlrt bench %s: --plot: fork: %s\n", what.c_str(), std::strerror(errno));
    return 1;
  }
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "cxlrt bench %s: --plot: cannot run %s: %s (set CXLRT_PYTHON)\n",
                 what.c_str(), python.c_str(), std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "cxlrt bench %s: --plot: the plotter failed (%s %s); the JSON is in %s\n",
                 what.c_str(), python.c_str(), plotter.c_str(), json_path.c_str());
    return WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
  }
  return 0;
}

}  // namespace cxlrt::tools
