// Helpers shared by the tests: status assertions, throw-away pools in a
// private directory, and forked "emulated host" processes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/coherence_domain.h"
#include "gtest/gtest.h"

namespace cxlrt::runtime {
// Test names print the domain, not its bytes.
inline void PrintTo(CoherenceDomain d, std::ostream* os) { *os << CoherenceDomainName(d); }
}  // namespace cxlrt::runtime

namespace cxlrt::testing {

inline std::string StatusText(const absl::Status& s) { return s.ToString(); }
template <typename T>
std::string StatusText(const absl::StatusOr<T>& s) {
  return s.status().ToString();
}
inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

#define CXLRT_ASSERT_OK(expr)                                              \
  do {                                                                     \
    const auto& cxlrt_s_ = (expr);                                         \
    ASSERT_TRUE(::cxlrt::testing::GetStatus(cxlrt_s_).ok())                \
        << #expr << " failed: " << ::cxlrt::testing::StatusText(cxlrt_s_); \
  } while (0)
#define CXLRT_EXPECT_OK(expr)                                              \
  do {                                                                     \
    const auto& cxlrt_s_ = (expr);                                         \
    EXPECT_TRUE(::cxlrt::testing::GetStatus(cxlrt_s_).ok())                \
        << #expr << " failed: " << ::cxlrt::testing::StatusText(cxlrt_s_); \
  } while (0)

// Expects `expr` to fail with `code` and a message containing `substr`.
#define CXLRT_EXPECT_ERROR(expr, want_code, want_substr)                              \
  do {                                                                                \
    const auto& cxlrt_s_ = (expr);                                                    \
    const absl::Status& cxlrt_st_ = ::cxlrt::testing::GetStatus(cxlrt_s_);            \
    EXPECT_EQ(cxlrt_st_.code(), (want_code)) << cxlrt_st_;                            \
    EXPECT_NE(std::string(cxlrt_st_.message()).find(want_substr), std::string::npos)  \
        << "message '" << cxlrt_st_.message() << "' lacks '" << (want_substr) << "'"; \
  } while (0)

// A private directory for pool files, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/dev/shm/cxlrt-test-XXXXXX";
    const char* d = mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    path_ = d ? d : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// emu://NAME?size=SIZE&dir=DIR&EXTRA with a name unique in this process.
inline std::string PoolUri(const TempDir& dir, const std::string& extra = "",
                           const std::string& size = "8M") {
  static std::atomic<int> counter{0};
  std::string uri =
      absl::StrCat("emu://t", getpid(), "-", counter++, "?size=", size, "&dir=", dir.path());
  if (!extra.empty()) absl::StrAppend(&uri, "&", extra);
  return uri;
}

// The URI without its creation parameters (what an opener would pass).
inline std::string OpenUri(const std::string& create_uri) {
  std::string name = create_uri.substr(0, create_uri.find('?'));
  size_t dir = create_uri.find("dir=");
  std::string d = create_uri.substr(dir + 4);
  d = d.substr(0, d.find('&'));
  return absl::StrCat(name, "?dir=", d);
}

// Forks a child that runs `body` and exits with its return value. The
// parent must have no threads of its own running (gtest's main has none).
inline pid_t Spawn(const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 99;
    rc = body();
    fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// Waits for `pid`; returns its exit code, 128+signal if killed, or -1 when
// it did not finish within `timeout` (then it is killed).
inline int WaitExit(pid_t pid, absl::Duration timeout = absl::Seconds(60)) {
  const absl::Time end = absl::Now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -2;
}

// CXLRT_TEST_SCALE (default 1) multiplies the size of stress tests.
inline int TestScale() {
  const char* s = std::getenv("CXLRT_TEST_SCALE");
  int v = s ? std::atoi(s) : 1;
  return v > 0 ? v : 1;
}

}  // namespace cxlrt::testing
