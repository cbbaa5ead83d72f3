// Bootstrap from the environment: the rank and size a launcher set, and
// the options' unset values from the knobs (comm_knobs.h).
#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/communicator_impl.h"
#include "cxlrt/gpu/gpu.h"

namespace cxlrt::collectives {
namespace {

using collectives_internal::kP2pAlign;
using collectives_internal::RoundUp;

// Send/Recv channels when neither the options nor CXLRT_COMM_P2P_BYTES say:
// the largest power of two in [64 KiB, 1 MiB] whose n x n channels take at
// most 1/16 of the pool. Chunks of 64-256 KiB (a quarter of it) beat the
// 16 KiB of 64 KiB channels by up to 1.5x from 1 MiB messages up
// (docs/collectives.md, "Send / Recv"); a pool shared by many ranks keeps
// its room for data.
uint64_t DefaultP2pBytes(uint64_t pool_size, int n) {
  uint64_t b = uint64_t{1} << 20;
  while (b > (64u << 10) && b * n * n > pool_size / 16) b /= 2;
  return b;
}

absl::StatusOr<int> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return absl::NotFoundError(name);
  int out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not a rank or size"));
  }
  return out;
}

}  // namespace

absl::StatusOr<RankInfo> RankFromEnvironment() {
  static const struct {
    const char* rank;
    const char* size;
    const char* source;
  } kLaunchers[] = {
      {"CXLRT_RANK", "CXLRT_WORLD_SIZE", "cxlrt run"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"},
      {"PMI_RANK", "PMI_SIZE", "mpirun (PMI)"},
      {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
      {"RANK", "WORLD_SIZE", "torchrun"},
  };
  for (const auto& l : kLaunchers) {
    auto rank = EnvInt(l.rank);
    if (absl::IsNotFound(rank.status())) continue;
    if (!rank.ok()) return rank.status();
    auto size = EnvInt(l.size);
    if (!size.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(l.rank, " is set but ", l.size, " is not: ", size.status().message()));
    }
    if (*size < 1 || *rank >= *size) {
      return absl::InvalidArgumentError(
          absl::StrCat(l.rank, "=", *rank, " is not below ", l.size, "=", *size));
    }
    return RankInfo{*rank, *size, l.source};
  }
  return absl::NotFoundError(
      "no rank in the environment (CXLRT_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or "
      "RANK): pass the rank and size");
}

Communicator::Impl::Impl(allocator::Allocator& alloc, std::string name, int nranks, int rank,
                         const CommOptions& options)
    : alloc_(alloc),
      pool_(alloc.pool()),
      c_(alloc.pool().coherence()),
      name_(std::move(name)),
      nranks_(nranks),
      rank_(rank),
      options_{.timeout = options.timeout.value_or(absl::Milliseconds(kCommTimeoutMs.Get())),
               .slot_bytes = options.slot_bytes.value_or(kCommSlotBytes.Get()),
               .depth = options.depth.value_or(kCommDepth.Get()),
               .chunk_bytes = options.chunk_bytes.value_or(kCommChunkBytes.Get()),
               .p2p_bytes = options.p2p_bytes.value_or(kCommP2pBytes.Get()),
               .oneshot_max = options.oneshot_max.value_or(kAllreduceOneshotMax.Get()),
               .engine = options.engine,
               .asynchronous = options.asynchronous} {
  // Slots set nowhere: on a machine with a GPU, those that make ChunkBytes
  // cut GPU-sized chunks (rank 0's choice holds for every rank).
  if (!options.slot_bytes && !kCommSlotBytes.IsSet() && gpu::GpuAvailable()) {
    options_.slot_bytes = algorithms::kGpuSlotBytes;
  }
  if (options_.p2p_bytes == 0) options_.p2p_bytes = DefaultP2pBytes(pool_.size(), nranks);
  options_.slot_bytes = RoundUp(options_.slot_bytes, 64);
  options_.p2p_bytes = RoundUp(options_.p2p_bytes, kP2pAlign);
  watch_ = std::make_unique<PeerWatch>(*this);
  cpu_engine_ = MakeCpuEngine(c_);
  // More ranks than cores (emulated hosts on one machine): a waiter that
  // spins holds the core its peer needs, so it yields at once, as Open MPI
  // does when oversubscribed (mpi_yield_when_idle). 8-64 B all-reduce at 4
  // ranks on 2 vCPUs, medians of 5 interleaved rounds: 5.4 us after 50
  // spins (about 2.5 us of pause), 3.6-3.8 us with none, Open MPI 3.6
  // (docs/collectives.md, "Small calls").
  if (static_cast<unsigned>(nranks) > std::max(1u, std::thread::hardware_concurrency())) {
    spins_ = 0;
  }
  sent_.assign(nranks, 0);
  received_.assign(nranks, 0);
}

}  // namespace cxlrt::collectives
