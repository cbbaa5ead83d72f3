// How much of an inter-pod all-reduce the MPI engine hides behind the
// caller's work in the pool (docs/collectives.md, "Beyond one pool", "Progress"). Run under
// mpirun (or `cxlrt run --pods`), 2 ranks or more:
//
//   mpirun -n 2 build/bin/cxlrt_bench_mpi_overlap [BYTES [BUSY_MS [REPS]]]
//
// Rows, all in one run, median over REPS (after 3 warm-ups), each rep
// starting from an MPI_Barrier, the slowest rank's median:
//   MPI_Allreduce        the blocking call, Open MPI's own (a peer)
//   engine, wait at once AllReduce then Wait: the time to hide
//   busy spin, thread    AllReduce, BUSY_MS of CPU work, Wait (progress thread)
//   busy spin, no thread the same, operations progressed in Wait only
//   busy sleep, ...      the same with the caller asleep (a DMA engine busy)
// "hidden" is how much of the all-reduce disappeared behind the work:
// (at_once + busy - total) / min(at_once, busy); 1.0 is full overlap (the
// total is the longer of the two), 0 none (the sum). Output: one table on
// rank 0.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "cxlrt/pods/mpi_engine.h"

namespace {

using cxlrt::collectives::DataType;
using cxlrt::collectives::RedOp;
using cxlrt::pods::InterPodEngine;
using cxlrt::pods::MpiEngine;
using cxlrt::pods::MpiEngineOptions;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Busy(double ms, bool spin) {
  if (!spin) {
    absl::SleepFor(absl::Microseconds(ms * 1000));
    return;
  }
  const absl::Time end = absl::Now() + absl::Microseconds(ms * 1000);
  volatile uint64_t x = 0;
  while (absl::Now() < end) {
    for (int i = 0; i < 1000; ++i) x = x + i;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (4u << 20);
  const double busy_ms = argc > 2 ? std::atof(argv[2]) : 5.0;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  const size_t count = bytes / 4;

  MpiEngineOptions with_thread, without_thread;
  with_thread.progress_thread = true;
  without_thread.progress_thread = false;
  auto threaded = MpiEngine::World(MPI_COMM_WORLD, with_thread);
  if (!threaded.ok()) {
    std::fprintf(stderr, "%s\n", threaded.status().ToString().c_str());
    return 1;
  }
  auto plain = MpiEngine::World(MPI_COMM_WORLD, without_thread);
  if (!plain.ok()) {
    std::fprintf(stderr, "%s\n", plain.status().ToString().c_str());
    return 1;
  }
  const int rank = (*threaded)->rank(), size = (*threaded)->size();
  std::vector<float> in(count, 1.0f), out(count, 0.0f);
  int wrong = 0;

  // kind: 0 MPI_Allreduce; 1 engine, wait at once; 2 engine, busy, wait.
  auto once = [&](int kind, InterPodEngine* e, bool spin) {
    MPI_Barrier(MPI_COMM_WORLD);
    std::fill(out.begin(), out.end(), 0.0f);
    const absl::Time start = absl::Now();
    if (kind == 0) {
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    } else {
      auto t = e->AllReduce(in.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
      if (!t.ok()) {
        std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
        std::exit(1);
      }
      if (kind == 2) Busy(busy_ms, spin);
      if (absl::Status s = e->Wait(*t, absl::Now() + absl::Seconds(60)); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (out[0] != size || out[count - 1] != size) ++wrong;
    return ms;
  };
  struct Row {
    const char* name;
    int kind;
    InterPodEngine* engine;
    bool spin;
    std::vector<double> times;
    double ms = 0;
  };
  std::vector<Row> rows = {
      {"MPI_Allreduce (blocking)", 0, nullptr, true, {}},
      {"engine, wait at once", 1, threaded->get(), true, {}},
      {"busy spin, progress thread", 2, threaded->get(), true, {}},
      {"busy spin, wait only", 2, plain->get(), true, {}},
      {"busy sleep, progress thread", 2, threaded->get(), false, {}},
      {"busy sleep, wait only", 2, plain->get(), false, {}},
  };
  // The rows interleaved rep by rep, so that load from elsewhere on the
  // machine falls on every row alike.
  for (int r = 0; r < reps + 3; ++r) {
    for (Row& row : rows) {
      const double ms = once(row.kind, row.engine, row.spin);
      if (r >= 3) row.times.push_back(ms);
    }
  }
  // The slowest rank's median: the call ends for the job when it ends there.
  for (Row& row : rows) {
    double m = Median(row.times);
    MPI_Allreduce(&m, &row.ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  const double at_once = rows[1].ms;
  int wrong_all = 0;
  MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "# MPI engine overlap: all-reduce of %zu bytes (float32 sum), %d ranks, "
        "caller busy %.1f ms, median of %d\n",
        bytes, size, busy_ms, reps);
    std::printf("%-30s %10s %10s %8s\n", "row", "ms", "ideal ms", "hidden");
    for (const Row& r : rows) {
      const bool busy = r.kind == 2;
      const double ideal = busy ? std::max(at_once, busy_ms) : r.ms;
      const double hidden = (at_once + busy_ms - r.ms) / std::min(at_once, busy_ms);
      if (busy) {
        std::printf("%-30s %10.3f %10.3f %8.2f\n", r.name, r.ms, ideal, hidden);
      } else {
        std::printf("%-30s %10.3f %10.3f %8s\n", r.name, r.ms, ideal, "-");
      }
    }
    std::printf("# wrong results: %d\n", wrong_all);
  }
  return wrong_all == 0 ? 0 : 1;
}
