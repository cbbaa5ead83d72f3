// What every cxlrt benchmark shares: repetitions summarised as median and
// spread, and this machine's memcpy bandwidth measured in the same run, so
// that results read as fractions of the machine's limit.
// Thread-safety: plain functions; call from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::bench {

struct Summary {
  double median = 0, min = 0, max = 0;
  int samples = 0;
};

// Median, min and max of `values`. REQUIRES: not empty.
Summary Summarize(std::vector<double> values);

// Runs `fn` `reps` times and returns what each call returned.
std::vector<double> Repeat(int reps, const std::function<double()>& fn);

// This machine's single-thread memcpy bandwidth in GB/s (10^9 B/s, bytes
// copied per second) between two pre-faulted buffers of `bytes`, over `reps`
// repetitions.
Summary MeasureMemcpy(size_t bytes = 64 << 20, int reps = 7);

// The copy rates a data path on this machine is held against, in GB/s
// (bytes copied per second), between pre-faulted buffers of `bytes`:
// glibc's memcpy, the vector copy of the data paths (runtime::CopyBytes),
// the non-temporal copy (runtime::NonTemporalCopy), the best of these on
// one thread, and two threads copying at once (their sum).
struct CopyLimits {
  double memcpy = 0, vector = 0, nontemporal = 0, best_single = 0, two_threads = 0;
};
CopyLimits MeasureCopyLimits(size_t bytes = 64 << 20, int reps = 5);

// The best single-thread copy rate at `bytes` (in cache when it fits):
// the better of the vector and the non-temporal copy, median of a few runs
// of at least a millisecond each.
double BestCopyGbps(size_t bytes);

// "14.2 GB/s", "712 ns", "1.41 us".
std::string FormatGbps(double gbps);
std::string FormatNs(double ns);

// A pool a benchmark makes for itself from `uri` (size= defaulted), so it
// never writes into a pool in use; destroyed with the object.
class ScratchPool {
 public:
  // kAlreadyExists (with a hint) when `uri` names an existing pool.
  static absl::StatusOr<std::unique_ptr<ScratchPool>> Create(const std::string& uri,
                                                             uint64_t default_size);
  ~ScratchPool();
  runtime::Pool& pool() { return *pool_; }
  const runtime::PoolUri& uri() const { return uri_; }
  // What the benchmark's other hosts open.
  const std::string& open_uri() const { return open_uri_; }

 private:
  ScratchPool(runtime::PoolUri uri, std::unique_ptr<runtime::Pool> pool);
  runtime::PoolUri uri_;
  std::string open_uri_;
  std::unique_ptr<runtime::Pool> pool_;
};

// Pre-faults [p, p+n) (page faults cost 11-16 us each in our VMs).
void Prefault(void* p, size_t n);

// This process attached to a pool as a host: its own mapping, membership
// and allocator (destroyed in reverse order).
struct AttachedHost {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
};
// Opens `uri`, attaches with `attach` and opens the allocator.
absl::StatusOr<AttachedHost> AttachHost(const std::string& uri,
                                        const runtime::AttachOptions& attach,
                                        const allocator::AllocatorOptions& options = {});
// Attach options for any free slot (benchmarks that start their own hosts).
runtime::AttachOptions AnySlot();

// Forks `ranks` processes; rank r runs rank_main(r) (bound to cores[r]
// when `cores` has an entry for it) and exits with its result. Returns 0
// when every rank exited 0, else 1. Flushes stdio first, so no buffered
// output is printed twice.
int RunForkedRanks(int ranks, const std::vector<int>& cores,
                   const std::function<int(int rank)>& rank_main);

}  // namespace cxlrt::bench
