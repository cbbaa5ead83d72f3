#include "bench/alltoallv_bench.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/harness.h"
#include "bench/moe_routing.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/runtime/affinity.h"
#include "cxlrt/runtime/coherence.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using collectives::Communicator;
using collectives::DataType;
using collectives::RedOp;
using runtime::NowNs;

// The splits of one run: m[i * n + j] tokens from rank i to rank j.
struct Routing {
  int n = 0;
  std::vector<uint64_t> m;
  uint64_t at(int i, int j) const { return m[size_t(i) * n + j]; }
  uint64_t Sent(int i) const {  // to its peers
    uint64_t t = 0;
    for (int j = 0; j < n; ++j) t += j == i ? 0 : at(i, j);
    return t;
  }
  uint64_t Received(int j) const {  // from its peers
    uint64_t t = 0;
    for (int i = 0; i < n; ++i) t += i == j ? 0 : at(i, j);
    return t;
  }
  // Tokens the busiest rank sends to or receives from its peers.
  uint64_t Busiest() const {
    uint64_t b = 0;
    for (int r = 0; r < n; ++r) b = std::max({b, Sent(r), Received(r)});
    return b;
  }
};

struct Phase {
  const char* name;
  std::vector<double> us;  // per iteration, the slowest rank's
  uint64_t wrong = 0;
  double posts = 0;  // per call
};

// Buffers of `bytes`: from the pool (posted in place) or private, pre-faulted.
uint8_t* Buffer(Communicator& comm, bool in_pool, size_t bytes, std::string& err) {
  bytes = std::max<size_t>(bytes, 64);
  if (in_pool) {
    auto p = comm.Allocate(bytes);
    if (!p.ok()) {
      err = "a pool buffer of " + absl::StrCat(bytes) + " bytes: " + p.status().ToString();
      return nullptr;
    }
    Prefault(*p, bytes);
    return static_cast<uint8_t*>(*p);
  }
  void* a = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (a == MAP_FAILED) {
    err = "mmap of " + absl::StrCat(bytes) + " bytes failed";
    return nullptr;
  }
  return static_cast<uint8_t*>(a);
}

// One rank's run; rank 0 prints. Returns 0 on success.
int RunRank(const AllToAllVBenchOptions& o, const Routing& route, const std::string& uri, int rank,
            const CopyLimits& limits, const std::string& affinity) {
  const int n = route.n;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "cxlrt bench alltoallv: rank %d: %s\n", rank, what.c_str());
    return 1;
  };
  auto host = AttachHost(uri, AnySlot());
  if (!host.ok()) return fail(host.status().ToString());
  auto comm = Communicator::Create(*host->alloc, "bench/alltoallv", n, rank);
  if (!comm.ok()) return fail(comm.status().ToString());
  Communicator& cm = **comm;

  // Tokens to rank j sit together, in rank order (as an MoE layer permutes
  // them before the dispatch); counts in bf16 elements.
  const size_t h = size_t(o.hidden), es = 2;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = route.at(rank, j) * h;
    sd[j] = stotal;
    stotal += sc[j];
    rc[j] = route.at(j, rank) * h;
    rd[j] = rtotal;
    rtotal += rc[j];
  }
  std::string err;
  uint8_t* tokens = Buffer(cm, o.in_pool, stotal * es, err);    // the dispatch's input
  uint8_t* experts = Buffer(cm, o.in_pool, rtotal * es, err);   // its output, the combine's input
  uint8_t* combined = Buffer(cm, o.in_pool, stotal * es, err);  // the combine's output
  if (!tokens || !experts || !combined) return fail(err);
  auto* tok16 = reinterpret_cast<uint16_t*>(tokens);
  for (int j = 0; j < n; ++j) {
    for (uint64_t k = 0; k < route.at(rank, j); ++k) {
      for (size_t e = 0; e < h; ++e) tok16[sd[j] + k * h + e] = MoeValue(rank, j, k, e);
    }
  }
  auto dispatch = [&] {
    return cm.AllToAllV(tokens, sc, sd, experts, rc, rd, DataType::kBfloat16);
  };
  auto combine = [&] {
    return cm.AllToAllV(experts, rc, rd, combined, sc, sd, DataType::kBfloat16);
  };

  Phase phases[2] = {{"dispatch", {}}, {"combine", {}}};
  const std::vector<std::function<absl::Status()>> calls = {dispatch, combine};
  for (int w = 0; w < o.warmup; ++w) {
    for (const auto& call : calls) {
      if (absl::Status s = call(); !s.ok()) return fail(s.ToString());
    }
  }
  for (int p = 0; p < 2; ++p) phases[p].us.assign(o.iters, 0);
  uint64_t posts[2] = {0, 0};
  for (int it = 0; it < o.iters; ++it) {
    for (int p = 0; p < 2; ++p) {
      // Every rank starts the call together; the barrier's posts are not the call's.
      if (absl::Status s = cm.Barrier(); !s.ok()) return fail(s.ToString());
      const uint64_t before = cm.posts();
      const int64_t t0 = NowNs();
      if (absl::Status s = calls[p](); !s.ok()) return fail(s.ToString());
      phases[p].us[it] = static_cast<double>(NowNs() - t0) / 1e3;
      posts[p] += cm.posts() - before;
    }
  }
  if (o.check) {
    // A last pair into cleared outputs, then every element.
    std::memset(experts, 0, std::max<size_t>(rtotal * es, 1));
    std::memset(combined, 0, std::max<size_t>(stotal * es, 1));
    if (absl::Status s = dispatch(); !s.ok()) return fail(s.ToString());
    if (absl::Status s = combine(); !s.ok()) return fail(s.ToString());
    const auto* got = reinterpret_cast<const uint16_t*>(experts);
    for (int i = 0; i < n; ++i) {
      for (uint64_t k = 0; k < route.at(i, rank); ++k) {
        for (size_t e = 0; e < h; ++e) {
          phases[0].wrong += got[rd[i] + k * h + e] != MoeValue(i, rank, k, e);
        }
      }
    }
    phases[1].wrong = 0;
    const auto* back = reinterpret_cast<const uint16_t*>(combined);
    for (size_t e = 0; e < stotal; ++e) phases[1].wrong += back[e] != tok16[e];
  }
  for (Phase& p : phases) {
    std::vector<double> slowest(p.us.size());
    uint64_t wrong = 0;
    if (!cm.AllReduce(p.us.data(), slowest.data(), p.us.size(), DataType::kFloat64, RedOp::kMax)
             .ok() ||
        !cm.AllReduce(&p.wrong, &wrong, 1, DataType::kUint64, RedOp::kSum).ok()) {
      return fail("gathering the results failed");
    }
    p.us = std::move(slowest);
    p.wrong = wrong;
  }
  phases[0].posts = static_cast<double>(posts[0]) / o.iters;
  phases[1].posts = static_cast<double>(posts[1]) / o.iters;
  if (absl::Status s = cm.Destroy(); !s.ok()) return fail(s.ToString());
  if (rank != 0) return 0;

  const double token_bytes = static_cast<double>(h * es);
  const double busiest = static_cast<double>(route.Busiest()) * token_bytes;
  const uint64_t fingerprint = MoeFingerprint(route.m.data(), n);
  uint64_t wrong = 0;
  if (!o.json) {
    std::printf(
        "# cxlrt bench alltoallv: %d ranks, %d tokens x %d bf16 (%.0f B) per rank, top-%d of %d "
        "experts (%d per rank), skew %s, seed %lu, %s buffers, %d warm-up + %d timed calls each\n",
        n, o.tokens, o.hidden, token_bytes, o.topk, n * o.experts_per_rank, o.experts_per_rank,
        o.skew.c_str(), static_cast<unsigned long>(o.seed), o.in_pool ? "pool-resident" : "private",
        o.warmup, o.iters);
    std::printf(
        "# copy limits (one thread, 64 MiB, this run): memcpy %.2f, best single-thread %.2f GB/s; "
        "affinity: %s\n",
        limits.memcpy, limits.best_single, affinity.c_str());
    std::printf("# tokens per rank, sent to peers -> received from peers:");
    for (int r = 0; r < n; ++r) {
      std::printf(" %d: %lu -> %lu;", r, static_cast<unsigned long>(route.Sent(r)),
                  static_cast<unsigned long>(route.Received(r)));
    }
    std::printf(" routing fingerprint %016lx\n", static_cast<unsigned long>(fingerprint));
    std::printf(
        "# time: the slowest rank's per call (median, min, max of %d); GB/s: the busiest rank's "
        "bytes to or from its peers (%.2f MB) per median time\n",
        o.iters, busiest / 1e6);
    std::printf("#%9s %11s %11s %11s %8s %10s %10s %7s\n", "phase", "median(us)", "min(us)",
                "max(us)", "GB/s", "GB/s/memcpy", "posts/call", "#wrong");
  }
  for (Phase& p : phases) {
    const Summary s = Summarize(p.us);
    const double gbps = s.median > 0 ? busiest / (s.median * 1e3) : 0;
    wrong += p.wrong;
    if (o.json) {
      nlohmann::json j = {{"bench", "alltoallv"},
                          {"phase", p.name},
                          {"ranks", n},
                          {"tokens", o.tokens},
                          {"hidden", o.hidden},
                          {"experts_per_rank", o.experts_per_rank},
                          {"topk", o.topk},
                          {"skew", o.skew},
                          {"seed", o.seed},
                          {"in_pool", o.in_pool},
                          {"median_us", s.median},
                          {"min_us", s.min},
                          {"max_us", s.max},
                          {"busiest_bytes", busiest},
                          {"gbps", gbps},
                          {"posts_per_call", p.posts},
                          {"wrong", p.wrong},
                          {"fingerprint", absl::StrCat(absl::Hex(fingerprint, absl::kZeroPad16))},
                          {"memcpy_gbps", limits.memcpy},
                          {"best_copy_gbps", limits.best_single},
                          {"affinity", affinity}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%10s %11.1f %11.1f %11.1f %8.2f %10.2f %10.1f %7lu\n", p.name, s.median, s.min,
                  s.max, gbps, limits.memcpy > 0 ? gbps / limits.memcpy : 0.0, p.posts,
                  static_cast<unsigned long>(p.wrong));
    }
  }
  if (!o.json) std::printf("# wrong elements: %lu\n", static_cast<unsigned long>(wrong));
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int RunAllToAllVBench(const AllToAllVBenchOptions& o) {
  if (o.ranks < 1 || o.ranks > 64 || o.tokens < 0 || o.hidden < 1 || o.iters < 1 || o.warmup < 0) {
    std::fprintf(stderr,
                 "cxlrt bench alltoallv: need --ranks 1..64, --tokens >= 0, --hidden >= 1, "
                 "-n >= 1, -w >= 0\n");
    return 1;
  }
  Routing route;
  route.n = o.ranks;
  route.m.resize(size_t(o.ranks) * o.ranks);
  char err[256];
  if (MoeRoute(o.skew.c_str(), o.ranks, o.tokens, o.experts_per_rank, o.topk, o.seed,
               route.m.data(), err, sizeof(err)) != 0) {
    std::fprintf(stderr, "cxlrt bench alltoallv: %s\n", err);
    return 1;
  }
  // The limits, measured before any rank runs.
  const CopyLimits limits = MeasureCopyLimits(64 << 20, 5);
  // A rank's data slots (4 MiB each where a GPU is and none was set), its
  // lines, and its pool-resident buffers (tokens twice, what it receives).
  const uint64_t slots = uint64_t{collectives::kCommDepth.Get()} *
                         std::max<uint64_t>(collectives::kCommSlotBytes.Get(), 4 << 20);
  const uint64_t token_bytes = uint64_t(o.hidden) * 2;
  uint64_t size = (128ull << 20) + o.ranks * ((4ull << 20) + slots);
  if (o.in_pool) {
    for (int r = 0; r < o.ranks; ++r) {
      uint64_t sent = 0, received = 0;
      for (int j = 0; j < o.ranks; ++j) {
        sent += route.at(r, j);
        received += route.at(j, r);
      }
      size += (2 * sent + received) * token_bytes + (3ull << 20);
    }
  }
  size = (size + (2 << 20) - 1) / (2 << 20) * (2 << 20);  // pools come in 2 MiB units
  const std::string uri = o.pool.empty() ? absl::StrCat("emu://bench-a2av-", getpid()) : o.pool;
  auto scratch = ScratchPool::Create(uri, size);
  if (!scratch.ok()) {
    std::fprintf(stderr, "cxlrt bench alltoallv: %s\n", scratch.status().ToString().c_str());
    return 1;
  }
  auto plan = runtime::PlanAffinity(o.ranks, runtime::AffinitySetting());
  if (!plan.ok()) {
    std::fprintf(stderr, "cxlrt bench alltoallv: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  return RunForkedRanks(o.ranks, plan->cores, [&](int r) {
    return RunRank(o, route, (*scratch)->open_uri(), r, limits, plan->why);
  });
}

}  // namespace cxlrt::bench
