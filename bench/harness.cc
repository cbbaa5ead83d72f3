#include "bench/harness.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlrt/runtime/affinity.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::bench {

Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Summary s;
  s.samples = static_cast<int>(v.size());
  s.min = v.front();
  s.max = v.back();
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

std::vector<double> Repeat(int reps, const std::function<double()>& fn) {
  std::vector<double> out;
  for (int i = 0; i < reps; ++i) out.push_back(fn());
  return out;
}

void Prefault(void* p, size_t n) { std::memset(p, 0, n); }

Summary MeasureMemcpy(size_t bytes, int reps) {
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  Prefault(a.get(), bytes);
  Prefault(b.get(), bytes);
  std::memcpy(b.get(), a.get(), bytes);  // warm
  return Summarize(Repeat(reps, [&] {
    const int64_t t0 = runtime::NowNs();
    std::memcpy(b.get(), a.get(), bytes);
    const int64_t t1 = runtime::NowNs();
    asm volatile("" : : "r"(b.get()) : "memory");
    return static_cast<double>(bytes) / static_cast<double>(t1 - t0);
  }));
}

namespace {

// GB/s of `copy` over buffers of `bytes`, repeated to fill a millisecond.
template <typename Copy>
double CopyRate(size_t bytes, int reps, Copy&& copy) {
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  Prefault(a.get(), bytes);
  Prefault(b.get(), bytes);
  copy(b.get(), a.get(), bytes);  // warm
  const int inner = static_cast<int>(std::max<size_t>(1, (4u << 20) / std::max<size_t>(bytes, 1)));
  return Summarize(Repeat(reps,
                          [&] {
                            const int64_t t0 = runtime::NowNs();
                            for (int i = 0; i < inner; ++i) {
                              copy(b.get(), a.get(), bytes);
                              asm volatile("" : : "r"(b.get()) : "memory");
                            }
                            const int64_t t1 = runtime::NowNs();
                            return static_cast<double>(bytes) * inner /
                                   static_cast<double>(t1 - t0);
                          }))
      .median;
}

void Memcpy(void* d, const void* s, size_t n) { std::memcpy(d, s, n); }

}  // namespace

CopyLimits MeasureCopyLimits(size_t bytes, int reps) {
  CopyLimits l;
  l.memcpy = CopyRate(bytes, reps, Memcpy);
  l.vector = CopyRate(bytes, reps, runtime::CopyBytes);
  l.nontemporal = CopyRate(bytes, reps, runtime::NonTemporalCopy);
  l.best_single = std::max({l.memcpy, l.vector, l.nontemporal});
  // Two threads at once, each with its own buffers, each with its best copy.
  auto(*best)(void*, const void*, size_t) =
      l.nontemporal >= l.vector ? runtime::NonTemporalCopy : runtime::CopyBytes;
  double rate[2] = {0, 0};
  std::thread other([&] { rate[1] = CopyRate(bytes, reps, best); });
  rate[0] = CopyRate(bytes, reps, best);
  other.join();
  l.two_threads = rate[0] + rate[1];
  return l;
}

double BestCopyGbps(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  return std::max(CopyRate(bytes, 3, runtime::CopyBytes),
                  CopyRate(bytes, 3, runtime::NonTemporalCopy));
}

std::string FormatGbps(double gbps) { return absl::StrFormat("%.2f GB/s", gbps); }

std::string FormatNs(double ns) {
  if (ns >= 10000) return absl::StrFormat("%.1f us", ns / 1000);
  if (ns >= 1000) return absl::StrFormat("%.2f us", ns / 1000);
  return absl::StrFormat("%.0f ns", ns);
}

ScratchPool::ScratchPool(runtime::PoolUri uri, std::unique_ptr<runtime::Pool> pool)
    : uri_(std::move(uri)), open_uri_(uri_.ForOpeners()), pool_(std::move(pool)) {}

ScratchPool::~ScratchPool() {
  pool_.reset();
  (void)runtime::Pool::Destroy(open_uri_, {.force = true});
}

absl::StatusOr<std::unique_ptr<ScratchPool>> ScratchPool::Create(const std::string& text,
                                                                 uint64_t default_size) {
  auto uri = runtime::ParsePoolUri(text);
  if (!uri.ok()) return uri.status();
  if (!uri->size) uri->size = default_size;
  auto pool = runtime::Pool::Create(uri->ToString());
  if (!pool.ok()) {
    if (pool.status().code() == absl::StatusCode::kAlreadyExists) {
      return absl::AlreadyExistsError(
          absl::StrCat(pool.status().message(),
                       " (the benchmark makes its own pool: name one that does not exist)"));
    }
    return pool.status();
  }
  return std::unique_ptr<ScratchPool>(new ScratchPool(*uri, std::move(*pool)));
}

absl::StatusOr<AttachedHost> AttachHost(const std::string& uri,
                                        const runtime::AttachOptions& attach,
                                        const allocator::AllocatorOptions& options) {
  AttachedHost h;
  CXLRT_ASSIGN_OR_RETURN(h.pool, runtime::Pool::Open(uri));
  CXLRT_ASSIGN_OR_RETURN(h.membership, runtime::Membership::Attach(*h.pool, attach));
  CXLRT_ASSIGN_OR_RETURN(h.alloc, allocator::Allocator::Open(*h.pool, *h.membership, options));
  return h;
}

runtime::AttachOptions AnySlot() {
  runtime::AttachOptions ao;
  ao.host_id = -1;
  return ao;
}

int RunForkedRanks(int ranks, const std::vector<int>& cores,
                   const std::function<int(int rank)>& rank_main) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (static_cast<size_t>(r) < cores.size()) (void)runtime::BindToCore(cores[r]);
      const int rc = rank_main(r);
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int result = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) result = 1;
  }
  return result;
}

}  // namespace cxlrt::bench
