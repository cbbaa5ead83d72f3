// The `cxlrt` command as a user runs it: exit codes, text, and JSON that
// parses.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cli_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::tools {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;

using Result = ::cxlrt::testing::CliResult;
using ::cxlrt::testing::Cxlrt;
using ::cxlrt::testing::CxlrtStdout;
using ::cxlrt::testing::Quote;

TEST(CliTest, PoolLifecycle) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "256M");
  const std::string uri = OpenUri(create);
  Result r = Cxlrt("pool create " + Quote(create));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("256 MiB"), std::string::npos) << r.out;

  r = Cxlrt("pool info " + Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("coherence   hardware"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 attached, 0 fenced, 64 free"), std::string::npos) << r.out;

  r = CxlrtStdout("pool info --json " + Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["size"], 256u << 20);
  EXPECT_EQ(j["coherence"], "hardware");
  EXPECT_EQ(j["format"]["version"], 2);
  EXPECT_EQ(j["format"]["host_slots"], 64);
  EXPECT_TRUE(j["hosts"].empty());

  r = Cxlrt("pool check " + Quote(uri));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("healthy"), std::string::npos);
  r = CxlrtStdout("pool check --json " + Quote(uri));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["healthy"], true);

  r = Cxlrt("pool create " + Quote(create));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;

  r = Cxlrt("pool destroy " + Quote(uri));
  EXPECT_EQ(r.code, 0) << r.out;
  r = Cxlrt("pool info " + Quote(uri));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no pool"), std::string::npos) << r.out;
}

TEST(CliTest, CheckReportsCorruptionWithExitCodeOne) {
  TempDir dir;
  const std::string create = PoolUri(dir);
  ASSERT_EQ(Cxlrt("pool create " + Quote(create)).code, 0);
  const std::string uri = OpenUri(create);
  // Scribble over the header's name field: the checksum no longer matches.
  std::string file = dir.path() + "/cxlrt-" + uri.substr(6, uri.find('?') - 6) + ".pool";
  FILE* f = fopen(file.c_str(), "r+");
  ASSERT_NE(f, nullptr);
  fseek(f, 100, SEEK_SET);
  fputs("garbage", f);
  fclose(f);
  Result r = Cxlrt("pool check " + Quote(uri));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("header checksum"), std::string::npos) << r.out;
  r = CxlrtStdout("pool check --json " + Quote(uri));
  EXPECT_EQ(r.code, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["healthy"], false);
  EXPECT_EQ(j["problems"].size(), 1u);
  EXPECT_EQ(Cxlrt("pool destroy " + Quote(uri)).code, 0);
}

TEST(CliTest, TwoAttachedHostsShowInInfo) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "16M");
  ASSERT_EQ(Cxlrt("pool create " + Quote(create)).code, 0);
  const std::string uri = OpenUri(create);
  std::string cmd =
      std::string(CXLRT_BIN) + " pool attach " + Quote(uri) + " --seconds 3 --interval-ms 200";
  FILE* a = popen(cmd.c_str(), "r");
  FILE* b = popen(cmd.c_str(), "r");
  absl::SleepFor(absl::Milliseconds(600));
  Result info = CxlrtStdout("pool info --json " + Quote(uri));
  std::string out_a, out_b;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), a)) > 0) out_a.append(buf, n);
  while ((n = fread(buf, 1, sizeof(buf), b)) > 0) out_b.append(buf, n);
  EXPECT_EQ(pclose(a), 0) << out_a;
  EXPECT_EQ(pclose(b), 0) << out_b;
  ASSERT_EQ(info.code, 0);
  auto j = nlohmann::json::parse(info.out);
  ASSERT_EQ(j["hosts"].size(), 2u) << info.out;
  for (const auto& h : j["hosts"]) {
    EXPECT_EQ(h["state"], "attached");
    EXPECT_EQ(h["heartbeat_moving"], true);
  }
  for (const std::string& out : {out_a, out_b}) {
    EXPECT_NE(out.find("alive pid"), std::string::npos) << out;
    EXPECT_NE(out.find("detached"), std::string::npos) << out;
  }
}

// A host that saw another one leave says "now", not "yet".
TEST(CliTest, AttachSaysWhenTheOtherHostHasLeft) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "16M");
  ASSERT_EQ(Cxlrt("pool create " + Quote(create)).code, 0);
  const std::string uri = OpenUri(create);
  const std::string cmd = std::string(CXLRT_BIN) + " pool attach " + Quote(uri);
  FILE* a = popen((cmd + " --seconds 5 --interval-ms 100").c_str(), "r");
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(Cxlrt("pool attach " + Quote(uri) + " --seconds 1 --interval-ms 100").code, 0);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), a)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(a), 0) << out;
  const size_t saw = out.find("alive pid"), gone = out.find("no other host now");
  EXPECT_NE(saw, std::string::npos) << out;
  EXPECT_NE(gone, std::string::npos) << out;
  EXPECT_LT(saw, gone) << out;
  EXPECT_EQ(out.find("no other host yet", saw), std::string::npos) << out;
}

TEST(CliTest, DoctorSaysWhatThisMachineHas) {
  Result r = Cxlrt("doctor");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("write back with"), std::string::npos);
  r = CxlrtStdout("doctor --json");
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("numa_nodes"));
  EXPECT_TRUE(j.contains("cuda"));
  EXPECT_TRUE(j["config"].contains("CXLRT_LEASE_MS"));
  if (j["cxl_present"] == false) {
    EXPECT_NE(j["verdict"].get<std::string>().find("no CXL device on this machine"),
              std::string::npos);
    EXPECT_NE(j["verdict"].get<std::string>().find("emulated pool"), std::string::npos);
  }
}

TEST(CliTest, DoctorPrintsTheCpuLevelThatCxlrtCpuLevelOnlyLowers) {
  Result r = Cxlrt("doctor");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cpu level"), std::string::npos) << r.out;
  auto doctor = [](const std::string& level) {
    Result r = CxlrtStdout("doctor --json >/dev/null; CXLRT_CPU_LEVEL=" + level + " " +
                           std::string(CXLRT_BIN) + " doctor --json");
    EXPECT_EQ(r.code, 0) << level;
    return nlohmann::json::parse(r.out)["cpu"];
  };
  const auto cpu = doctor("auto");
  EXPECT_EQ(cpu["level"], cpu["max_level"]);
  EXPECT_EQ(cpu["requested_level"], "auto");
  const auto low = doctor("baseline");
  EXPECT_EQ(low["level"], "baseline");
  EXPECT_EQ(low["requested_level"], "baseline");
  const auto high = doctor("avx512");  // never above what the CPU has
  EXPECT_EQ(high["level"], cpu["max_level"]);
  EXPECT_EQ(high["requested_level"], "avx512");
}

TEST(CliTest, WrongArgumentsPrintUsageAndExitTwo) {
  for (const char* args : {"", "frobnicate", "pool", "pool info --bogus", "pool fence",
                           "pool attach --seconds x", "doctor extra"}) {
    Result r = Cxlrt(args);
    EXPECT_EQ(r.code, 2) << "cxlrt " << args << "\n" << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << "cxlrt " << args << "\n" << r.out;
  }
  for (const char* args : {"--help", "pool --help", "pool create --help", "doctor --help"}) {
    Result r = Cxlrt(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args;
  }
}

TEST(CliTest, ABadEnvironmentVariableIsAClearError) {
  Result r = Cxlrt("doctor");
  Result bad =
      Cxlrt("doctor 2>&1 </dev/null; CXLRT_LEASE_MS=soon " + std::string(CXLRT_BIN) + " doctor");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("CXLRT_LEASE_MS='soon'"), std::string::npos) << bad.out;
}

TEST(CliTest, InfoShowsTheAllocatorAndCheckAuditsIt) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "64M");
  const std::string uri = OpenUri(create);
  {
    auto pool = runtime::Pool::Create(create);
    ASSERT_TRUE(pool.ok()) << pool.status();
    runtime::AttachOptions ao;
    ao.host_id = -1;
    auto m = runtime::Membership::Attach(**pool, ao);
    ASSERT_TRUE(m.ok()) << m.status();
    allocator::AllocatorOptions opts;
    opts.tick = absl::ZeroDuration();
    auto a = allocator::Allocator::Open(**pool, **m, opts);
    ASSERT_TRUE(a.ok()) << a.status();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*a)->Allocate(1000, {.durable = true}).ok());
    ASSERT_TRUE((*a)->AllocateNamed("cli/named", 300).ok());
    CXLRT_ASSERT_OK((*a)->Close());
    CXLRT_ASSERT_OK((*m)->Detach());
  }
  Result r = CxlrtStdout("pool info --json " + Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("allocator")) << r.out;
  EXPECT_EQ(j["allocator"]["hosts"].size(), 1u);
  EXPECT_EQ(j["allocator"]["hosts"][0]["bytes_in_use"], 5 * 1024 + 384);  // 300 B: class 384
  EXPECT_EQ(j["allocator"]["hosts"][0]["owned"], false);
  r = Cxlrt("pool info " + Quote(uri));
  EXPECT_NE(r.out.find("allocator   "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("5 x 1 KiB"), std::string::npos) << r.out;
  r = Cxlrt("pool check " + Quote(uri));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("allocator metadata"), std::string::npos) << r.out;

  // Damage the first data segment's table entry: check names it.
  {
    auto pool = runtime::Pool::Open(uri);
    ASSERT_TRUE(pool.ok());
    auto region = (*pool)->FindRegion("cxlrt.allocator");
    ASSERT_TRUE(region.ok());
    allocator::AllocatorHeaderLayout h;
    (*pool)->coherence().Fetch(&h, region->offset, sizeof(h));
    const uint64_t entry = h.segment_table + uint64_t{h.meta_segments} * 64 + 8;
    const uint32_t junk = 0xdeadbeef;
    (*pool)->coherence().Publish(entry, &junk, sizeof(junk));
  }
  r = Cxlrt("pool check " + Quote(uri));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("segment table entry"), std::string::npos) << r.out;
}

TEST(CliTest, BenchPoolPrintsEveryMetricBesideTheModelAndMemcpy) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "latency_ns=2000&bw_gbps=2", "64M");
  auto r = CxlrtStdout("bench pool --json --reps 1 " + Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["memcpy_gbps"]["median"].get<double>(), 0);
  EXPECT_EQ(j["model_latency_ns"], 2000);
  std::set<std::string> metrics;
  for (const auto& row : j["results"]) {
    metrics.insert(row["metric"].get<std::string>());
    EXPECT_GT(row["median"].get<double>(), 0) << row;
  }
  EXPECT_EQ(metrics,
            (std::set<std::string>{"pointer-chase latency", "stream write", "stream read",
                                   "stream copy (read+write B)", "flag ping-pong, one way"}));
  // The model only adds delay: a modeled load never completes early.
  EXPECT_GE(j["results"][0]["median"].get<double>(), 2000 * 0.95) << j["results"][0];
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the benchmark left its pool behind";

  // Text output, and a pool that exists already is refused.
  const std::string taken = PoolUri(dir, "", "16M");
  ASSERT_EQ(Cxlrt("pool create " + Quote(taken)).code, 0);
  r = Cxlrt("bench pool --reps 1 " + Quote(taken));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("makes its own pool"), std::string::npos) << r.out;
}

TEST(CliTest, BenchAllocComparesWithGlibcAndMeasuresCrossHostFrees) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "256M");
  auto r = CxlrtStdout("bench alloc --json --reps 1 --sizes 64,300000 --pool " + Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["memcpy_gbps"].get<double>(), 0);
  // The glibc column measures glibc: nothing in the binary replaces malloc
  // (a linked libmimalloc would). Under ASan the binary's own interceptor
  // does, and the benchmark must say so.
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(j["malloc_provider"], "cxlrt");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  EXPECT_EQ(j["malloc_provider"], "cxlrt");
#else
  EXPECT_EQ(j["malloc_provider"], "libc.so.6");
#endif
#else
  EXPECT_EQ(j["malloc_provider"], "libc.so.6");
#endif
  const bool have_mimalloc = std::filesystem::exists("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["glibc_pairs_per_s"].get<double>(), 0) << row;
    if (have_mimalloc) {
      EXPECT_GT(row["mimalloc_pairs_per_s"].get<double>(), 0) << row;
    }
    EXPECT_GT(row["cxlrt_cross_thread_frees_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["cross_host_vs_cross_thread"].get<double>(), 0) << row;
    EXPECT_GT(row["cxlrt_local_pairs_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["cxlrt_two_hosts_pairs_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["cxlrt_cross_host_frees_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["cxlrt_remote_frees_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["cxlrt_local_frees_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["remote_vs_local_frees"].get<double>(), 0) << row;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the benchmark left its pool behind";
}

TEST(CliTest, KvCommandsPutGetListStatsAndCheckTheStore) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "64M");
  ASSERT_EQ(Cxlrt("pool create " + Quote(create)).code, 0);
  const std::string uri = OpenUri(create);
  Result none = Cxlrt("kv stats " + Quote(uri));
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.out.find("has no KV store"), std::string::npos) << none.out;
  const std::string in = dir.path() + "/block.bin", out = dir.path() + "/back.bin";
  {
    std::ofstream f(in, std::ios::binary);
    for (int i = 0; i < 100000; ++i) f.put(static_cast<char>(i * 7));
  }
  Result put = Cxlrt("kv put model/bf16 prefix-0 " + Quote(in) + " --pool " + Quote(uri));
  ASSERT_EQ(put.code, 0) << put.out;
  EXPECT_NE(put.out.find("100000 bytes"), std::string::npos) << put.out;
  Result again = Cxlrt("kv put model/bf16 prefix-0 " + Quote(in) + " --pool " + Quote(uri));
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.out.find("already in the store"), std::string::npos) << again.out;
  Result get = Cxlrt("kv get model/bf16 prefix-0 -o " + Quote(out) + " --pool " + Quote(uri));
  ASSERT_EQ(get.code, 0) << get.out;
  std::ifstream a(in, std::ios::binary), b(out, std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)))
      << "the bytes got differ from the bytes put";
  Result missing = Cxlrt("kv get model/bf16 nope --pool " + Quote(uri));
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("not in the store"), std::string::npos) << missing.out;
  // A namespace and key that are not UTF-8 come out escaped (JSON would
  // refuse the raw bytes).
  Result binary = Cxlrt("kv put \"$(printf 'ns\\377')\" \"$(printf 'k\\377')\" " + Quote(in) +
                        " --pool " + Quote(uri));
  ASSERT_EQ(binary.code, 0) << binary.out;
  Result ls = CxlrtStdout("kv ls --json --namespace model/bf16 " + Quote(uri));
  ASSERT_EQ(ls.code, 0) << ls.out;
  auto entries = nlohmann::json::parse(ls.out);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["key"], "prefix-0");
  EXPECT_EQ(entries[0]["size"], 100000);
  Result all = CxlrtStdout("kv ls --json " + Quote(uri));
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_NE(all.out.find("k\\\\xff"), std::string::npos) << all.out;
  Result stats = CxlrtStdout("kv stats --json " + Quote(uri));
  ASSERT_EQ(stats.code, 0) << stats.out;
  auto st = nlohmann::json::parse(stats.out);
  ASSERT_EQ(st["namespaces"].size(), 2u);
  EXPECT_EQ(st["namespaces"][1]["name"], "ns\\xff");
  EXPECT_EQ(st["namespaces"][0]["name"], "model/bf16");
  EXPECT_EQ(st["namespaces"][0]["entries"], 1);
  EXPECT_EQ(st["namespaces"][0]["put_exists"], 1);
  EXPECT_EQ(st["namespaces"][0]["hits"], 1);
  EXPECT_EQ(st["namespaces"][0]["misses"], 1);
  Result check = Cxlrt("pool check " + Quote(uri));
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("KV store"), std::string::npos) << check.out;
  // The demo: a prefill host hands a chain of blocks to two decode hosts.
  Result handoff = Cxlrt("run -n 3 --pool " + Quote(uri) + " -- " + CXLRT_BIN +
                         " kv handoff --blocks 4 --block 64K");
  EXPECT_EQ(handoff.code, 0) << handoff.out;
  size_t verified = 0;
  for (size_t p = 0; (p = handoff.out.find("verified byte for byte", p)) != std::string::npos;
       ++p) {
    ++verified;
  }
  EXPECT_EQ(verified, 2u) << handoff.out;
}

TEST(CliTest, BenchKvPrintsThroughputAndLookupLatencyWithNothingWrong) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "hosts=8", "256M");
  auto r = CxlrtStdout("bench kv --json --reps 1 --block 16K,300K --working-set 8M --pool " +
                       Quote(uri));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["memcpy_gbps"].get<double>(), 0);
  EXPECT_EQ(j["wrong"], 0);
  EXPECT_GT(j["lookup_1_ns"].get<double>(), 0);
  EXPECT_GT(j["lookup_64_ns"].get<double>(), j["lookup_1_ns"].get<double>());
  ASSERT_EQ(j["rows"].size(), 4u);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["gbps"].get<double>(), 0) << row;
    EXPECT_GT(row["batch_ops"].get<double>(), 0) << row;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the benchmark left its pool behind";
}

// The GPU benchmarks run where a GPU is (every doorbell's bytes come back
// right) and elsewhere say why not, with exit code 1.
TEST(CliTest, GpuBenchmarksRunOrSayWhyNot) {
  TempDir dir;
  for (const std::string args :
       {"bench doorbell --json -b 8 -e 4K -n 3 --reps 1", "bench dma --json -b 64K -e 64K -n 2"}) {
    Result r = Cxlrt(args + " --pool " + Quote(PoolUri(dir, "", "1G")));
    if (r.code == 1) {
      EXPECT_NE(r.out.find("needs a GPU: "), std::string::npos) << args << "\n" << r.out;
      continue;
    }
    ASSERT_EQ(r.code, 0) << args << "\n" << r.out;
    std::istringstream lines(r.out);
    int rows = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] != '{') continue;
      auto j = nlohmann::json::parse(line);
      if (j.contains("wrong_bytes")) {
        EXPECT_EQ(j["wrong_bytes"], 0) << line;
      }
      ++rows;
    }
    EXPECT_GT(rows, 0) << args << "\n" << r.out;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a benchmark left its pool behind";
}

TEST(CliTest, TheCeilingProbeRunsTwoRanksAndSumsRight) {
  // It exits non-zero on a wrong sum or a rank that stops answering.
  auto r = CxlrtStdout("bench ceiling -b 64K -e 1M -f 16 -n 3 -w 1 --chunk 256K --json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["ranks"], 2);
    EXPECT_GT(j["busbw_gbps"].get<double>(), 0) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 2) << r.out;  // 64 KiB, 1 MiB
}

TEST(CliTest, BenchCollectivesPrintNcclTestsColumnsWithNothingWrong) {
  TempDir dir;
  // No size: the benchmark sizes the pool it makes.
  const std::string uri = absl::StrCat("emu://coll", getpid(), "?dir=", dir.path());
  for (const std::string coll : {"allreduce", "allgather", "alltoall", "sendrecv"}) {
    auto r = CxlrtStdout("bench " + coll + " -b 8 -e 64K -f 64 -n 3 -w 1 --ranks 3 --json --pool " +
                         Quote(uri));
    ASSERT_EQ(r.code, 0) << coll << ": " << r.out;
    std::istringstream lines(r.out);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["collective"], coll);
      EXPECT_EQ(j["ranks"], 3);
      EXPECT_GT(j["time_us"].get<double>(), 0) << line;
      if (j["bytes"].get<uint64_t>() > 0) {
        EXPECT_GT(j["busbw_gbps"].get<double>(), 0) << line;
      }
      EXPECT_EQ(j["wrong"], 0) << line;
      EXPECT_EQ(j["inplace_wrong"], 0) << line;
      EXPECT_GT(j["memcpy_gbps"].get<double>(), 0) << line;
      EXPECT_GT(j["two_thread_copy_gbps"].get<double>(), 0) << line;
      // The traffic bound holds: busbw above it would mean the bound is wrong.
      if (j["bytes"].get<uint64_t>() > 0) {
        EXPECT_GT(j["bound_busbw_gbps"].get<double>(), 0) << line;
        EXPECT_LE(j["busbw_vs_bound"].get<double>(), 1.0) << line;
      }
      ++rows;
    }
    EXPECT_EQ(rows, 3) << coll << " (8 B, 512 B, 32 KiB): " << r.out;
  }
  // The table, with pool-resident buffers.
  auto t =
      CxlrtStdout("bench allreduce -b 1M -e 1M -n 2 -w 1 --ranks 2 --in-pool --pool " + Quote(uri));
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("algbw"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("busbw"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("# wrong elements: 0"), std::string::npos) << t.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the benchmark left its pool behind";
  auto bad = CxlrtStdout("bench allreduce -b 1M -e 1K --ranks 2");
  EXPECT_NE(bad.code, 0);
}

TEST(CliTest, BenchCollectivesRunAsOneRankEachUnderALauncher) {
  // Under cxlrt run (as under mpirun or torchrun) each process is one rank
  // of the shared pool; rank 0 prints.
  TempDir dir;
  const std::string pool = absl::StrCat("emu://launched", getpid(), "?dir=", dir.path());
  auto r = CxlrtStdout("run -n 3 --pool " + Quote(pool + "&size=256M") + " -- " + CXLRT_BIN +
                       " bench allreduce -b 1K -e 64K -f 64 -n 2 -w 1 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  int rows = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    auto j = nlohmann::json::parse(line.substr(brace));
    EXPECT_EQ(j["ranks"], 3) << line;
    EXPECT_EQ(j["wrong"], 0) << line;
    EXPECT_EQ(j["inplace_wrong"], 0) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 2) << "1 KiB and 64 KiB, printed once (rank 0): " << r.out;
}

}  // namespace
}  // namespace cxlrt::tools
