/* Open MPI side of bench/compare/collectives.sh: nccl-tests' sizes and bus
 * bandwidth for MPI_Allreduce, MPI_Allgather, MPI_Bcast,
 * MPI_Reduce_scatter_block and MPI_Alltoall on float32 (sum), and for
 * sendrecv as `cxlrt bench sendrecv` runs it (a ring: each rank sends to
 * the next and receives from the previous, even ranks sending first, with
 * blocking MPI_Send and MPI_Recv), one JSON object per size on rank 0's
 * stdout.
 * Usage: mpi_coll COLLECTIVE MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double bus_factor(const char* c, int n) {
  if (!strcmp(c, "allreduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(c, "broadcast") || !strcmp(c, "sendrecv")) return 1.0;
  return (double)(n - 1) / n;
}

static int run(const char* c, float* s, float* r, size_t total, int n) {
  const size_t per = total / n;
  if (!strcmp(c, "sendrecv")) {
    int rank, e = MPI_SUCCESS;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int to = (rank + 1) % n, from = (rank + n - 1) % n;
    for (int step = 0; step < 2 && e == MPI_SUCCESS; ++step) {
      e = rank % 2 == step
              ? MPI_Send(s, (int)total, MPI_FLOAT, to, 0, MPI_COMM_WORLD)
              : MPI_Recv(r, (int)total, MPI_FLOAT, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    return e;
  }
  if (!strcmp(c, "allreduce")) return MPI_Allreduce(s, r, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (!strcmp(c, "allgather"))
    return MPI_Allgather(s, (int)per, MPI_FLOAT, r, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
  if (!strcmp(c, "broadcast")) return MPI_Bcast(s, (int)total, MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (!strcmp(c, "reducescatter"))
    return MPI_Reduce_scatter_block(s, r, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (!strcmp(c, "alltoall"))
    return MPI_Alltoall(s, (int)per, MPI_FLOAT, r, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
  return -1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 7) {
    if (rank == 0) fprintf(stderr, "usage: mpi_coll COLL MIN MAX FACTOR ITERS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  const char* c = argv[1];
  const size_t lo = strtoull(argv[2], 0, 10), hi = strtoull(argv[3], 0, 10);
  const size_t f = strtoull(argv[4], 0, 10);
  const int iters = atoi(argv[5]), warm = atoi(argv[6]);
  float* s = malloc(hi + 64);
  float* r = malloc(hi + 64);
  memset(s, 1, hi + 64); /* pre-fault: page faults are not what we measure */
  memset(r, 0, hi + 64);
  for (size_t bytes = lo; bytes <= hi; bytes *= f) {
    size_t total = bytes / sizeof(float);
    if (total < (size_t)n) total = n;
    for (int i = 0; i < warm; ++i) run(c, s, r, total, n);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      if (run(c, s, r, total, n) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double us = (MPI_Wtime() - t0) * 1e6 / iters, max_us = 0;
    MPI_Reduce(&us, &max_us, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double b = (double)(total / n * n == total ? total : total) * sizeof(float);
      const double algbw = b / (max_us * 1e3);
      printf("{\"peer\": \"mpi\", \"collective\": \"%s\", \"ranks\": %d, \"bytes\": %zu, "
             "\"time_us\": %.3f, \"busbw_gbps\": %.4f}\n",
             c, n, bytes, max_us, algbw * bus_factor(c, n));
      fflush(stdout);
    }
    if (f < 2) break;
  }
  free(s);
  free(r);
  MPI_Finalize();
  return 0;
}
