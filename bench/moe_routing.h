/* Token routing of an MoE layer for the all-to-all-v benchmarks: which rank
 * each rank's tokens go to, drawn with a fixed seed. Plain C, header only,
 * so that `cxlrt bench alltoallv` and its Open MPI peer
 * (bench/compare/mpi_alltoallv.c) draw the same splits from the same code.
 *
 * Every rank owns `experts_per_rank` experts; expert e lives on rank
 * e / experts_per_rank. Rank i routes each of its `tokens` tokens to `topk`
 * distinct experts drawn from the distribution `skew`, and sends the token
 * once to every rank that holds one of them (as DeepEP dispatches: one copy
 * per rank, not per expert). Skews:
 *   uniform      every expert alike
 *   zipf:S       expert e weighs 1 / (e + 1)^S: expert 0 (on rank 0) is the
 *                hottest, so rank 0 receives the most
 *   hot:K:F      experts 0..K-1 take a fraction F of the draws, the others
 *                share the rest
 * The draws of rank i depend only on (seed, i), so every rank computes the
 * whole matrix locally. Thread-safe (no state). */
#ifndef CXLRT_BENCH_MOE_ROUTING_H_
#define CXLRT_BENCH_MOE_ROUTING_H_

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: one 64-bit draw from `*state`. */
static inline uint64_t MoeNext(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Fills m[i * n + j] with the tokens rank i sends to rank j (n * n entries).
 * Returns 0, or -1 with the reason in `err` (a bad skew, topk above the
 * experts, sizes out of range). */
static inline int MoeRoute(const char* skew, int n, int tokens, int experts_per_rank, int topk,
                           uint64_t seed, uint64_t* m, char* err, size_t err_len) {
  if (n < 1 || tokens < 0 || experts_per_rank < 1 || topk < 1) {
    snprintf(err, err_len, "need ranks >= 1, tokens >= 0, experts per rank >= 1, topk >= 1");
    return -1;
  }
  const int experts = n * experts_per_rank;
  if (topk > experts) {
    snprintf(err, err_len, "topk %d > the %d experts of %d ranks", topk, experts, n);
    return -1;
  }
  double* cdf = (double*)malloc(sizeof(double) * (size_t)experts);
  if (!cdf) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  double s = 0, f = 0;
  int k = 0;
  char tail = 0;
  if (strcmp(skew, "uniform") == 0) {
    for (int e = 0; e < experts; ++e) cdf[e] = e + 1;
  } else if (sscanf(skew, "zipf:%lf%c", &s, &tail) == 1 && s >= 0 && s <= 10) {
    double sum = 0;
    for (int e = 0; e < experts; ++e) cdf[e] = (sum += 1.0 / pow(e + 1.0, s));
  } else if (sscanf(skew, "hot:%d:%lf%c", &k, &f, &tail) == 2 && k >= 1 && k < experts && f > 0 &&
             f < 1) {
    double sum = 0;
    for (int e = 0; e < experts; ++e) {
      cdf[e] = (sum += e < k ? f / k : (1 - f) / (experts - k));
    }
  } else {
    snprintf(err, err_len,
             "skew '%s' is none of uniform, zipf:S (0 <= S <= 10), hot:K:F (1 <= K < %d "
             "experts, 0 < F < 1)",
             skew, experts);
    free(cdf);
    return -1;
  }
  const double total = cdf[experts - 1];
  int* picked = (int*)malloc(sizeof(int) * (size_t)topk);
  char* to_rank = (char*)malloc((size_t)n);
  if (!picked || !to_rank) {
    snprintf(err, err_len, "out of memory");
    free(cdf);
    free(picked);
    free(to_rank);
    return -1;
  }
  memset(m, 0, sizeof(uint64_t) * (size_t)n * (size_t)n);
  for (int i = 0; i < n; ++i) {
    uint64_t state = seed * 0x2545f4914f6cdd1dull + (uint64_t)i + 1;
    for (int t = 0; t < tokens; ++t) {
      memset(to_rank, 0, (size_t)n);
      for (int p = 0; p < topk; ++p) {
        int e;
        for (;;) { /* distinct experts: draw again on a repeat */
          const double u = (double)(MoeNext(&state) >> 11) * 0x1.0p-53 * total;
          int lo = 0, hi = experts - 1; /* the first e with cdf[e] > u */
          while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (cdf[mid] > u) {
              hi = mid;
            } else {
              lo = mid + 1;
            }
          }
          e = lo;
          int seen = 0;
          for (int q = 0; q < p; ++q) seen |= picked[q] == e;
          if (!seen) break;
        }
        picked[p] = e;
        to_rank[e / experts_per_rank] = 1;
      }
      for (int j = 0; j < n; ++j) m[(size_t)i * n + j] += (uint64_t)to_rank[j];
    }
  }
  free(cdf);
  free(picked);
  free(to_rank);
  return 0;
}

/* A fingerprint of the matrix, printed by both benchmarks so that a
 * comparison can check they moved the same splits. */
static inline uint64_t MoeFingerprint(const uint64_t* m, int n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < (size_t)n * n; ++k) h = (h ^ m[k]) * 1099511628211ull;
  return h;
}

/* The bytes element h of the k-th token rank i sends to rank j starts as:
 * a 16-bit pattern (one bf16 element), so that a misplaced token shows. */
static inline uint16_t MoeValue(int i, int j, uint64_t k, uint64_t h) {
  uint64_t x = ((uint64_t)i * 1000003u + (uint64_t)j) * 0x9e3779b97f4a7c15ull + k * 65537u + h;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return (uint16_t)(x >> 32);
}

#endif /* CXLRT_BENCH_MOE_ROUTING_H_ */
