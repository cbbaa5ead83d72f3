// The local multi-host launcher behind `cxlrt run`: starts N processes as
// ranks spread over H emulated hosts on one pool, prefixes their output
// with the rank, and stops them all when one fails or on Ctrl-C.
//
// Each rank gets CXLRT_RANK, CXLRT_WORLD_SIZE, CXLRT_HOST_ID,
// CXLRT_SLOTS_PER_HOST, CXLRT_POOL and the torchrun-style RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE. Ranks are placed in blocks: rank r runs on
// host r * H / N, so neighbouring ranks share a host, as mpirun places them.
//
// LaunchPods() is `cxlrt run --pods`: several emulated pods on one machine,
// each with its own pool, the ranks started by Open MPI's mpirun so that the
// engine between pods (cxlrt/pods/mpi_engine.h) runs on loopback TCP
// (docs/collectives.md, "Beyond one pool").
//
// Thread-safety: Launch() and LaunchPods() fork; call it from a process with no other
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

// --- Pods (`cxlrt run --pods P -n N`, `--pod-sizes 2,3`).
//
// Pod p holds the ranks [first, first + size): in blocks, N*p/P to
// N*(p+1)/P, or the given sizes in order. Each pod gets its own pool, made
// before the ranks start and destroyed after, and each rank is one
// emulated host of its pod's pool. Every rank gets, besides mpirun's own
// OMPI_COMM_WORLD_* variables:
//   CXLRT_RANK, CXLRT_WORLD_SIZE   the rank in the whole job, and its size
//   CXLRT_POD, CXLRT_PODS          its pod, and how many there are
//   CXLRT_POD_SIZE                 the ranks of its pod
//   CXLRT_LOCAL_RANK               its index in its pod (= CXLRT_HOST_ID)
//   CXLRT_POOL                     its pod's pool (the URI an opener uses)
//   CXLRT_HOST_ID, CXLRT_SLOTS_PER_HOST  its emulated host in that pool
//   RANK, WORLD_SIZE, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1 (torchrun's names,
//   as Launch sets them with one rank per emulated host)
struct PodLaunchOptions {
  // Ranks in all; 0: the sum of pod_sizes.
  int ranks = 0;
  // Pods; 0: pod_sizes.size().
  int pods = 0;
  // Ranks of each pod, in order; empty: the ranks split in blocks.
  std::vector<int> pod_sizes;
  // A pool URI that each pod's pool is made from, the pod's index appended
  // to its name ("emu://job?size=1G" gives emu://job-pod0?size=1G, ...);
  // created when missing and it has size=, destroyed after. nullopt:
  // emu://run-PID-podP?size=256M.
  std::optional<std::string> pool;
  std::vector<std::string> argv;
  absl::Duration timeout = absl::ZeroDuration();
  absl::Duration grace = absl::Seconds(2);
  // The mpirun to run; empty: "mpirun" found on PATH.
  std::string mpirun;
};

struct PodPlacement {
  int first;  // global rank of the pod's first rank
  int size;   // ranks in the pod
};
// The pods of a job; kInvalidArgument naming what is wrong (sizes that do
// not add up to `ranks`, an empty pod, more pods than ranks).
absl::StatusOr<std::vector<PodPlacement>> PlacePods(int ranks, int pods,
                                                    const std::vector<int>& pod_sizes);

// Runs the job under mpirun (one app context per pod, loopback TCP between
// ranks; a rank that fails does not stop the others, so that each reports
// its own error at its deadline). kFailedPrecondition, saying what to
// install, when there is no mpirun. The result names the first rank (by
// rank order) that exited non-zero, and the ranks that did not finish.
absl::StatusOr<LaunchResult> LaunchPods(const PodLaunchOptions& options);

}  // namespace cxlrt::emulation
