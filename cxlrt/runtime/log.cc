#include "cxlrt/runtime/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cxlrt/runtime/knobs.h"

namespace cxlrt::runtime {
namespace {

std::atomic<int> g_level{-1};

const Knob<std::string> kLogLevel({"CXLRT_LOG_LEVEL", "warning", "error, warning, info or debug."},
                                  "warning", OneOf({"error", "warning", "info", "debug"}));

int LevelFromConfig() {
  const std::string& s = kLogLevel.Get();
  if (s == "error") return 0;
  if (s == "info") return 2;
  if (s == "debug") return 3;
  return 1;
}

}  // namespace

bool LogEnabled(LogLevel level) {
  int current = g_level.load(std::memory_order_relaxed);
  if (current < 0) {
    current = LevelFromConfig();
    g_level.store(current, std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr const char* kNames[] = {"E", "W", "I", "D"};
  const char* base = std::strrchr(file, '/');
  stream_ << "cxlrt " << kNames[static_cast<int>(level_)] << " [" << getpid() << "] "
          << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string text = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace cxlrt::runtime
