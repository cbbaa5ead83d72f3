#include "bench/pool_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness.h"
#include "cxlrt/emulation/access_model.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/units.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using runtime::Coherence;
using runtime::NowNs;
using runtime::PoolOffset;

constexpr size_t kChunk = 1 << 20;  // streaming granule

struct Row {
  std::string metric;
  std::string unit;  // "ns" or "GB/s"
  Summary measured;
  std::optional<double> model;  // what the model says it should be
};

// Dependent 8-byte loads along a random cycle over the lines of
// [base, base+bytes): each hop is a Fetch (invalidate + load), the read a
// remote host would do. Returns ns per hop.
double PointerChase(Coherence& c, PoolOffset base, size_t bytes, uint64_t hops) {
  PoolOffset at = base;
  const int64_t t0 = NowNs();
  for (uint64_t i = 0; i < hops; ++i) {
    uint64_t next;
    c.Fetch(&next, at, sizeof(next));
    at = next;
  }
  const int64_t t1 = NowNs();
  if (at < base || at >= base + bytes) std::abort();  // the chain was broken
  return static_cast<double>(t1 - t0) / static_cast<double>(hops);
}

void BuildChain(Coherence& c, PoolOffset base, size_t bytes) {
  const size_t lines = bytes / runtime::kCacheLine;
  std::vector<uint32_t> order(lines);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin() + 1, order.end(), std::mt19937_64(42));
  std::vector<uint64_t> image(bytes / 8, 0);
  for (size_t i = 0; i < lines; ++i) {
    const uint64_t from = order[i], to = order[(i + 1) % lines];
    image[from * (runtime::kCacheLine / 8)] = base + to * runtime::kCacheLine;
  }
  c.CopyToPool(base, image.data(), bytes);
}

// Two emulated hosts bounce a counter through two flags (each written by
// one of them, 128 B apart). Returns ns per one-way trip, or nullopt when
// the peer failed.
std::optional<double> PingPong(runtime::Pool& pool, const std::string& open_uri, PoolOffset flags,
                               uint64_t rounds, uint64_t base) {
  const PoolOffset ping = flags, pong = flags + runtime::kWriterSeparation;
  fflush(nullptr);
  pid_t peer = fork();
  if (peer == 0) {
    auto p = runtime::Pool::Open(open_uri);
    if (!p.ok()) _exit(3);
    Coherence& c = (*p)->coherence();
    const int64_t deadline = NowNs() + 60'000'000'000;
    for (uint64_t i = base + 1; i <= base + rounds; ++i) {
      while (c.LoadFlag(ping) < i) {
        if (NowNs() > deadline) _exit(4);
      }
      c.StoreFlag(pong, i);
    }
    _exit(0);
  }
  Coherence& c = pool.coherence();
  const int64_t deadline = NowNs() + 60'000'000'000;
  // The first round waits for the peer to open the pool; time the rest.
  int64_t t0 = 0;
  bool ok = true;
  for (uint64_t i = base + 1; i <= base + rounds && ok; ++i) {
    if (i == base + 2) t0 = NowNs();
    c.StoreFlag(ping, i);
    while (c.LoadFlag(pong) < i) {
      if (NowNs() > deadline) {
        ok = false;
        break;
      }
    }
  }
  const int64_t t1 = NowNs();
  if (!ok) kill(peer, SIGKILL);
  int status = 0;
  waitpid(peer, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return static_cast<double>(t1 - t0) / (2.0 * static_cast<double>(rounds - 1));
}

void PrintTable(const std::string& uri, const std::string& model, const Summary& memcpy_bw,
                const std::vector<Row>& rows) {
  std::printf("# cxlrt bench pool %s\n", uri.c_str());
  std::printf("# model: %s\n", model.c_str());
  std::printf("# this machine's memcpy: %s (median of %d; %s..%s), one thread, 64 MiB\n",
              FormatGbps(memcpy_bw.median).c_str(), memcpy_bw.samples,
              FormatGbps(memcpy_bw.min).c_str(), FormatGbps(memcpy_bw.max).c_str());
  std::printf("%-28s %12s %24s %12s %9s %9s\n", "metric", "median", "spread (min..max)", "model",
              "/model", "/memcpy");
  for (const Row& r : rows) {
    const bool ns = r.unit == "ns";
    auto fmt = [&](double v) { return ns ? FormatNs(v) : FormatGbps(v); };
    std::string spread = absl::StrCat(fmt(r.measured.min), "..", fmt(r.measured.max));
    std::string model_s = r.model ? fmt(*r.model) : "-";
    std::string vs_model = r.model ? absl::StrFormat("%.2f", r.measured.median / *r.model) : "-";
    std::string vs_memcpy =
        ns ? "-" : absl::StrFormat("%.2f", r.measured.median / memcpy_bw.median);
    std::printf("%-28s %12s %24s %12s %9s %9s\n", r.metric.c_str(), fmt(r.measured.median).c_str(),
                spread.c_str(), model_s.c_str(), vs_model.c_str(), vs_memcpy.c_str());
  }
}

}  // namespace

int RunPoolBench(const PoolBenchOptions& o) {
  auto scratch = ScratchPool::Create(o.uri, 256ull << 20);
  if (!scratch.ok()) {
    std::fprintf(stderr, "cxlrt bench pool: %s\n", std::string(scratch.status().message()).c_str());
    return 1;
  }
  runtime::Pool* pool = &(*scratch)->pool();
  const runtime::PoolUri& uri = (*scratch)->uri();
  const std::string& open_uri = (*scratch)->open_uri();

  Coherence& c = pool->coherence();
  const emulation::ModelParams model = emulation::ModelFromUri(uri);
  const bool has_model = uri.HasModel();
  const std::string model_text = c.model() ? c.model()->Describe() : "off";

  const Summary memcpy_bw = MeasureMemcpy(64 << 20, o.reps);

  // The heap: [flags page][chase region][stream region A][stream region B].
  const PoolOffset heap = pool->header().heap_offset;
  const uint64_t heap_size = pool->header().heap_size;
  const PoolOffset flags = heap;
  const uint64_t avail = heap_size - 4096;
  const size_t chase_bytes = std::min<uint64_t>(64 << 20, avail / 4) & ~uint64_t{4095};
  const size_t stream_bytes = std::max<uint64_t>(
      kChunk, std::min<uint64_t>(64 << 20, (avail - chase_bytes) / 2) & ~(kChunk - 1));
  const PoolOffset chase = heap + 4096;
  const PoolOffset region_a = chase + chase_bytes;
  const PoolOffset region_b = region_a + stream_bytes;
  if (region_b + stream_bytes > pool->size()) {
    std::fprintf(stderr, "cxlrt bench pool: the pool is too small; give it size=64M or more\n");
    return 1;
  }

  std::vector<Row> rows;
  BuildChain(c, chase, chase_bytes);
  // About 50 ms a repetition whatever the latency.
  const double probe = PointerChase(c, chase, chase_bytes, 2000);
  const uint64_t hops = std::clamp<uint64_t>(static_cast<uint64_t>(50e6 / probe), 2000, 2000000);
  rows.push_back(
      {"pointer-chase latency", "ns",
       Summarize(Repeat(o.reps, [&] { return PointerChase(c, chase, chase_bytes, hops); })),
       has_model ? std::optional<double>(model.latency_ns) : std::nullopt});

  std::unique_ptr<char[]> local(new char[kChunk]);
  Prefault(local.get(), kChunk);
  std::optional<double> model_bw;
  if (has_model && model.bw_gbps > 0) model_bw = model.bw_gbps;
  auto stream = [&](auto&& op, double bytes_per_chunk) {
    return Summarize(Repeat(o.reps, [&] {
      const int64_t t0 = NowNs();
      for (uint64_t off = 0; off < stream_bytes; off += kChunk) op(off);
      return bytes_per_chunk * static_cast<double>(stream_bytes / kChunk) /
             static_cast<double>(NowNs() - t0);
    }));
  };
  rows.push_back(
      {"stream write", "GB/s",
       stream([&](uint64_t off) { c.CopyToPool(region_a + off, local.get(), kChunk); }, kChunk),
       model_bw});
  rows.push_back(
      {"stream read", "GB/s",
       stream([&](uint64_t off) { c.CopyFromPool(local.get(), region_a + off, kChunk); }, kChunk),
       model_bw});
  rows.push_back({"stream copy (read+write B)", "GB/s",
                  stream(
                      [&](uint64_t off) {
                        c.CopyFromPool(local.get(), region_a + off, kChunk);
                        c.CopyToPool(region_b + off, local.get(), kChunk);
                      },
                      2.0 * kChunk),
                  model_bw});

  // Ping-pong: about 50 ms a repetition.
  std::vector<double> one_way;
  uint64_t base = 0;
  for (int r = 0; r < o.reps; ++r) {
    const uint64_t rounds = has_model && model.latency_ns > 0
                                ? std::clamp<uint64_t>(25'000'000 / model.latency_ns, 50, 20000)
                                : 20000;
    auto t = PingPong(*pool, open_uri, flags, rounds, base);
    base += rounds;
    if (!t) {
      std::fprintf(stderr, "cxlrt bench pool: the ping-pong peer failed\n");
      return 1;
    }
    one_way.push_back(*t);
  }
  rows.push_back({"flag ping-pong, one way", "ns", Summarize(one_way), std::nullopt});

  if (o.json) {
    nlohmann::json j;
    j["benchmark"] = "pool";
    j["uri"] = uri.ToString();
    j["model"] = model_text;
    if (has_model) {
      j["model_latency_ns"] = model.latency_ns;
      j["model_bw_gbps"] = model.bw_gbps;
    }
    j["memcpy_gbps"] = {
        {"median", memcpy_bw.median}, {"min", memcpy_bw.min}, {"max", memcpy_bw.max}};
    for (const Row& r : rows) {
      nlohmann::json row = {{"metric", r.metric},          {"unit", r.unit},
                            {"median", r.measured.median}, {"min", r.measured.min},
                            {"max", r.measured.max},       {"samples", r.measured.samples}};
      if (r.model) row["model"] = *r.model;
      if (r.unit == "GB/s") row["fraction_of_memcpy"] = r.measured.median / memcpy_bw.median;
      j["results"].push_back(row);
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    PrintTable(uri.ToString(), model_text, memcpy_bw, rows);
  }
  return 0;
}

}  // namespace cxlrt::bench
