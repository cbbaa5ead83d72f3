// cxlrt: the command line of the runtime. `cxlrt --help` lists commands.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/alloc_bench.h"
#include "bench/alltoallv_bench.h"
#include "bench/ceiling_probe.h"
#include "bench/coll_bench.h"
#include "bench/dma_bench.h"
#include "bench/kv_bench.h"
#include "bench/pods_bench.h"
#include "bench/pool_bench.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/units.h"
#include "tools/commands.h"

namespace {

int Usage(const CLI::App& app, const CLI::ParseError& e) {
  std::fprintf(stderr, "cxlrt: %s\n\n%s", e.what(), app.help().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cxlrt;
  CLI::App app{"cxlrt: communication through a CXL shared memory pool"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log what the runtime does (info level)");

  const std::string default_pool = runtime::DefaultPoolUri();
  std::string uri = default_pool;
  bool json = false, force = false;
  int slot = -1;
  double seconds = 3;
  int interval_ms = 500;

  CLI::App* pool = app.add_subcommand("pool", "Create, inspect, check and destroy pools");
  pool->require_subcommand(1);
  auto uri_help = "Pool URI (default $CXLRT_POOL, now " + default_pool + ")";
  CLI::App* create = pool->add_subcommand("create", "Create a pool");
  create->add_option("uri", uri, uri_help);
  CLI::App* info = pool->add_subcommand("info", "Show a pool's format, hosts and regions");
  info->add_option("uri", uri, uri_help);
  info->add_flag("--json", json, "Machine-readable output");
  CLI::App* check = pool->add_subcommand(
      "check", "Audit a pool's header and tables; exit 0 when healthy, 1 with the problems");
  check->add_option("uri", uri, uri_help);
  check->add_flag("--json", json, "Machine-readable output");
  CLI::App* destroy = pool->add_subcommand("destroy", "Remove a pool");
  destroy->add_option("uri", uri, uri_help);
  destroy->add_flag("--force", force, "Destroy even while hosts are attached");
  CLI::App* attach = pool->add_subcommand(
      "attach", "Attach as a host for a while and print the other hosts as they are seen");
  attach->add_option("uri", uri, uri_help);
  attach->add_option("--slot", slot, "Host slot to take (default: $CXLRT_HOST_ID or first free)")
      ->check(CLI::Range(-1, 4095));
  attach->add_option("--seconds", seconds, "How long to stay attached")
      ->check(CLI::Range(0.0, 86400.0));
  attach->add_option("--interval-ms", interval_ms, "Print period")->check(CLI::Range(10, 600000));
  CLI::App* fence =
      pool->add_subcommand("fence", "Fence a dead host so that its writes are ignored");
  fence->add_option("uri", uri, uri_help)->required();
  fence->add_option("slot", slot, "Host slot to fence")->required()->check(CLI::Range(0, 4095));
  fence->add_flag("--force", force, "Fence even when the host looks alive");

  int ranks = 0, hosts = 0, reps = 7, pods = 0;
  std::vector<int> pod_sizes;
  double timeout_s = 0;
  std::string run_pool;
  std::vector<std::string> command;
  CLI::App* run = app.add_subcommand(
      "run",
      "Start N ranks as processes over emulated hosts on one pool; output prefixed by rank. "
      "With --pods, P emulated pods, each with its own pool, under mpirun (docs/collectives.md, "
      "Beyond one pool). "
      "Usage: cxlrt run -n N [--hosts H] [--pool URI] -- CMD ARGS; "
      "cxlrt run --pods P -n N [--pool URI] -- CMD ARGS; cxlrt run --pod-sizes 2,3 -- CMD ARGS");
  run->add_option("-n,--ranks", ranks, "Number of ranks (processes)")->check(CLI::Range(1, 1024));
  CLI::Option* hosts_opt =
      run->add_option("--hosts", hosts,
                      "Emulated hosts the ranks are spread over (default: one per rank)")
          ->check(CLI::Range(1, 1024));
  CLI::Option* pods_opt =
      run->add_option("--pods", pods,
                      "Emulated pods, each with its own pool; pod p gets ranks [N*p/P, "
                      "N*(p+1)/P); the ranks run under mpirun, loopback TCP between them")
          ->check(CLI::Range(1, 1024));
  CLI::Option* pod_sizes_opt =
      run->add_option("--pod-sizes", pod_sizes, "Ranks of each pod, e.g. 2,3 (implies --pods)")
          ->delimiter(',')
          ->check(CLI::Range(1, 1024));
  hosts_opt->excludes(pods_opt)->excludes(pod_sizes_opt);
  run->add_option("--pool", run_pool,
                  "Pool URI; created (and destroyed after) when missing and it has size=. "
                  "Default: a fresh emu://run-PID?size=256M. With --pods, each pod's pool is "
                  "this one with -podP appended to its name (default emu://run-PID-podP)");
  run->add_option("--timeout", timeout_s, "Stop every rank after this many seconds (0: never)")
      ->check(CLI::Range(0.0, 1e7));
  run->add_option("command", command, "Command and arguments, after --")->required();

  CLI::App* kv = app.add_subcommand("kv", "The KV-cache store of a pool");
  kv->require_subcommand(1);
  std::string kv_ns, kv_key, kv_file = "-";
  CLI::App* kv_stats = kv->add_subcommand(
      "stats", "Entries, bytes, hits, misses and evictions per namespace (all hosts)");
  kv_stats->add_option("uri", uri, uri_help);
  kv_stats->add_flag("--json", json, "Machine-readable output");
  CLI::App* kv_ls = kv->add_subcommand("ls", "List the entries (namespace, key, size, owner)");
  kv_ls->add_option("uri", uri, uri_help);
  kv_ls->add_option("--namespace", kv_ns, "Only this namespace");
  kv_ls->add_flag("--json", json, "Machine-readable output");
  CLI::App* kv_put = kv->add_subcommand(
      "put",
      "Put a file (or stdin) under NAMESPACE KEY, as a host of the pool (makes the store "
      "when the pool has none)");
  kv_put->add_option("namespace", kv_ns, "Namespace")->required();
  kv_put->add_option("key", kv_key, "Key")->required();
  kv_put->add_option("file", kv_file, "File to put ('-': stdin)");
  kv_put->add_option("--pool", uri, uri_help);
  CLI::App* kv_get = kv->add_subcommand("get", "Get NAMESPACE KEY into a file (or stdout)");
  kv_get->add_option("namespace", kv_ns, "Namespace")->required();
  kv_get->add_option("key", kv_key, "Key")->required();
  kv_get->add_option("-o,--output", kv_file, "Output file ('-': stdout)");
  kv_get->add_option("--pool", uri, uri_help);
  std::string handoff_block = "256K";
  int handoff_blocks = 8;
  double handoff_timeout = 30;
  CLI::App* kv_handoff = kv->add_subcommand(
      "handoff",
      "Demo, one rank per emulated host under `cxlrt run`: rank 0 (prefill) puts a chain of KV "
      "blocks, the other ranks (decode) look the chain up, pin it and get every block verified");
  kv_handoff->add_option("--block", handoff_block, "Block size (B, K, M)");
  kv_handoff->add_option("--blocks", handoff_blocks, "Blocks in the chain")
      ->check(CLI::Range(1, 4096));
  kv_handoff->add_option("--timeout", handoff_timeout, "Seconds a decode rank waits");

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  // --plot FILE.png on every benchmark with a sweep (tools/plot_command.cc).
  std::string plot_file;
  auto add_plot = [&plot_file](CLI::App* c) {
    c->add_option("--plot", plot_file,
                  "Also draw the sweep into this PNG with matplotlib (the JSON is kept beside it, "
                  "FILE.json)");
  };
  std::string bench_uri;
  CLI::App* bench_pool = bench->add_subcommand(
      "pool",
      "Latency and bandwidth through the coherence layer (pointer chase, streams, flag "
      "ping-pong between two emulated hosts) beside the pool's model and this machine's memcpy. "
      "Makes its own pool from URI and destroys it after");
  bench_pool->add_option("uri", bench_uri,
                         "URI of a pool to create, e.g. 'emu://b?size=256M&model=switch' "
                         "(default emu://bench-PID?size=256M)");
  bench_pool->add_option("--reps", reps, "Repetitions (median and spread)")
      ->check(CLI::Range(1, 1000));
  bench_pool->add_flag("--json", json, "Machine-readable output");

  std::string alloc_uri;
  int alloc_reps = 5;
  CLI::App* bench_alloc = bench->add_subcommand(
      "alloc",
      "Allocate+free pairs per second of the pooled allocator (64 B - 1 MiB; one host, two "
      "hosts) beside glibc malloc and mimalloc, and frees across threads and hosts (handoffs, "
      "local and remote list frees). Makes its own pool");
  bench_alloc->add_option("--pool", alloc_uri,
                          "URI of a pool to create (default emu://bench-alloc-PID?size=1G)");
  bench_alloc->add_option("--reps", alloc_reps, "Repetitions (medians)")->check(CLI::Range(1, 100));
  std::vector<uint64_t> alloc_sizes;
  bench_alloc->add_option("--sizes", alloc_sizes, "Block sizes in bytes (default 64 B .. 1 MiB)")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  bench_alloc->add_flag("--json", json, "Machine-readable output");
  add_plot(bench_alloc);

  bench::KvBenchOptions kvb;
  std::vector<std::string> kv_blocks;
  std::string kv_ws = "256M";
  CLI::App* bench_kv = bench->add_subcommand(
      "kv",
      "KV-cache store: put and get GB/s and ops/s per block size (one at a time and batched; host "
      "0 puts, the others get), Lookup latency for 1 and 64 keys, beside this machine's memcpy. "
      "Makes its own pool");
  bench_kv->add_option("--block", kv_blocks, "Block sizes (default 16K,256K,2M)")->delimiter(',');
  bench_kv->add_option("--hosts", kvb.hosts, "Emulated hosts (1 writer, the rest read)")
      ->check(CLI::Range(1, 8));
  bench_kv->add_option("--reps", kvb.reps, "Repetitions (medians)")->check(CLI::Range(1, 100));
  bench_kv->add_option("--working-set", kv_ws, "Bytes put per size and repetition");
  bench_kv->add_option("--batch", kvb.batch, "Items per BatchPut / BatchGet")
      ->check(CLI::Range(1, 4096));
  bench_kv->add_option("--pool", kvb.uri, "URI of a pool to create (default emu://bench-kv-PID)");
  bench_kv->add_flag("--device", kvb.device,
                     "Values put from and got into GPU memory, beside pinned cudaMemcpy");
  bench_kv->add_flag("--json", json, "Machine-readable output");
  add_plot(bench_kv);

  // One subcommand per collective, nccl-tests' flags.
  bench::CollBenchOptions coll;
  std::string coll_min = "8", coll_max = "64M";
  std::vector<std::pair<CLI::App*, std::string>> coll_apps;
  for (const char* name : {"allreduce", "reducescatter", "allgather", "broadcast", "reduce",
                           "gather", "scatter", "alltoall", "sendrecv"}) {
    CLI::App* c = bench->add_subcommand(
        name, absl::StrCat("nccl-tests' ", name,
                           " over the pool: time, algbw, busbw, #wrong per size, out of place "
                           "and in place, beside this machine's memcpy bandwidth"));
    c->add_option("-b,--minbytes", coll_min, "Smallest size (B, K, M, G)");
    c->add_option("-e,--maxbytes", coll_max, "Largest size");
    c->add_option("-f,--stepfactor", coll.factor, "Size multiplier per step")
        ->check(CLI::Range(2, 1024));
    c->add_option("-n,--iters", coll.iters, "Timed iterations")->check(CLI::Range(1, 1000000));
    c->add_option("-w,--warmup_iters", coll.warmup, "Warm-up iterations")
        ->check(CLI::Range(0, 1000000));
    c->add_option("-c,--check", coll.check, "Check the results (0: no)")->check(CLI::Range(0, 1));
    c->add_option("-d,--datatype", coll.type,
                  "int8 .. uint64, float16|half, bfloat16, float, double");
    c->add_option("-o,--op", coll.op, "sum, prod, min, max, avg");
    c->add_option("-r,--root", coll.root, "Root rank of rooted collectives");
    c->add_option("--ranks", coll.ranks,
                  "Ranks to start as emulated hosts (ignored under mpirun, srun, torchrun, "
                  "cxlrt run)")
        ->check(CLI::Range(1, 64));
    c->add_option("--pool", coll.pool,
                  "Pool URI: made and destroyed by the run (default emu://bench-coll-PID); "
                  "under a launcher, the shared pool (default CXLRT_POOL)");
    c->add_flag("--in-pool", coll.in_pool, "Buffers allocated in the pool (zero-copy)");
    c->add_flag("--device", coll.device,
                "Buffers in GPU memory (the CUDA engine; each rank on the current GPU)");
    c->add_flag("--json", json, "One JSON object per size");
    add_plot(c);
    coll_apps.emplace_back(c, name);
  }

  bench::AllToAllVBenchOptions a2av;
  CLI::App* bench_a2av = bench->add_subcommand(
      "alltoallv",
      "The all-to-all-v of an MoE layer: each rank routes its tokens to experts with a skewed "
      "distribution (fixed seed), then the dispatch and the combine (the reverse splits) are "
      "timed call by call (medians of the slowest rank), beside this machine's memcpy bandwidth");
  bench_a2av->add_option("--tokens", a2av.tokens, "Tokens per rank")->check(CLI::Range(0, 1 << 24));
  bench_a2av->add_option("--hidden", a2av.hidden, "bf16 elements per token")
      ->check(CLI::Range(1, 1 << 20));
  bench_a2av->add_option("--experts-per-rank", a2av.experts_per_rank, "Experts on each rank")
      ->check(CLI::Range(1, 4096));
  bench_a2av->add_option("--topk", a2av.topk, "Experts per token (a token goes once to a rank)")
      ->check(CLI::Range(1, 64));
  bench_a2av->add_option("--skew", a2av.skew,
                         "uniform, zipf:S (expert e weighs 1/(e+1)^S), hot:K:F (K hot experts "
                         "take a fraction F)");
  bench_a2av->add_option("--seed", a2av.seed, "Seed of the routing");
  bench_a2av->add_option("--ranks", a2av.ranks, "Ranks to start as emulated hosts")
      ->check(CLI::Range(1, 64));
  bench_a2av->add_option("-n,--iters", a2av.iters, "Timed calls of each phase")
      ->check(CLI::Range(1, 1000000));
  bench_a2av->add_option("-w,--warmup_iters", a2av.warmup, "Warm-up calls")
      ->check(CLI::Range(0, 1000000));
  bench_a2av->add_option("-c,--check", a2av.check, "Check every element (0: no)");
  bench_a2av->add_option("--pool", a2av.pool,
                         "Pool URI, made and destroyed by the run (default emu://bench-a2av-PID)");
  bench_a2av->add_flag("--in-pool", a2av.in_pool,
                       "Buffers allocated in the pool (sends posted in place)");
  bench_a2av->add_flag("--json", json, "One JSON object per phase");
  add_plot(bench_a2av);

  bench::PodsBenchOptions podsb;
  std::string pods_min = "64K", pods_max = "16M", pods_chunk = "0";
  CLI::App* bench_pods = bench->add_subcommand(
      "pods",
      "A hierarchical collective (all-reduce by default) across emulated pods beside one pool of "
      "the same ranks, with each tier's time (pod steps, engine waits) and each tier alone");
  bench_pods->add_option("--pods", podsb.pods, "Emulated pods (each its own pool)")
      ->check(CLI::Range(1, 64));
  bench_pods->add_option("--ranks", podsb.ranks, "Ranks in all (pod p: ranks p*N/P ..)")
      ->check(CLI::Range(1, 64));
  bench_pods->add_option("-b,--minbytes", pods_min, "Smallest size (B, K, M, G)");
  bench_pods->add_option("-e,--maxbytes", pods_max, "Largest size");
  bench_pods->add_option("-f,--stepfactor", podsb.factor, "Size multiplier per step")
      ->check(CLI::Range(2, 1024));
  bench_pods->add_option("-n,--iters", podsb.iters, "Timed iterations")
      ->check(CLI::Range(1, 1000000));
  bench_pods->add_option("-w,--warmup_iters", podsb.warmup, "Warm-up iterations")
      ->check(CLI::Range(0, 1000000));
  bench_pods->add_option("--chunk", pods_chunk, "Pipeline chunk (0: the default, 4 MiB)");
  bench_pods->add_option("--engine", podsb.engine, "Engine between pods (pool)");
  bench_pods->add_option("--collective", podsb.collective,
                         "allreduce, reducescatter, allgather, broadcast, reduce, alltoall");
  bench_pods->add_flag("--json", json, "One JSON object per size");
  add_plot(bench_pods);

  bench::CeilingOptions ceiling;
  std::string ceiling_min = "64K", ceiling_max = "64M", ceiling_chunk = "1M";
  CLI::App* bench_ceiling = bench->add_subcommand(
      "ceiling",
      "The limit of a 2-rank all-reduce on this machine: two processes over a memfd, cxlrt's "
      "kernels, the least protocol that works (busbw per size)");
  bench_ceiling->add_option("-b,--minbytes", ceiling_min, "Smallest size (B, K, M, G)");
  bench_ceiling->add_option("-e,--maxbytes", ceiling_max, "Largest size");
  bench_ceiling->add_option("-f,--stepfactor", ceiling.factor, "Size multiplier per step")
      ->check(CLI::Range(2, 1024));
  bench_ceiling->add_option("--chunk", ceiling_chunk, "Chunk of the pipeline");
  bench_ceiling->add_option("-n,--iters", ceiling.iters, "Timed iterations")
      ->check(CLI::Range(1, 1000000));
  bench_ceiling->add_option("-w,--warmup_iters", ceiling.warmup, "Warm-up iterations")
      ->check(CLI::Range(0, 1000000));
  bench_ceiling->add_flag("--json", json, "One JSON object per size");
  add_plot(bench_ceiling);

  bench::DmaBenchOptions dma;
  std::string dma_min = "64K", dma_max = "256M";
  CLI::App* bench_dma = bench->add_subcommand(
      "dma",
      "The GPU data path's limits: pool <-> device DMA per size (each direction and both at once) "
      "beside pinned cudaMemcpy and the device-to-device copy rate. Needs a GPU");
  bench_dma->add_option("-b,--minbytes", dma_min, "Smallest size (B, K, M, G)");
  bench_dma->add_option("-e,--maxbytes", dma_max, "Largest size");
  bench_dma->add_option("-n,--iters", dma.iters, "Timed copies per size (median)")
      ->check(CLI::Range(1, 100000));
  bench_dma->add_option("--pool", dma.uri, "URI of a pool to create (default emu://bench-dma-PID)");
  bench_dma->add_flag("--json", json, "One JSON object per size");
  add_plot(bench_dma);

  bench::DoorbellBenchOptions bell;
  std::string bell_min = "8", bell_max = "1M";
  CLI::App* bench_bell = bench->add_subcommand(
      "doorbell",
      "Latency of a hop through the pool from device memory to device memory, per way of "
      "ringing the peer's doorbell (host, copy engine, kernel, stream memory operation). "
      "Needs a GPU");
  bench_bell->add_option("-b,--minbytes", bell_min, "Smallest size (B, K, M, G; multiple of 8)");
  bench_bell->add_option("-e,--maxbytes", bell_max, "Largest size");
  bench_bell->add_option("-f,--stepfactor", bell.factor, "Size multiplier")
      ->check(CLI::Range(2, 1024));
  bench_bell->add_option("-n,--rounds", bell.rounds, "Round trips per run")
      ->check(CLI::Range(1, 100000));
  bench_bell->add_option("--reps", bell.reps, "Runs per size and doorbell (median)")
      ->check(CLI::Range(1, 1000));
  bench_bell->add_option("--pool", bell.uri,
                         "URI of a pool to create (default emu://bench-doorbell-PID)");
  bench_bell->add_flag("--json", json, "One JSON object per size");
  add_plot(bench_bell);

  CLI::App* metrics = app.add_subcommand(
      "metrics", "Every host's metrics and the pool's, in the Prometheus text format");
  metrics->add_option("uri", uri, uri_help);
  std::string serve_address = "127.0.0.1";
  int serve_port = 9464;
  double serve_seconds = 0;
  CLI::App* serve_metrics = app.add_subcommand(
      "serve-metrics", "Serve the pool's metrics at /metrics (and /health) for Prometheus");
  serve_metrics->add_option("uri", uri, uri_help);
  serve_metrics->add_option("--port", serve_port, "TCP port (0: any free one)")
      ->check(CLI::Range(0, 65535));
  serve_metrics->add_option("--address", serve_address, "Address to listen on");
  serve_metrics->add_option("--seconds", serve_seconds, "Stop after this long (0: at a signal)")
      ->check(CLI::Range(0.0, 1e9));

  tools::TopOptions top_opts;
  bool top_once = false;
  CLI::App* top = app.add_subcommand(
      "top", "A live view of the pool: hosts, KV namespaces, communicators, allocator (q quits)");
  top->add_option("uri", uri, uri_help);
  top->add_option("-d,--period", top_opts.period_s, "Seconds between refreshes")
      ->check(CLI::Range(0.05, 3600.0));
  CLI::Option* top_iterations =
      top->add_option("-n,--iterations", top_opts.iterations,
                      "Print this many frames as text, a period apart, and exit (0: the live view)")
          ->check(CLI::Range(0, 1000000));
  top->add_flag("--once", top_once, "Print one frame as text and exit (--iterations 1)")
      ->excludes(top_iterations);

  CLI::App* doctor = app.add_subcommand("doctor", "What this machine offers: NUMA, CXL, DAX, CUDA");
  doctor->add_flag("--json", json, "Machine-readable output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::printf("%s", app.help("", CLI::AppFormatMode::All).c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    // Help of the innermost subcommand that was named.
    const CLI::App* where = &app;
    for (const CLI::App* sub = &app; sub != nullptr;) {
      const CLI::App* next = nullptr;
      for (const CLI::App* s : sub->get_subcommands()) next = s;
      if (next) where = next;
      sub = next;
    }
    return Usage(*where, e);
  }
  if (verbose) runtime::SetLogLevel(runtime::LogLevel::kInfo);
  if (absl::Status s = runtime::ConfigStatus(); !s.ok()) {
    std::fprintf(stderr, "cxlrt: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  if (*create) return tools::PoolCreate(uri);
  if (*info) return tools::PoolInfo(uri, json);
  if (*check) return tools::PoolCheck(uri, json);
  if (*destroy) return tools::PoolDestroy(uri, force);
  if (*attach) return tools::PoolAttach(uri, slot, seconds, interval_ms);
  if (*fence) return tools::PoolFence(uri, slot, force);
  if (*doctor) return tools::Doctor(json);
  if (*metrics) return tools::Metrics(uri);
  if (*serve_metrics) return tools::ServeMetrics(uri, serve_address, serve_port, serve_seconds);
  if (*top) {
    if (top_once) top_opts.iterations = 1;
    return tools::Top(uri, top_opts);
  }
  if (*kv_stats) return tools::KvStats(uri, json);
  if (*kv_ls) return tools::KvList(uri, kv_ns, json);
  if (*kv_put) return tools::KvPut(uri, kv_ns, kv_key, kv_file);
  if (*kv_get) return tools::KvGet(uri, kv_ns, kv_key, kv_file);
  if (*kv_handoff) {
    auto block = runtime::ParseByteSize(handoff_block, "--block");
    if (!block.ok() || *block == 0) {
      std::fprintf(stderr, "cxlrt kv handoff: bad --block %s\n", handoff_block.c_str());
      return 2;
    }
    return tools::KvHandoff(*block, handoff_blocks, handoff_timeout);
  }
  if (*run) {
    if (pods > 0 || !pod_sizes.empty()) {
      return tools::RunPods(ranks, pods, pod_sizes, run_pool, timeout_s, command);
    }
    if (ranks == 0) {
      std::fprintf(stderr, "cxlrt run: -n N is required (the number of ranks)\n");
      return 2;
    }
    return tools::Run(ranks, hosts, run_pool, timeout_s, command);
  }
  // The benchmarks, as one call, so that --plot can run them with their
  // output going to its JSON file. A rank other than 0 under a launcher
  // prints nothing and plots nothing.
  const bool plotting = !plot_file.empty() && (!collectives::RankFromEnvironment().ok() ||
                                               collectives::RankFromEnvironment()->rank == 0);
  const bool print_json = json;
  if (plotting) json = true;
  auto run_bench = [&]() -> int {
    if (*bench_kv) {
      for (const std::string& b : kv_blocks) {
        auto v = runtime::ParseByteSize(b, "--block");
        if (!v.ok() || *v == 0) {
          std::fprintf(stderr, "cxlrt bench kv: bad block size '%s'\n", b.c_str());
          return 2;
        }
        kvb.blocks.push_back(*v);
      }
      auto ws = runtime::ParseByteSize(kv_ws, "--working-set");
      if (!ws.ok()) {
        std::fprintf(stderr, "cxlrt bench kv: %s\n", std::string(ws.status().message()).c_str());
        return 2;
      }
      kvb.working_set = *ws;
      kvb.json = json;
      return bench::RunKvBench(kvb);
    }
    if (*bench_alloc) return bench::RunAllocBench({alloc_uri, alloc_reps, json, alloc_sizes});
    if (*bench_a2av) {
      a2av.json = json;
      return bench::RunAllToAllVBench(a2av);
    }
    for (const auto& [c, name] : coll_apps) {
      if (!*c) continue;
      auto lo = runtime::ParseByteSize(coll_min, "-b");
      auto hi = runtime::ParseByteSize(coll_max, "-e");
      if (!lo.ok() || !hi.ok()) {
        std::fprintf(stderr, "cxlrt bench %s: %s\n", name.c_str(),
                     std::string((lo.ok() ? hi : lo).status().message()).c_str());
        return 2;
      }
      coll.collective = name;
      coll.min_bytes = *lo;
      coll.max_bytes = *hi;
      coll.json = json;
      return bench::RunCollBench(coll);
    }
    if (*bench_pods) {
      auto lo = runtime::ParseByteSize(pods_min, "-b");
      auto hi = runtime::ParseByteSize(pods_max, "-e");
      auto chunk = runtime::ParseByteSize(pods_chunk, "--chunk");
      for (const auto* v : {&lo, &hi, &chunk}) {
        if (!v->ok()) {
          std::fprintf(stderr, "cxlrt bench pods: %s\n",
                       std::string(v->status().message()).c_str());
          return 2;
        }
      }
      podsb.min_bytes = *lo;
      podsb.max_bytes = *hi;
      podsb.chunk_bytes = *chunk;
      podsb.json = json;
      return bench::RunPodsBench(podsb);
    }
    if (*bench_ceiling) {
      auto lo = runtime::ParseByteSize(ceiling_min, "-b");
      auto hi = runtime::ParseByteSize(ceiling_max, "-e");
      auto chunk = runtime::ParseByteSize(ceiling_chunk, "--chunk");
      for (const auto* v : {&lo, &hi, &chunk}) {
        if (!v->ok()) {
          std::fprintf(stderr, "cxlrt bench ceiling: %s\n",
                       std::string(v->status().message()).c_str());
          return 2;
        }
      }
      ceiling.min_bytes = *lo;
      ceiling.max_bytes = *hi;
      ceiling.chunk_bytes = *chunk;
      ceiling.json = json;
      return bench::RunCeilingProbe(ceiling);
    }
    // -b/-e of the GPU benchmarks: false (after saying why) when they do not parse.
    auto size_range = [](const char* cmd, const std::string& lo_text, const std::string& hi_text,
                         uint64_t* lo, uint64_t* hi) {
      auto l = runtime::ParseByteSize(lo_text, "-b");
      auto h = runtime::ParseByteSize(hi_text, "-e");
      if (!l.ok() || !h.ok() || *l == 0 || *h < *l) {
        std::fprintf(stderr, "cxlrt bench %s: bad -b/-e (%s, %s)\n", cmd, lo_text.c_str(),
                     hi_text.c_str());
        return false;
      }
      *lo = *l;
      *hi = *h;
      return true;
    };
    if (*bench_bell) {
      if (!size_range("doorbell", bell_min, bell_max, &bell.min_bytes, &bell.max_bytes)) return 2;
      bell.json = json;
      return bench::RunDoorbellBench(bell);
    }
    if (*bench_dma) {
      if (!size_range("dma", dma_min, dma_max, &dma.min_bytes, &dma.max_bytes)) return 2;
      dma.json = json;
      return bench::RunDmaBench(dma);
    }
    if (*bench_pool) {
      if (bench_uri.empty()) bench_uri = "emu://bench-" + std::to_string(getpid()) + "?size=256M";
      return bench::RunPoolBench({bench_uri, reps, json});
    }
    return 2;
  };
  if (!*bench) return 2;
  if (!plotting) return run_bench();
  std::string what;
  for (const CLI::App* s : bench->get_subcommands()) what = s->get_name();
  return tools::BenchWithPlot(what, plot_file, print_json, run_bench);
}
