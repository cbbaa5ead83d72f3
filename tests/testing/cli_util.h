// Running the `cxlrt` command from a test, as a user runs it.
// REQUIRES: the test target defines CXLRT_BIN (the command's path).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace cxlrt::testing {

struct CliResult {
  int code;         // exit code, -1 when killed
  std::string out;  // stdout and stderr together, unless the args redirect
};

// Runs `cxlrt ARGS REDIRECT` through the shell and collects its stdout.
inline CliResult RunCxlrt(const std::string& args, const std::string& redirect) {
  std::string cmd = std::string(CXLRT_BIN) + " " + args + " " + redirect;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Stdout and stderr together.
inline CliResult Cxlrt(const std::string& args) { return RunCxlrt(args, "2>&1"); }
// Stdout only.
inline CliResult CxlrtStdout(const std::string& args) { return RunCxlrt(args, "2>/dev/null"); }

inline std::string Quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace cxlrt::testing
