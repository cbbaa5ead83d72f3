/* The Redis side of bench/compare/kv.sh: SET and GET of the same blocks as
 * `cxlrt bench kv` (same working set, keys and caller buffers), one command
 * at a time and pipelined in batches, over a Unix socket (Redis's fastest
 * local transport). Prints one JSON object per block size.
 *
 *   redis_kv SOCKET WORKING_SET_BYTES BATCH REPS BLOCK...
 */
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, n, sizeof(double), cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void check(redisReply* r, const char* what) {
  if (!r || r->type == REDIS_REPLY_ERROR) {
    fprintf(stderr, "redis %s: %s\n", what, r ? r->str : "no reply");
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s SOCKET WORKING_SET BATCH REPS BLOCK...\n", argv[0]);
    return 2;
  }
  redisContext* c = redisConnectUnix(argv[1]);
  if (!c || c->err) {
    fprintf(stderr, "cannot connect to %s\n", argv[1]);
    return 1;
  }
  const uint64_t ws = strtoull(argv[2], NULL, 10);
  const int batch = atoi(argv[3]), reps = atoi(argv[4]);
  uint8_t* src = malloc(ws);
  uint8_t* dst = malloc(ws);
  for (uint64_t i = 0; i < ws; ++i) src[i] = (uint8_t)(i * 0x9e3779b9u >> 7);
  memset(dst, 0, ws);
  long wrong = 0;
  for (int a = 5; a < argc; ++a) {
    const uint64_t b = strtoull(argv[a], NULL, 10), n = ws / b;
    double put_g[64], get_g[64], bput_g[64], bget_g[64];
    int k = 0;
    for (int rep = 0; rep <= reps && rep < 64; ++rep) {
      for (int batched = 0; batched < 2; ++batched) {
        char key[64];
        double t0 = now_s();
        for (uint64_t i = 0; i < n; i += batched ? batch : 1) {
          const uint64_t end = batched ? (i + batch < n ? i + batch : n) : i + 1;
          for (uint64_t j = i; j < end; ++j) {
            snprintf(key, sizeof key, "b%lu-r%d-%lu", (unsigned long)b, rep * 2 + batched,
                     (unsigned long)j);
            redisAppendCommand(c, "SET %s %b", key, src + j * b, (size_t)b);
          }
          for (uint64_t j = i; j < end; ++j) {
            redisReply* r = NULL;
            redisGetReply(c, (void**)&r);
            check(r, "SET");
            freeReplyObject(r);
          }
        }
        const double put_s = now_s() - t0;
        t0 = now_s();
        for (uint64_t i = 0; i < n; i += batched ? batch : 1) {
          const uint64_t end = batched ? (i + batch < n ? i + batch : n) : i + 1;
          for (uint64_t j = i; j < end; ++j) {
            snprintf(key, sizeof key, "b%lu-r%d-%lu", (unsigned long)b, rep * 2 + batched,
                     (unsigned long)j);
            redisAppendCommand(c, "GET %s", key);
          }
          for (uint64_t j = i; j < end; ++j) {
            redisReply* r = NULL;
            redisGetReply(c, (void**)&r);
            check(r, "GET");
            if (r->type != REDIS_REPLY_STRING || r->len != b) {
              ++wrong;
            } else {
              memcpy(dst + j * b, r->str, b);  /* into the caller's buffer, as cxlrt's Get */
            }
            freeReplyObject(r);
          }
        }
        const double get_s = now_s() - t0;
        if (rep == 0 && memcmp(dst, src, n * b) != 0) ++wrong;
        redisReply* r = redisCommand(c, "FLUSHALL");
        check(r, "FLUSHALL");
        freeReplyObject(r);
        if (rep == 0) continue;  /* warm-up */
        const double bytes = (double)(n * b);
        if (batched) {
          bput_g[k] = bytes / put_s / 1e9;
          bget_g[k] = bytes / get_s / 1e9;
          ++k;
        } else {
          put_g[k] = bytes / put_s / 1e9;
          get_g[k] = bytes / get_s / 1e9;
        }
      }
    }
    printf("{\"block\": %lu, \"put_gbps\": %.4f, \"get_gbps\": %.4f, \"batch_put_gbps\": %.4f, "
           "\"batch_get_gbps\": %.4f, \"wrong\": %ld}\n",
           (unsigned long)b, median(put_g, k), median(get_g, k), median(bput_g, k),
           median(bget_g, k), wrong);
    fflush(stdout);
  }
  redisFree(c);
  return wrong ? 1 : 0;
}
