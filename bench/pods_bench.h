// `cxlrt bench pods`: a hierarchical collective (all-reduce by default)
// across emulated pods
// (docs/collectives.md, "Beyond one pool") beside one pool that holds all
// the same ranks, measured in the same run, with each tier's time: the
// time a rank spent in its pod steps and waiting for the engine, and each
// tier alone (a pool all-reduce of the whole buffer in one pod; a rail
// all-reduce of one shard over the engine), so a reader sees which tier
// bounds the call. Starts its ranks itself (forked processes): pod p holds
// ranks [p*N/P, (p+1)*N/P), each pod its own pool, and every rank also maps
// the interconnect pool. The engine between pods is pluggable by name
// (--engine; "pool" here).
#pragma once

#include <cstdint>
#include <string>

namespace cxlrt::bench {

struct PodsBenchOptions {
  std::string collective = "allreduce";  // or reducescatter, allgather, broadcast, reduce, alltoall
  int pods = 2;
  int ranks = 4;
  uint64_t min_bytes = 64 << 10;
  uint64_t max_bytes = 16 << 20;
  uint64_t factor = 4;
  int iters = 10;
  int warmup = 3;
  uint64_t chunk_bytes = 0;     // PodOptions::chunk_bytes (0: its default)
  std::string engine = "pool";  // the InterPodEngine between pods
  bool json = false;
};

// Prints the table (or JSON lines). Returns 0, or 1 with a message on stderr.
int RunPodsBench(const PodsBenchOptions& options);

}  // namespace cxlrt::bench
