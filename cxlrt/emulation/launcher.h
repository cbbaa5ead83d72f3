// The local multi-host launcher behind `cxlrt run`: starts N processes as
// ranks spread over H emulated hosts on one pool, prefixes their output
// with the rank, and stops them all when one fails or on Ctrl-C.
//
// Each rank gets CXLRT_RANK, CXLRT_WORLD_SIZE, CXLRT_HOST_ID,
// CXLRT_SLOTS_PER_HOST, CXLRT_POOL and the torchrun-style RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE. Ranks are placed in blocks: rank r runs on
// host r * H / N, so neighbouring ranks share a host, as mpirun places them.
//
// Thread-safety: Launch() forks; call it from a process with no other
// threads running (the cxlrt command).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cxlrt::emulation {

struct LaunchOptions {
  int ranks = 1;
  // Emulated hosts; nullopt: one per rank.
  std::optional<int> hosts;
  // Pool URI. When it names a pool that does not exist and carries size=,
  // the launcher creates it and destroys it afterwards. nullopt: a fresh
  // emu://run-PID?size=256M, destroyed afterwards.
  std::optional<std::string> pool;
  std::vector<std::string> argv;
  // Wall-clock limit for the whole job; zero: none.
  absl::Duration timeout = absl::ZeroDuration();
  // Time the other ranks get to exit after SIGTERM before SIGKILL.
  absl::Duration grace = absl::Seconds(2);
};

struct LaunchResult {
  // 0 when every rank exited 0; else the exit code of the rank that failed
  // first (128+signal when it was killed, 124 on timeout, 130 on Ctrl-C).
  int exit_code = 0;
  std::optional<int> failed_rank;
  // "rank 2 (host 1, pid 4242) exited with code 3 first; stopped 3 other ranks".
  std::string message;
};

// Placement of rank `r` of `n` over `h` hosts.
struct RankPlacement {
  int host;
  int local_rank;
  int local_world_size;
};
RankPlacement PlaceRank(int r, int n, int h);

// Runs the job. Output of rank r is written line by line to this
// process's stdout / stderr as "[r] line". Returns an error status only
// when the job could not be started (bad options, pool errors).
absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options);

}  // namespace cxlrt::emulation
