// The hierarchical all-reduce over the Open MPI engine beside flat Open
// MPI over the same ranks, with each tier beside its own limit, in one run
// (docs/collectives.md, "Beyond one pool"; bench/compare/pods.sh adds one
// pool holding every rank and Open MPI over shared memory):
//
//   cxlrt run --pods 2 -n 4 -- build/bin/cxlrt_bench_pods_mpi [-b 64K] [-e 64M]
//       [-f 4] [-n ITERS] [-w WARMUP] [--chunk BYTES] [--json]
//
// A program of its own rather than `cxlrt bench pods --engine mpi`: the
// cxlrt command stays free of MPI (it runs, and is installed, where Open
// MPI is not; MPI_Init's rules and libmpi stay out of every other
// subcommand), as cxlrt_bench_mpi_overlap does.
//
// Rows, float32 sum, each the slowest rank's mean time per call over ITERS
// (after WARMUP), every timed loop starting from an MPI_Barrier:
//   hier        MultiPodCommunicator::AllReduce, MPI between the pods
//   flat mpi    MPI_Allreduce over every rank, on the transport mpirun was
//               given (under cxlrt run: TCP over loopback, as the rails)
//   pod, engine rank 0's time in pod steps and waiting for the engine
//               within hier (TierTimes), per call
//   pod limit   one copy of the buffer at this machine's memcpy bandwidth
//               (bench/harness.h, measured in the run): a pod step moves at
//               least that through memory
//   pod alone   the pool all-reduce of the whole buffer in one pod
//   rail alone  MPI_Allreduce of one shard (bytes / pod size) over a rail:
//               the engine's own speed between pods, its limit
// Ratios: flat/hier (above 1: hier is faster), pod/limit and engine/rail
// (1.0: the tier runs at its limit; the larger one bounds the call).
// Exits 1 on a wrong result (every element is checked) or a failed call.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "bench/harness.h"
#include "cxlrt/cxlrt.h"
#include "cxlrt/pods/mpi_communicator.h"

namespace {

using cxlrt::collectives::DataType;
using cxlrt::collectives::RedOp;
using cxlrt::pods::MultiPodCommunicator;

struct Options {
  uint64_t min_bytes = 64 << 10, max_bytes = 64 << 20, factor = 4, chunk_bytes = 0;
  int iters = 10, warmup = 3;
  bool json = false;
};

bool ParseBytes(const char* s, uint64_t* out) {
  std::string t = s;
  uint64_t mult = 1;
  if (!t.empty() && (t.back() == 'K' || t.back() == 'k')) mult = 1 << 10;
  if (!t.empty() && (t.back() == 'M' || t.back() == 'm')) mult = 1 << 20;
  if (!t.empty() && (t.back() == 'G' || t.back() == 'g')) mult = 1 << 30;
  if (mult != 1) t.pop_back();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(t, &v) || v == 0) return false;
  *out = v * mult;
  return true;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto num = [&](int* out) { return v && absl::SimpleAtoi(v, out) && *out >= 0 && ++i; };
    if (a == "--json") {
      o->json = true;
    } else if (a == "-b" && v && ParseBytes(v, &o->min_bytes)) {
      ++i;
    } else if (a == "-e" && v && ParseBytes(v, &o->max_bytes)) {
      ++i;
    } else if (a == "-f" && v && absl::SimpleAtoi(v, &o->factor) && o->factor >= 2) {
      ++i;
    } else if (a == "--chunk" && v && ParseBytes(v, &o->chunk_bytes)) {
      ++i;
    } else if (a == "-n" && num(&o->iters) && o->iters > 0) {
    } else if (a == "-w" && num(&o->warmup)) {
    } else {
      std::fprintf(stderr, "cxlrt_bench_pods_mpi: bad argument %s%s%s\n", a.c_str(), v ? " " : "",
                   v ? v : "");
      return false;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    std::fprintf(stderr, "cxlrt_bench_pods_mpi: -b is above -e\n");
    return false;
  }
  return true;
}

// The slowest rank's mean seconds per call of `fn`.
absl::StatusOr<double> Time(int warmup, int iters, const std::function<absl::Status()>& fn,
                            const std::function<void()>& after_warmup = {}) {
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = fn(); !s.ok()) return s;
  }
  if (after_warmup) after_warmup();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = fn(); !s.ok()) return s;
  }
  double secs = (MPI_Wtime() - t0) / iters, worst = 0;
  MPI_Allreduce(&secs, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

absl::Status Mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  return absl::InternalError(std::string(what) + " failed with MPI error " + std::to_string(rc));
}

int Run(const Options& o) {
  auto fail = [](const char* what, const absl::Status& s) {
    std::fprintf(stderr, "cxlrt_bench_pods_mpi: %s: %s\n", what, s.ToString().c_str());
    return 1;
  };
  auto host = cxlrt::Host::Open();  // this rank's pod pool (CXLRT_POOL)
  if (!host.ok()) return fail("open the pod's pool", host.status());
  cxlrt::pods::PodOptions po;
  po.chunk_bytes = o.chunk_bytes;
  auto hier = cxlrt::pods::CreateOverMpi(host->allocator(), "bench", MPI_COMM_WORLD, {}, po);
  if (!hier.ok()) return fail("the communicator across pods", hier.status());
  MultiPodCommunicator& h = **hier;
  const int n = h.size(), m = h.layout().min_pod_size;
  if (h.npods() < 2) return fail("layout", absl::InvalidArgumentError("run it in 2 pods or more"));
  // Each tier alone: the pod's pool communicator, this rank's rail in MPI.
  auto pod_only = host->CreateCommunicator("bench-pod", h.pod_size(), h.local_rank());
  if (!pod_only.ok()) return fail("the pod communicator", pod_only.status());
  MPI_Comm rail = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, h.local_rank(), h.pod(), &rail);
  // Rank 0 alone measures, the others waiting, so that the ranks sharing
  // the cores do not halve what it sees.
  double memcpy_gbps = 0;
  int mpi_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  if (mpi_rank == 0) memcpy_gbps = cxlrt::bench::MeasureMemcpy(64 << 20, 5).median;
  MPI_Bcast(&memcpy_gbps, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);

  if (h.rank() == 0 && !o.json) {
    std::printf("# cxlrt_bench_pods_mpi: %d ranks in %d pods (sizes", n, h.npods());
    for (int s : h.layout().pod_sizes) std::printf(" %d", s);
    std::printf("), MPI between pods, all-reduce float32 sum, us per call (the slowest rank);\n");
    std::printf("# memcpy %.2f GB/s (64 MiB, this run)\n", memcpy_gbps);
    std::printf("%10s %9s %9s %6s %9s %9s %9s %6s %9s %9s %6s %6s\n", "bytes", "hier", "flat-mpi",
                "f/h", "pod", "pod-lim", "pod-alone", "p/lim", "engine", "rail", "e/rail",
                "#wrong");
  }
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const size_t total = bytes / sizeof(float);
    std::vector<float> in(total, static_cast<float>(h.rank() + 1)), out(total);
    cxlrt::bench::Prefault(out.data(), total * sizeof(float));
    auto th = Time(
        o.warmup, o.iters,
        [&] { return h.AllReduce(in.data(), out.data(), total, DataType::kFloat32, RedOp::kSum); },
        [&] { h.ResetTierTimes(); });
    if (!th.ok()) return fail("hier", th.status());
    const cxlrt::pods::TierTimes tt = h.tier_times();
    uint64_t wrong = 0, all_wrong = 0;
    const float sum = static_cast<float>(n) * (n + 1) / 2;
    for (size_t i = 0; i < total; ++i) wrong += out[i] != sum;
    auto tf = Time(o.warmup, o.iters, [&] {
      return Mpi(MPI_Allreduce(in.data(), out.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD),
                 "MPI_Allreduce");
    });
    if (!tf.ok()) return fail("flat mpi", tf.status());
    for (size_t i = 0; i < total; ++i) wrong += out[i] != sum;
    auto tp = Time(o.warmup, o.iters, [&] {
      return (*pod_only)->AllReduce(in.data(), out.data(), total, DataType::kFloat32, RedOp::kSum);
    });
    if (!tp.ok()) return fail("pod alone", tp.status());
    const size_t shard = total / m;
    auto tr = Time(o.warmup, o.iters, [&]() -> absl::Status {
      if (h.local_rank() >= m || shard == 0) return absl::OkStatus();
      return Mpi(
          MPI_Allreduce(in.data(), out.data(), static_cast<int>(shard), MPI_FLOAT, MPI_SUM, rail),
          "MPI_Allreduce over the rail");
    });
    if (!tr.ok()) return fail("rail alone", tr.status());
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (h.rank() == 0) {
      const double hier_us = *th * 1e6, flat_us = *tf * 1e6, pod_alone_us = *tp * 1e6,
                   rail_us = *tr * 1e6;
      const double pod_us = absl::ToDoubleMicroseconds(tt.pod) / o.iters;
      const double eng_us = absl::ToDoubleMicroseconds(tt.engine_wait) / o.iters;
      const double pod_limit_us = static_cast<double>(bytes) / (memcpy_gbps * 1e3);
      if (o.json) {
        std::printf(
            "{\"peer\": \"hier-mpi\", \"collective\": \"allreduce\", \"ranks\": %d, \"pods\": %d, "
            "\"bytes\": %llu, \"hier_us\": %.3f, \"flat_mpi_us\": %.3f, \"pod_step_us\": %.3f, "
            "\"pod_limit_us\": %.3f, \"pod_alone_us\": %.3f, \"engine_wait_us\": %.3f, "
            "\"rail_alone_us\": %.3f, \"memcpy_gbps\": %.4f, \"wrong\": %llu}\n",
            n, h.npods(), static_cast<unsigned long long>(bytes), hier_us, flat_us, pod_us,
            pod_limit_us, pod_alone_us, eng_us, rail_us, memcpy_gbps,
            static_cast<unsigned long long>(all_wrong));
      } else {
        std::printf("%10llu %9.1f %9.1f %6.2f %9.1f %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f %6llu\n",
                    static_cast<unsigned long long>(bytes), hier_us, flat_us, flat_us / hier_us,
                    pod_us, pod_limit_us, pod_alone_us, pod_us / pod_limit_us, eng_us, rail_us,
                    rail_us > 0 ? eng_us / rail_us : 0.0,
                    static_cast<unsigned long long>(all_wrong));
      }
      std::fflush(stdout);
    }
    if (all_wrong != 0) return 1;
  }
  MPI_Comm_free(&rail);
  absl::Status s = h.Destroy();
  if (!s.ok()) return fail("Destroy", s);
  s = (*pod_only)->Destroy();
  if (!s.ok()) return fail("Destroy the pod communicator", s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) return 2;
  return Run(o);
}
