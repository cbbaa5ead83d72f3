/* What the copies of a 2-rank private-buffer all-to-all allow on this
 * machine, with no protocol beyond one flag per step (as `cxlrt bench
 * ceiling` does for all-reduce): two processes over shared memory, per
 * size (total bytes; each rank's piece for the other is half):
 *   pool:   each rank copies its own piece across, its piece for the peer
 *           into a shared slot (non-temporal stores above 32 KiB, as the
 *           CPU engine does), then the peer's piece out of the peer's slot:
 *           three copies, what a CXL host must do with private buffers;
 *   direct: each rank copies its own piece across and the peer's piece
 *           straight out of the peer's send buffer: two copies, what Open
 *           MPI does on one machine (CMA), without its system calls.
 * Prints per size the best and median of 15 batches' mean time per call
 * and direct/pool, the most a protocol on the pool path could read
 * against one on the direct path.
 * With PROBE=broadcast in the environment, the same for a broadcast from
 * rank 0 (pool: the root's copy into a ring of 4 slots of 256 KiB chunks
 * and the reader's copy out, pipelined; direct: the reader's one copy out
 * of the root's buffer), timed on the reader.
 * Usage: alltoall_copy_probe [MIN_BYTES MAX_BYTES ITERS [NT_ABOVE]]
 *   NT_ABOVE: pieces above it go into the slot non-temporally (32768)
 *   bench/compare: cc -O2 -mavx2 -o /tmp/probe bench/compare/alltoall_copy_probe.c && /tmp/probe */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kBatches = 15 };
typedef struct {
  _Alignas(128) _Atomic uint64_t posted;
  _Alignas(128) _Atomic uint64_t done;
} Flags;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static size_t nt_from = 32u << 10;

static void copy_nt(void* dst, const void* src, size_t n) {
  if (n <= nt_from || ((uintptr_t)dst & 31)) {
    memcpy(dst, src, n);
    return;
  }
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm256_stream_si256((__m256i*)((char*)dst + i),
                        _mm256_loadu_si256((const __m256i*)((const char*)src + i)));
  }
  memcpy((char*)dst + i, (const char*)src + i, n - i);
  _mm_sfence();
}

static void wait_at_least(_Atomic uint64_t* f, uint64_t v) {
  while (atomic_load_explicit(f, memory_order_acquire) < v) _mm_pause();
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* Broadcast of `bytes` from rank 0, `iters` times. Pool: the root copies
 * 256 KiB chunks into a ring of 4 shared slots (non-temporal), the reader
 * copies each out once posted; direct: the reader copies the root's send
 * buffer (shared, unchanged) straight into its own. Returns the rank's mean
 * time per call in us. */
static double broadcast(int r, int mode, Flags* flags, char* slots, char* root_send,
                        char* priv_send, char* recv, size_t bytes, int iters, uint64_t* seq) {
  const size_t chunk = 256u << 10;
  int64_t t0 = now_ns();
  for (int it = 0; it < iters; ++it) {
    if (mode == 1) {
      ++*seq;
      if (r == 1) memcpy(recv, root_send, bytes);
      atomic_store_explicit(&flags[r].done, *seq, memory_order_release);
      atomic_store_explicit(&flags[r].posted, *seq, memory_order_release);
      wait_at_least(&flags[1 - r].posted, *seq);
      continue;
    }
    for (size_t at = 0; at < bytes; at += chunk) {
      const uint64_t c = ++*seq;
      const size_t n = bytes - at < chunk ? bytes - at : chunk;
      char* slot = slots + (c % 4) * chunk;
      if (r == 0) {
        wait_at_least(&flags[1].done, c > 4 ? c - 4 : 0);
        copy_nt(slot, priv_send + at, n);
        atomic_store_explicit(&flags[0].posted, c, memory_order_release);
      } else {
        wait_at_least(&flags[0].posted, c);
        memcpy(recv + at, slot, n);
        atomic_store_explicit(&flags[1].done, c, memory_order_release);
      }
    }
  }
  return (now_ns() - t0) / 1e3 / iters;
}

int main(int argc, char** argv) {
  size_t lo = argc > 1 ? strtoull(argv[1], 0, 10) : 128u << 10;
  size_t hi = argc > 2 ? strtoull(argv[2], 0, 10) : 1u << 20;
  int iters = argc > 3 ? atoi(argv[3]) : 200;
  if (argc > 4) nt_from = strtoull(argv[4], 0, 10);
  /* shared: flags[2], slots[2][2 parities][hi/2], send[2][hi] (direct mode reads them) */
  size_t half = hi / 2;
  size_t slot_bytes = 4 * half > (1u << 20) ? 4 * half : (1u << 20); /* broadcast: 4 x 256 KiB */
  size_t shared_bytes = 4096 + slot_bytes + 2 * hi;
  char* sh = mmap(0, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  memset(sh, 0, shared_bytes);
  Flags* flags = (Flags*)sh;
  char* slots = sh + 4096;
  char* sends = slots + slot_bytes;
  double* results = mmap(0, 4096 * sizeof(double), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pid_t child = fork();
  int r = child == 0 ? 1 : 0, peer = 1 - r;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(r % sysconf(_SC_NPROCESSORS_ONLN), &set);
  sched_setaffinity(0, sizeof(set), &set);
  char* priv_send = aligned_alloc(64, hi);
  char* recv = aligned_alloc(64, hi);
  char* my_send = sends + r * hi;
  memset(priv_send, r + 1, hi);
  memset(my_send, r + 1, hi);
  memset(recv, 0, hi);
  uint64_t step = 0;
  int row = 0;
  const int bcast = getenv("PROBE") && !strcmp(getenv("PROBE"), "broadcast");
  for (size_t bytes = lo; bytes <= hi; bytes *= 2, ++row) {
    size_t p = bytes / 2;
    for (int mode = 0; mode < 2; ++mode) {
      double batch[kBatches];
      for (int b = -1; b < kBatches; ++b) { /* batch -1: warm-up */
        if (bcast) {
          /* both ranks start each batch together */
          ++step;  /* done too: the root's slot waits count every step */
          atomic_store_explicit(&flags[r].done, step, memory_order_release);
          atomic_store_explicit(&flags[r].posted, step, memory_order_release);
          wait_at_least(&flags[peer].posted, step);
          double t = broadcast(r, mode, flags, slots, sends, priv_send, recv, bytes, iters, &step);
          if (b >= 0) batch[b] = t;
          continue;
        }
        int64_t t0 = now_ns();
        for (int it = 0; it < iters; ++it) {
          ++step;
          if (mode == 0) { /* pool: 3 copies */
            /* the slot of this parity was last read two steps ago */
            wait_at_least(&flags[peer].done, step > 2 ? step - 2 : 0);
            char* mine = slots + (r * 2 + (step & 1)) * half;
            memcpy(recv + r * p, priv_send + r * p, p);
            copy_nt(mine, priv_send + peer * p, p);
            atomic_store_explicit(&flags[r].posted, step, memory_order_release);
            wait_at_least(&flags[peer].posted, step);
            memcpy(recv + peer * p, slots + (peer * 2 + (step & 1)) * half, p);
            atomic_store_explicit(&flags[r].done, step, memory_order_release);
          } else { /* direct: 2 copies, the peer's send buffer read in place */
            memcpy(recv + r * p, my_send + r * p, p);
            atomic_store_explicit(&flags[r].posted, step, memory_order_release);
            wait_at_least(&flags[peer].posted, step);
            memcpy(recv + peer * p, sends + peer * hi + r * p, p);
            atomic_store_explicit(&flags[r].done, step, memory_order_release);
            wait_at_least(&flags[peer].done, step);
          }
        }
        if (b >= 0) batch[b] = (now_ns() - t0) / 1e3 / iters;
      }
      qsort(batch, kBatches, sizeof(double), cmp);
      if (r == (bcast ? 1 : 0)) { /* all-to-all: rank 0; broadcast: the reader */
        results[row * 4 + mode * 2] = batch[0];
        results[row * 4 + mode * 2 + 1] = batch[kBatches / 2];
      }
    }
  }
  if (child == 0) _exit(0);
  waitpid(child, 0, 0);
  printf("# us per call, best / median of %d batches of %d; direct/pool: the ceiling of pool vs direct\n",
         kBatches, iters);
  printf("%9s %20s %20s %16s\n", "bytes", "pool", "direct", "direct/pool");
  row = 0;
  for (size_t bytes = lo; bytes <= hi; bytes *= 2, ++row) {
    double* x = results + row * 4;
    printf("%9zu %9.2f / %8.2f %9.2f / %8.2f %7.2f, %6.2f\n", bytes, x[0], x[1], x[2], x[3],
           x[2] / x[0], x[3] / x[1]);
  }
  return 0;
}
