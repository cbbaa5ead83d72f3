/* What a small all-reduce's synchronisation alone costs when ranks
 * outnumber cores (issue 28: 4-8 ranks on the 2-vCPU VM), with no data,
 * descriptors or deadlines: N processes over shared memory, one 128-byte
 * line of flags each, every wait yielding after SPINS pauses (0: at once,
 * what cxlrt's waits do when ranks outnumber cores). Two patterns:
 *   all:   each round every process raises its flag and waits until every
 *          other process's flag has reached the round (cxlrt's one-shot
 *          all-reduce: every rank reads every rank's post);
 *   pairs: log2(N) steps per round, in step k each process raises its flag
 *          and waits for that of process rank ^ (1 << k) (recursive
 *          doubling, Open MPI's small all-reduce).
 * Prints per pattern the best and median of 15 batches' mean time per
 * round in microseconds: the floor under any N-rank call that waits the
 * same way, beside which cxlrt's and Open MPI's times read.
 * Usage: oversub_flag_probe [N [ROUNDS [SPINS]]]   (4, 2000, 0; N a power of 2)
 *   cc -O2 -o /tmp/flagprobe bench/compare/oversub_flag_probe.c && /tmp/flagprobe 4 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kBatches = 15, kMaxRanks = 64 };
typedef struct {
  _Alignas(128) _Atomic uint64_t flag;
} Line;
typedef struct {
  Line line[kMaxRanks];
  _Alignas(128) double us[kBatches];  // rank 0's batch times
} Shared;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void await(_Atomic uint64_t* f, uint64_t v, int spins) {
  for (int i = 0; atomic_load_explicit(f, memory_order_acquire) < v; ++i) {
    if (i < spins) {
      _mm_pause();
    } else {
      sched_yield();
    }
  }
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* One pattern on every rank; rank 0 records its batch times. */
static void run(Shared* sh, int n, int r, int pairs, int rounds, int spins, uint64_t* seq) {
  int steps = 0;
  while ((1 << steps) < n) ++steps;
  for (int b = 0; b < kBatches; ++b) {
    const double t0 = now_us();
    for (int k = 0; k < rounds; ++k) {
      if (pairs) {
        for (int s = 0; s < steps; ++s) {
          atomic_store_explicit(&sh->line[r].flag, ++*seq, memory_order_release);
          await(&sh->line[r ^ (1 << s)].flag, *seq, spins);
        }
      } else {
        atomic_store_explicit(&sh->line[r].flag, ++*seq, memory_order_release);
        for (int j = 0; j < n; ++j) {
          if (j != r) await(&sh->line[j].flag, *seq, spins);
        }
      }
    }
    if (r == 0) sh->us[b] = (now_us() - t0) / rounds;
  }
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 4;
  const int rounds = argc > 2 ? atoi(argv[2]) : 2000;
  const int spins = argc > 3 ? atoi(argv[3]) : 0;
  if (n < 2 || n > kMaxRanks || (n & (n - 1)) != 0 || rounds < 1 || spins < 0) {
    fprintf(stderr, "usage: oversub_flag_probe [N (a power of 2, 2-64) [ROUNDS [SPINS]]]\n");
    return 2;
  }
  Shared* sh =
      mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  printf(
      "# %d processes on %ld cores, waits yield after %d spins; us per round, best / median "
      "of %d batches of %d\n",
      n, sysconf(_SC_NPROCESSORS_ONLN), spins, kBatches, rounds);
  for (int pairs = 0; pairs < 2; ++pairs) {
    for (int j = 0; j < n; ++j) atomic_store(&sh->line[j].flag, 0);
    pid_t pid[kMaxRanks];
    for (int r = 1; r < n; ++r) {
      pid[r] = fork();
      if (pid[r] < 0) {
        perror("fork");
        return 1;
      }
      if (pid[r] == 0) {
        uint64_t seq = 0;
        run(sh, n, r, pairs, rounds, spins, &seq);
        _exit(0);
      }
    }
    uint64_t seq = 0;
    run(sh, n, 0, pairs, rounds, spins, &seq);
    int failed = 0;
    for (int r = 1; r < n; ++r) {
      int st = 0;
      if (waitpid(pid[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    }
    if (failed) {
      fprintf(stderr, "oversub_flag_probe: a process failed\n");
      return 1;
    }
    double v[kBatches];
    for (int b = 0; b < kBatches; ++b) v[b] = sh->us[b];
    qsort(v, kBatches, sizeof(double), cmp);
    printf("%-6s %8.3f / %8.3f\n", pairs ? "pairs" : "all", v[0], v[kBatches / 2]);
  }
  return 0;
}
