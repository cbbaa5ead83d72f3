#include "bench/pods_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/pods/pod_communicator.h"
#include "cxlrt/pods/pool_engine.h"
#include "cxlrt/runtime/coherence.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using collectives::Communicator;
using collectives::DataType;
using collectives::RedOp;
using pods::InterPodEngine;
using pods::MultiPodCommunicator;

// The engines this benchmark can put between pods, by name. An engine
// that needs more than the interconnect pool (Open MPI) adds its case here.
absl::StatusOr<std::unique_ptr<InterPodEngine>> MakeEngine(const std::string& engine,
                                                           allocator::Allocator& interconnect,
                                                           const std::string& name, int n, int r) {
  if (engine == "pool") return pods::MakePoolEngine(interconnect, name, n, r);
  return absl::InvalidArgumentError(
      absl::StrCat("--engine ", engine, " is not an engine of this benchmark (engines: pool)"));
}

int PodOf(int w, int n, int p) {
  for (int q = 0; q < p; ++q) {
    if (w < (q + 1) * n / p) return q;
  }
  return p - 1;
}

// Seconds per call of `fn` over `iters` calls after `warmup`, the slowest
// rank's (every rank of `flat` takes part).
absl::StatusOr<double> Time(
    Communicator& flat, int warmup, int iters, const std::function<absl::Status()>& fn,
    const std::function<void()>& after_warmup = [] {}) {
  for (int i = 0; i < warmup; ++i) {
    absl::Status s = fn();
    if (!s.ok()) return s;
  }
  after_warmup();
  absl::Status s = flat.Barrier();
  if (!s.ok()) return s;
  const int64_t t0 = runtime::NowNs();
  for (int i = 0; i < iters; ++i) {
    s = fn();
    if (!s.ok()) return s;
  }
  double secs = static_cast<double>(runtime::NowNs() - t0) * 1e-9 / iters, worst = 0;
  s = flat.AllReduce(&secs, &worst, 1, DataType::kFloat64, RedOp::kMax);
  if (!s.ok()) return s;
  return worst;
}

int RunRank(const PodsBenchOptions& o, const std::vector<std::string>& pod_uris,
            const std::string& ic_uri, int w) {
  const int n = o.ranks, p = PodOf(w, n, o.pods);
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "cxlrt bench pods: rank %d: %s: %s\n", w, what.c_str(),
                 s.ToString().c_str());
    return 1;
  };
  auto pod_host = AttachHost(pod_uris[p], AnySlot());
  if (!pod_host.ok()) return fail("pod pool", pod_host.status());
  auto ic_host = AttachHost(ic_uri, AnySlot());
  if (!ic_host.ok()) return fail("interconnect pool", ic_host.status());
  auto world = MakeEngine(o.engine, *ic_host->alloc, "bench-world", n, w);
  if (!world.ok()) return fail("engine", world.status());
  pods::PodOptions po;
  po.chunk_bytes = o.chunk_bytes;
  auto hier = MultiPodCommunicator::Create(*pod_host->alloc, "bench", *std::move(world), {}, po);
  if (!hier.ok()) return fail("hierarchical communicator", hier.status());
  MultiPodCommunicator& h = **hier;
  // One pool holding every rank: the interconnect pool, as fast as a pod's
  // pool here (on a rack it is the slower one).
  auto flat = Communicator::Create(*ic_host->alloc, "bench-flat", n, w);
  if (!flat.ok()) return fail("one-pool communicator", flat.status());
  // Each tier alone: the pod's pool communicator, and this rank's rail over
  // a second engine of the same kind.
  auto pod_only = Communicator::Create(*pod_host->alloc, "bench-pod", h.pod_size(), h.local_rank());
  if (!pod_only.ok()) return fail("pod communicator", pod_only.status());
  auto probe = MakeEngine(o.engine, *ic_host->alloc, "bench-probe", n, w);
  if (!probe.ok()) return fail("probe engine", probe.status());
  auto rail = (*probe)->Split(h.local_rank(), h.pod(), absl::Now() + absl::Seconds(60));
  if (!rail.ok()) return fail("probe rail", rail.status());
  const int m = h.layout().min_pod_size;

  if (w == 0 && !o.json) {
    std::printf("# cxlrt bench pods: %d ranks in %d pods (sizes", n, h.npods());
    for (int s : h.layout().pod_sizes) std::printf(" %d", s);
    std::printf("), %s, engine %s, float sum, times per call (the slowest rank)\n",
                o.collective.c_str(), o.engine.c_str());
    std::printf(
        "# hier: the hierarchical collective; one-pool: all ranks in one pool; pod/engine:\n"
        "# rank 0's time in pod steps and waiting for the engine within hier; pod alone:\n"
        "# the same collective in one pod's pool (same bytes per rank); rail alone (all-reduce\n"
        "# only): the engine all-reduce of one shard (bytes / %d) across the pods\n",
        m);
    std::printf("%12s %11s %11s %9s %11s %11s %11s %11s %7s %7s\n", "bytes", "hier", "one-pool",
                "one/hier", "pod", "engine", "pod alone", "rail alone", "bound", "#wrong");
  }
  const std::string& coll = o.collective;
  const bool all_reduce = coll == "allreduce";
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = std::max<uint64_t>(bytes + 1, bytes * o.factor)) {
    // nccl-tests' sizes: `bytes` is the larger buffer of a rank.
    const size_t total = bytes / sizeof(float), block = total / n;
    std::vector<float> in(total, static_cast<float>(h.rank() + 1)), out(total);
    // One call of the collective on a communicator of either kind, with
    // `ranks` ranks (the per-rank block stays `block`).
    auto call = [&](auto& c, int ranks) -> absl::Status {
      float *a = in.data(), *b = out.data();
      const auto f = DataType::kFloat32;
      if (coll == "allreduce") return c.AllReduce(a, b, total, f, RedOp::kSum);
      if (coll == "reducescatter") return c.ReduceScatter(a, b, block, f, RedOp::kSum);
      if (coll == "allgather") return c.AllGather(a, b, block, f);
      if (coll == "broadcast") return c.Broadcast(a, b, total, f, 0);
      if (coll == "reduce") return c.Reduce(a, b, total, f, RedOp::kSum, 0);
      (void)ranks;
      return c.AllToAll(a, b, block, f);
    };
    auto th = Time(
        **flat, o.warmup, o.iters, [&] { return call(h, n); }, [&] { h.ResetTierTimes(); });
    if (!th.ok()) return fail("hier", th.status());
    const pods::TierTimes tt = h.tier_times();
    const int calls = o.iters;
    // What rank r holds now (every input element of rank j is j + 1).
    uint64_t wrong = 0;
    const float sum = static_cast<float>(n) * (n + 1) / 2;
    if (coll == "allreduce" || (coll == "reduce" && h.rank() == 0)) {
      for (size_t i = 0; i < total; ++i) wrong += out[i] != sum;
    } else if (coll == "reducescatter") {
      for (size_t i = 0; i < block; ++i) wrong += out[i] != sum;
    } else if (coll == "broadcast") {
      for (size_t i = 0; i < total; ++i) wrong += out[i] != 1.0f;
    } else if (coll == "allgather" || coll == "alltoall") {
      for (size_t i = 0; i < n * block; ++i) wrong += out[i] != static_cast<float>(i / block + 1);
    }
    auto tf = Time(**flat, o.warmup, o.iters, [&] { return call(**flat, n); });
    if (!tf.ok()) return fail("one-pool", tf.status());
    auto tp = Time(**flat, o.warmup, o.iters, [&]() -> absl::Status {
      if (!all_reduce) return call(**pod_only, h.pod_size());
      return (*pod_only)->AllReduce(in.data(), out.data(), total, DataType::kFloat32, RedOp::kSum);
    });
    if (!tp.ok()) return fail("pod alone", tp.status());
    const size_t shard = total / m;
    auto tr = Time(**flat, o.warmup, o.iters, [&]() -> absl::Status {
      if (!all_reduce || h.local_rank() >= m || shard == 0) return absl::OkStatus();
      auto t = (*rail)->AllReduce(in.data(), out.data(), shard, DataType::kFloat32, RedOp::kSum);
      if (!t.ok()) return t.status();
      return (*rail)->Wait(*t, absl::Now() + absl::Seconds(60));
    });
    if (!tr.ok()) return fail("rail alone", tr.status());
    uint64_t all_wrong = 0;
    (void)(*flat)->AllReduce(&wrong, &all_wrong, 1, DataType::kUint64, RedOp::kSum);
    if (w == 0) {
      const double pod_us = absl::ToDoubleMicroseconds(tt.pod) / calls;
      const double eng_us = absl::ToDoubleMicroseconds(tt.engine_wait) / calls;
      const char* bound = !all_reduce ? "-" : *tp >= *tr ? "pod" : "engine";
      if (o.json) {
        nlohmann::json j = {{"collective", coll},
                            {"bytes", bytes},
                            {"ranks", n},
                            {"pods", h.npods()},
                            {"engine", o.engine},
                            {"hier_us", *th * 1e6},
                            {"one_pool_us", *tf * 1e6},
                            {"one_pool_over_hier", *tf / *th},
                            {"pod_step_us", pod_us},
                            {"engine_wait_us", eng_us},
                            {"pod_alone_us", *tp * 1e6},
                            {"bound", bound},
                            {"wrong", all_wrong}};
        if (all_reduce) j["rail_alone_us"] = *tr * 1e6;
        std::printf("%s\n", j.dump().c_str());
      } else {
        const std::string rail_us = all_reduce ? absl::StrFormat("%.1f", *tr * 1e6) : "-";
        std::printf("%12llu %11.1f %11.1f %9.2f %11.1f %11.1f %11.1f %11s %7s %7llu\n",
                    static_cast<unsigned long long>(bytes), *th * 1e6, *tf * 1e6, *tf / *th, pod_us,
                    eng_us, *tp * 1e6, rail_us.c_str(), bound,
                    static_cast<unsigned long long>(all_wrong));
      }
      std::fflush(stdout);
    }
    if (all_wrong != 0) return 1;
    if (bytes == o.max_bytes) break;
  }
  rail->reset();
  probe->reset();
  (void)(*pod_only)->Destroy();
  (void)(*flat)->Destroy();
  return (*hier)->Destroy().ok() ? 0 : 1;
}

}  // namespace

int RunPodsBench(const PodsBenchOptions& o) {
  if (o.pods < 1 || o.ranks < o.pods || o.ranks > 64) {
    std::fprintf(stderr, "cxlrt bench pods: need 1 <= --pods <= --ranks <= 64\n");
    return 1;
  }
  const std::string colls[] = {"allreduce", "reducescatter", "allgather",
                               "broadcast", "reduce",        "alltoall"};
  if (std::find(std::begin(colls), std::end(colls), o.collective) == std::end(colls)) {
    std::fprintf(stderr,
                 "cxlrt bench pods: --collective %s is not one of allreduce, reducescatter, "
                 "allgather, broadcast, reduce, alltoall\n",
                 o.collective.c_str());
    return 1;
  }
  if (o.engine != "pool") {
    std::fprintf(stderr,
                 "cxlrt bench pods: --engine %s is not an engine of this benchmark "
                 "(engines: pool)\n",
                 o.engine.c_str());
    return 1;
  }
  const uint64_t slots = uint64_t{collectives::kCommDepth.Get()} *
                         std::max<uint64_t>(collectives::kCommSlotBytes.Get(), 4 << 20);
  const uint64_t per_rank = (8ull << 20) + 2 * slots;
  std::vector<std::unique_ptr<ScratchPool>> pools;
  std::vector<std::string> pod_uris;
  for (int p = 0; p <= o.pods; ++p) {  // the pods', then the interconnect pool
    auto s = ScratchPool::Create(absl::StrCat("emu://bench-pods-", getpid(), "-", p),
                                 (128ull << 20) + o.ranks * per_rank * (p == o.pods ? 3 : 1));
    if (!s.ok()) {
      std::fprintf(stderr, "cxlrt bench pods: %s\n", s.status().ToString().c_str());
      return 1;
    }
    pod_uris.push_back((*s)->open_uri());
    pools.push_back(*std::move(s));
  }
  const std::string ic_uri = pod_uris.back();
  pod_uris.pop_back();
  return RunForkedRanks(o.ranks, {}, [&](int w) { return RunRank(o, pod_uris, ic_uri, w); });
}

}  // namespace cxlrt::bench
