/* Open MPI side of bench/compare/alltoallv.sh: the MoE all-to-all-v of
 * `cxlrt bench alltoallv` with MPI_Alltoallv, on the same splits (the same
 * routing code, bench/moe_routing.h, the same seed): tokens of HIDDEN bf16
 * elements (one MPI datatype of 2 * HIDDEN bytes, so counts are tokens),
 * grouped by destination rank; the dispatch, then the combine (the reverse
 * splits), each call timed on its own after a barrier; per call the
 * slowest rank's time; median, min and max; every element checked after a
 * last pair of calls. One JSON object per phase on rank 0's stdout.
 * Usage: mpi_alltoallv TOKENS HIDDEN EXPERTS_PER_RANK TOPK SKEW SEED ITERS WARMUP */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/moe_routing.h"

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 9) {
    if (rank == 0) {
      fprintf(stderr, "usage: mpi_alltoallv TOKENS HIDDEN EXPERTS_PER_RANK TOPK SKEW SEED ITERS "
                      "WARMUP\n");
    }
    MPI_Finalize();
    return 2;
  }
  const int tokens = atoi(argv[1]), hidden = atoi(argv[2]), epr = atoi(argv[3]);
  const int topk = atoi(argv[4]);
  const char* skew = argv[5];
  const uint64_t seed = strtoull(argv[6], 0, 10);
  const int iters = atoi(argv[7]), warm = atoi(argv[8]);
  if (hidden < 1 || iters < 1 || warm < 0) {
    if (rank == 0) fprintf(stderr, "mpi_alltoallv: need HIDDEN >= 1, ITERS >= 1, WARMUP >= 0\n");
    MPI_Finalize();
    return 2;
  }
  uint64_t* m = malloc(sizeof(uint64_t) * (size_t)n * n);
  char err[256];
  if (!m || MoeRoute(skew, n, tokens, epr, topk, seed, m, err, sizeof(err)) != 0) {
    if (rank == 0) fprintf(stderr, "mpi_alltoallv: %s\n", m ? err : "out of memory");
    MPI_Finalize();
    return 2;
  }
  MPI_Datatype token;
  MPI_Type_contiguous(2 * hidden, MPI_BYTE, &token);
  MPI_Type_commit(&token);
  int *sc = malloc(sizeof(int) * n), *sd = malloc(sizeof(int) * n);
  int *rc = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n);
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = (int)m[(size_t)rank * n + j];
    sd[j] = (int)stotal;
    stotal += (size_t)sc[j];
    rc[j] = (int)m[(size_t)j * n + rank];
    rd[j] = (int)rtotal;
    rtotal += (size_t)rc[j];
  }
  const size_t h = (size_t)hidden;
  uint16_t* tok = malloc(stotal * h * 2 + 64);
  uint16_t* exp = malloc(rtotal * h * 2 + 64);
  uint16_t* comb = malloc(stotal * h * 2 + 64);
  double* us[2] = {malloc(sizeof(double) * iters), malloc(sizeof(double) * iters)};
  double* slow = malloc(sizeof(double) * iters);
  if (!tok || !exp || !comb || !us[0] || !us[1] || !slow) {
    fprintf(stderr, "mpi_alltoallv: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(exp, 0, rtotal * h * 2 + 64); /* pre-fault: page faults are not what we measure */
  memset(comb, 0, stotal * h * 2 + 64);
  for (int j = 0; j < n; ++j) {
    for (uint64_t k = 0; k < (uint64_t)sc[j]; ++k) {
      for (size_t e = 0; e < h; ++e) tok[((size_t)sd[j] + k) * h + e] = MoeValue(rank, j, k, e);
    }
  }
#define DISPATCH() MPI_Alltoallv(tok, sc, sd, token, exp, rc, rd, token, MPI_COMM_WORLD)
#define COMBINE() MPI_Alltoallv(exp, rc, rd, token, comb, sc, sd, token, MPI_COMM_WORLD)
  for (int w = 0; w < warm; ++w) {
    if (DISPATCH() != MPI_SUCCESS || COMBINE() != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int it = 0; it < iters; ++it) {
    for (int p = 0; p < 2; ++p) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if ((p == 0 ? DISPATCH() : COMBINE()) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
      us[p][it] = (MPI_Wtime() - t0) * 1e6;
    }
  }
  memset(exp, 0, rtotal * h * 2 + 64);
  memset(comb, 0, stotal * h * 2 + 64);
  if (DISPATCH() != MPI_SUCCESS || COMBINE() != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
  unsigned long long wrong[2] = {0, 0}, wrong_sum[2] = {0, 0};
  for (int i = 0; i < n; ++i) {
    for (uint64_t k = 0; k < (uint64_t)rc[i]; ++k) {
      for (size_t e = 0; e < h; ++e) {
        wrong[0] += exp[((size_t)rd[i] + k) * h + e] != MoeValue(i, rank, k, e);
      }
    }
  }
  for (size_t e = 0; e < stotal * h; ++e) wrong[1] += comb[e] != tok[e];
  MPI_Reduce(wrong, wrong_sum, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  /* The busiest rank's tokens to or from its peers. */
  uint64_t busiest = 0;
  for (int r = 0; r < n; ++r) {
    uint64_t sent = 0, received = 0;
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      sent += m[(size_t)r * n + j];
      received += m[(size_t)j * n + r];
    }
    if (sent > busiest) busiest = sent;
    if (received > busiest) busiest = received;
  }
  const char* names[2] = {"dispatch", "combine"};
  for (int p = 0; p < 2; ++p) {
    MPI_Reduce(us[p], slow, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank != 0) continue;
    qsort(slow, (size_t)iters, sizeof(double), cmp_double);
    const double med =
        iters % 2 ? slow[iters / 2] : (slow[iters / 2 - 1] + slow[iters / 2]) / 2;
    const double bytes = (double)busiest * 2.0 * hidden;
    printf("{\"peer\": \"mpi\", \"bench\": \"alltoallv\", \"phase\": \"%s\", \"ranks\": %d, "
           "\"tokens\": %d, \"hidden\": %d, \"experts_per_rank\": %d, \"topk\": %d, "
           "\"skew\": \"%s\", \"seed\": %llu, \"median_us\": %.3f, \"min_us\": %.3f, "
           "\"max_us\": %.3f, \"busiest_bytes\": %.0f, \"gbps\": %.4f, \"wrong\": %llu, "
           "\"fingerprint\": \"%016llx\"}\n",
           names[p], n, tokens, hidden, epr, topk, skew, (unsigned long long)seed, med, slow[0],
           slow[iters - 1], bytes, med > 0 ? bytes / (med * 1e3) : 0, wrong_sum[p],
           (unsigned long long)MoeFingerprint(m, n));
    fflush(stdout);
  }
  MPI_Type_free(&token);
  MPI_Finalize();
  return wrong_sum[0] + wrong_sum[1] == 0 ? 0 : 1;
}
