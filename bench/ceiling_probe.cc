#include "bench/ceiling_probe.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/harness.h"
#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/affinity.h"
#include "cxlrt/runtime/coherence.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

constexpr int kRanks = 2;

// The shared memfd: per rank, flags on their own lines, then two slots
// per phase (double-buffered by chunk parity).
struct alignas(64) Flag {
  std::atomic<uint64_t> v;
  char pad[56];
};
struct Shared {
  Flag posted_a[kRanks], read_a[kRanks], posted_b[kRanks], read_b[kRanks];
  Flag wrong[kRanks];
};

// The peer gets this long to move a flag; past it, it is dead or stuck.
constexpr int64_t kPeerTimeoutNs = 30'000'000'000;

// Spins until f >= v; false when the peer has not moved it in time.
bool SpinUntil(const std::atomic<uint64_t>& f, uint64_t v) {
  int64_t deadline = 0;
  for (uint64_t i = 0; f.load(std::memory_order_acquire) < v; ++i) {
    __builtin_ia32_pause();
    if ((i & 0xffff) == 0) {
      const int64_t now = runtime::NowNs();
      if (deadline == 0) deadline = now + kPeerTimeoutNs;
      if (now > deadline) return false;
    }
  }
  return true;
}

// One rank's run over every size. Returns its per-size median times (ns);
// empty when the peer stopped answering.
std::vector<double> RunProbeRank(const CeilingOptions& o, int r, Shared* sh, uint8_t* slots,
                                 const std::vector<uint64_t>& sizes) {
  const int peer = 1 - r;
  const size_t chunk = o.chunk_bytes;
  auto slot = [&](char phase, int rank, uint64_t k) {
    return slots + ((rank * 2 + (phase == 'B')) * 2 + (k & 1)) * chunk;
  };
  const size_t max_elems = o.max_bytes / 4;
  std::vector<float> in(max_elems), out(max_elems);
  uint64_t k = 0;  // chunks so far: the flags' value
  std::vector<double> times;
  for (uint64_t bytes : sizes) {
    const size_t count = bytes / 4;
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r + 1) * (i % 7));
    std::vector<double> samples;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      const int64_t t0 = runtime::NowNs();
      for (size_t first = 0; first < count; first += chunk / 4) {
        ++k;
        const size_t m = std::min(chunk / 4, count - first);
        const size_t lo = m * r / kRanks, hi = m * (r + 1) / kRanks;
        const size_t plo = m * peer / kRanks, phi = m * (peer + 1) / kRanks;
        // A: the peer's shard of our chunk into our slot; reduce our shard.
        if (k > 2 && !SpinUntil(sh->read_a[peer].v, k - 2)) return {};
        runtime::NonTemporalCopy(slot('A', r, k) + plo * 4, in.data() + first + plo,
                                 (phi - plo) * 4);
        sh->posted_a[r].v.store(k, std::memory_order_release);
        if (!SpinUntil(sh->posted_a[peer].v, k)) return {};
        const void* srcs[2];
        srcs[r] = in.data() + first + lo;
        srcs[peer] = slot('A', peer, k) + lo * 4;
        collectives::Reduce(collectives::DataType::kFloat32, collectives::RedOp::kSum,
                            out.data() + first + lo, srcs, kRanks, hi - lo, kRanks);
        sh->read_a[r].v.store(k, std::memory_order_release);
        // B: our reduced shard out; the peer's in.
        if (k > 2 && !SpinUntil(sh->read_b[peer].v, k - 2)) return {};
        runtime::NonTemporalCopy(slot('B', r, k), out.data() + first + lo, (hi - lo) * 4);
        sh->posted_b[r].v.store(k, std::memory_order_release);
        if (!SpinUntil(sh->posted_b[peer].v, k)) return {};
        runtime::CopyBytes(out.data() + first + plo, slot('B', peer, k), (phi - plo) * 4);
        sh->read_b[r].v.store(k, std::memory_order_release);
      }
      if (it >= o.warmup) samples.push_back(static_cast<double>(runtime::NowNs() - t0));
    }
    uint64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != static_cast<float>(3 * (i % 7));
    sh->wrong[r].v.fetch_add(wrong);
    times.push_back(Summarize(samples).median);
  }
  return times;
}

}  // namespace

int RunCeilingProbe(const CeilingOptions& o) {
  if (o.min_bytes < 64 || o.min_bytes > o.max_bytes || o.factor < 2 || o.iters < 1 ||
      o.chunk_bytes < 4096 || o.chunk_bytes % 64 != 0) {
    std::fprintf(stderr,
                 "cxlrt bench ceiling: need 64 <= -b <= -e, -f >= 2, -n >= 1, "
                 "a chunk of 4 KiB or more in multiples of 64 B\n");
    return 1;
  }
  std::vector<uint64_t> sizes;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes; b = std::max<uint64_t>(b + 1, b * o.factor)) {
    sizes.push_back(b / 64 * 64);
    if (b == o.max_bytes) break;
  }
  const CopyLimits limits = MeasureCopyLimits(64 << 20, 5);
  auto plan = runtime::PlanAffinity(kRanks, runtime::AffinitySetting());
  if (!plan.ok()) {
    std::fprintf(stderr, "cxlrt bench ceiling: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  const size_t shared_bytes = sizeof(Shared) + kRanks * 2 * 2 * o.chunk_bytes + 4096;
  const int fd = memfd_create("cxlrt-ceiling", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(shared_bytes)) != 0) {
    std::fprintf(stderr, "cxlrt bench ceiling: memfd: %s\n", strerror(errno));
    return 1;
  }
  void* map = mmap(nullptr, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    std::fprintf(stderr, "cxlrt bench ceiling: mmap: %s\n", strerror(errno));
    return 1;
  }
  auto* sh = new (map) Shared{};
  auto* slots = static_cast<uint8_t*>(map) + ((sizeof(Shared) + 4095) / 4096) * 4096;
  // Rank 1 in a child; rank 0 here. Each reports its median times through
  // a pipe.
  int pipefd[2];
  if (pipe(pipefd) != 0) return 1;
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    close(pipefd[0]);
    if (!plan->cores.empty()) (void)runtime::BindToCore(plan->cores[1]);
    std::vector<double> t = RunProbeRank(o, 1, sh, slots, sizes);
    const ssize_t w = write(pipefd[1], t.data(), t.size() * sizeof(double));
    _exit(!t.empty() && w == static_cast<ssize_t>(t.size() * sizeof(double)) ? 0 : 1);
  }
  close(pipefd[1]);
  if (!plan->cores.empty()) (void)runtime::BindToCore(plan->cores[0]);
  std::vector<double> t0 = RunProbeRank(o, 0, sh, slots, sizes);
  if (t0.empty()) kill(child, SIGKILL);  // it stopped answering: no result to wait for
  std::vector<double> t1(sizes.size());
  const ssize_t got = read(pipefd[0], t1.data(), t1.size() * sizeof(double));
  close(pipefd[0]);
  int status = 0;
  waitpid(child, &status, 0);
  // The binding is undone for whatever this process runs next.
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  (void)sched_setaffinity(0, sizeof(all), &all);
  const uint64_t wrong = sh->wrong[0].v + sh->wrong[1].v;
  munmap(map, shared_bytes);
  if (t0.empty() || got != static_cast<ssize_t>(t1.size() * sizeof(double)) || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "cxlrt bench ceiling: rank 1 failed or did not answer for %lld s\n",
                 static_cast<long long>(kPeerTimeoutNs / 1000000000));
    return 1;
  }
  if (!o.json) {
    std::printf(
        "# cxlrt bench ceiling: 2-rank two-shot float sum over a memfd, %lu B chunks, "
        "%d warm-up + %d timed iterations (medians)\n",
        static_cast<unsigned long>(o.chunk_bytes), o.warmup, o.iters);
    std::printf(
        "# copy limits (one thread, 64 MiB): memcpy %.2f, vector %.2f, non-temporal %.2f "
        "GB/s; two threads %.2f GB/s\n",
        limits.memcpy, limits.vector, limits.nontemporal, limits.two_threads);
    std::printf("# affinity: %s\n", plan->why.c_str());
    std::printf("#%11s %9s %7s %7s\n", "size (B)", "time (us)", "algbw", "busbw");
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double ns = std::max(t0[i], t1[i]);
    const double algbw = static_cast<double>(sizes[i]) / ns;
    const double busbw = algbw * 2.0 * (kRanks - 1) / kRanks;
    if (o.json) {
      nlohmann::json j = {{"collective", "allreduce"},
                          {"ranks", kRanks},
                          {"bytes", sizes[i]},
                          {"time_us", ns / 1e3},
                          {"algbw_gbps", algbw},
                          {"busbw_gbps", busbw},
                          {"chunk_bytes", o.chunk_bytes},
                          {"memcpy_gbps", limits.memcpy},
                          {"best_copy_gbps", limits.best_single}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%12lu %9.2f %7.2f %7.2f\n", static_cast<unsigned long>(sizes[i]), ns / 1e3,
                  algbw, busbw);
    }
  }
  if (wrong != 0) {
    std::fprintf(stderr, "cxlrt bench ceiling: %lu wrong elements\n",
                 static_cast<unsigned long>(wrong));
    return 1;
  }
  return 0;
}

}  // namespace cxlrt::bench
