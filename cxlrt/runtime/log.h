// Minimal leveled logging to stderr (the Debian 12 Abseil has no absl::log).
// Thread-safe: each message is written with one write(2).
// Level from CXLRT_LOG_LEVEL (error, warning, info, debug); default warning.
#pragma once

#include <sstream>
#include <string_view>

namespace cxlrt::runtime {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// True when messages of `level` are printed.
bool LogEnabled(LogLevel level);

// Overrides the level read from the environment (tools use it for -v).
void SetLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace cxlrt::runtime

#define CXLRT_LOG(level)                                                  \
  if (!::cxlrt::runtime::LogEnabled(::cxlrt::runtime::LogLevel::level)) { \
  } else                                                                  \
    ::cxlrt::runtime::LogMessage(::cxlrt::runtime::LogLevel::level, __FILE__, __LINE__).stream()
