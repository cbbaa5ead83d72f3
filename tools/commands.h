// The subcommands of the `cxlrt` tool. Each returns the process exit code:
// 0 success, 1 the operation failed (message on stderr), 2 bad usage.
#pragma once

#include <string>

namespace cxlrt::tools {

int PoolCreate(const std::string& uri);
int PoolInfo(const std::string& uri, bool json);
int PoolCheck(const std::string& uri, bool json);
int PoolDestroy(const std::string& uri, bool force);
// Attaches as a host for `seconds`, printing what it sees every
// `interval_ms`; the demo runs two of these side by side.
int PoolAttach(const std::string& uri, int slot, double seconds, int interval_ms);
int PoolFence(const std::string& uri, int slot, bool force);
int Doctor(bool json);

}  // namespace cxlrt::tools
