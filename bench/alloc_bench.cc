#include "bench/alloc_bench.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using allocator::Allocator;
using runtime::NowNs;
using runtime::PoolOffset;

constexpr uint64_t kSizes[] = {64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20};

// Pairs (or frees) per second from `n` operations that took `ns`.
double Rate(uint64_t n, int64_t ns) {
  return static_cast<double>(n) * 1e9 / static_cast<double>(ns);
}

// Operations that take about 40 ms at `probe_rate` ops/s.
uint64_t OpsFor(double probe_rate) {
  return std::clamp<uint64_t>(static_cast<uint64_t>(probe_rate * 0.04), 1000, 4'000'000);
}

template <typename Alloc, typename Free>
double PairRate(uint64_t n, Alloc&& alloc, Free&& free) {
  const int64_t t0 = NowNs();
  for (uint64_t i = 0; i < n; ++i) {
    void* p = alloc();
    asm volatile("" : : "r"(p) : "memory");
    free(p);
  }
  return Rate(n, NowNs() - t0);
}

// An allocator to compare with: its malloc and free.
struct PeerAllocator {
  void* (*alloc)(size_t) = nullptr;
  void (*free)(void*) = nullptr;
};

// mimalloc from Debian's libmimalloc2.0, loaded with dlopen. It is not
// linked: a linked libmimalloc replaces malloc for the whole process (it
// interposes the symbol), and the "glibc" column would measure mimalloc.
// RTLD_LOCAL keeps its symbols out of the process's lookups. nullopt when
// it is not installed.
std::optional<PeerAllocator> LoadMimalloc() {
  void* lib = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  PeerAllocator p;
  p.alloc = reinterpret_cast<void* (*)(size_t)>(dlsym(lib, "mi_malloc"));
  p.free = reinterpret_cast<void (*)(void*)>(dlsym(lib, "mi_free"));
  if (p.alloc == nullptr || p.free == nullptr) return std::nullopt;
  return p;  // stays loaded for the process's life
}

// The library that provides this process's malloc ("libc.so.6" normally).
std::string MallocProvider() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&malloc), &info) == 0 || info.dli_fname == nullptr) {
    return "unknown";
  }
  std::string path = info.dli_fname;
  return path.substr(path.rfind('/') + 1);
}

// A benchmark host: its allocator ticks every millisecond.
absl::StatusOr<AttachedHost> OpenHost(const std::string& uri) {
  allocator::AllocatorOptions opts;
  opts.tick = absl::Milliseconds(1);
  return AttachHost(uri, AnySlot(), opts);
}

// Local allocate + free pairs per second on one host.
double CxlrtPairs(Allocator& a, uint64_t size, uint64_t n) {
  const int64_t t0 = NowNs();
  for (uint64_t i = 0; i < n; ++i) {
    auto off = a.Allocate(size);
    if (!off.ok() || !a.Free(*off).ok()) return 0;
  }
  return Rate(n, NowNs() - t0);
}

// Runs `body` in `count` forked host processes started together; each
// returns up to kMaxValues numbers, passed back through shared memory.
// Returns them per host (empty: the host failed).
constexpr size_t kMaxValues = 8;
std::vector<std::vector<double>> InHostsValues(
    int count, const std::function<std::vector<double>(int)>& body) {
  constexpr size_t kStride = kMaxValues + 1;  // the count, then the values
  auto* out = static_cast<double*>(mmap(nullptr, count * kStride * sizeof(double),
                                        PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<double> v = body(i);
      v.resize(std::min(v.size(), kMaxValues));
      std::copy(v.begin(), v.end(), out + i * kStride + 1);
      out[i * kStride] = static_cast<double>(v.size());
      fflush(nullptr);
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<std::vector<double>> values(count);
  for (int i = 0; i < count; ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      const double* v = out + i * kStride;
      values[i].assign(v + 1, v + 1 + static_cast<size_t>(v[0]));
    }
  }
  munmap(out, count * kStride * sizeof(double));
  return values;
}

// InHostsValues of one number a host: its rate (0: failed).
std::vector<double> InHosts(int count, const std::function<double(int)>& body) {
  std::vector<double> rates;
  for (const auto& v : InHostsValues(count, [&](int i) { return std::vector<double>{body(i)}; })) {
    rates.push_back(v.empty() ? 0 : v[0]);
  }
  return rates;
}

// One handoff run: `n` blocks of `size` bytes through a ring named `name`.
struct Handoff {
  std::string name;
  uint64_t token;  // this run's: the consumer starts once the producer stamped it
  uint64_t size, n;
  uint64_t cap;  // blocks in flight
};
constexpr uint64_t kHandoffBatch = 64;

// One side of a handoff: the producer (role 0) allocates blocks and hands
// each to the consumer (role 1) through a ring in the pool; the consumer
// frees it. Both find the ring by the run's name. Returns 1 (producer) or
// blocks per second end to end (consumer); 0 when it failed.
double HandoffRole(AttachedHost& h, int role, const Handoff& run) {
  const std::string& name = run.name;
  const uint64_t token = run.token, size = run.size, n = run.n, cap = run.cap;
  constexpr uint64_t kBatch = kHandoffBatch;
  runtime::Coherence& c = h.pool->coherence();
  // Handoff ring: head line (host 0), tail line (host 1), entries.
  absl::StatusOr<PoolOffset> ring;
  const int64_t give_up = NowNs() + 30'000'000'000;
  if (role == 0) {
    ring = h.alloc->AllocateNamed(name, 256 + cap * 8);
  } else {
    while (!(ring = [&]() -> absl::StatusOr<PoolOffset> {
              auto b = h.alloc->Find(name);
              if (!b.ok()) return b.status();
              return b->offset;
            }())
                .ok()) {
      if (NowNs() > give_up) return 0;
      usleep(100);
    }
  }
  if (!ring.ok()) return 0;
  const PoolOffset head_at = *ring, tail_at = *ring + 128, token_at = *ring + 192,
                   failed_at = *ring + 200, entries = *ring + 256;
  if (role == 0) {
    c.StoreFlag(head_at, 0);
    c.StoreFlag(tail_at, 0);
    c.StoreFlag(failed_at, 0);
    c.StoreFlag(token_at, token);
    struct Unname {
      Allocator& a;
      const std::string& name;
      ~Unname() { (void)a.FreeNamed(name); }
    } unname{*h.alloc, name};
    uint64_t tail = 0;
    for (uint64_t k = 0; k < n; ++k) {
      for (int spins = 0; k - tail >= cap; ++spins) {
        tail = c.LoadFlag(tail_at);
        if (NowNs() > give_up) return 0;
        if (spins > 100) sched_yield();  // a loaded machine: let the consumer run
      }
      auto off = h.alloc->Allocate(size);
      // Full while frees are still on their way back: take them in, retry.
      while (absl::IsResourceExhausted(off.status()) && NowNs() < give_up) {
        (void)h.alloc->Tick();
        usleep(50);
        off = h.alloc->Allocate(size);
      }
      if (!off.ok()) {
        std::fprintf(stderr, "cxlrt bench alloc: handoff producer: %s\n",
                     off.status().ToString().c_str());
        c.StoreFlag(failed_at, 1);  // the consumer stops waiting
        return 0;
      }
      c.Write(entries + (k % cap) * 8, &*off, 8);
      if ((k + 1) % kBatch == 0 || k + 1 == n) {
        c.Flush(entries, cap * 8);
        c.StoreFlag(head_at, k + 1);
      }
    }
    // Stay until the consumer is done (its frees come to our rings).
    while (c.LoadFlag(tail_at) < n && NowNs() < give_up) usleep(100);
    return 1;
  }
  while (c.LoadFlag(token_at) != token) {
    if (NowNs() > give_up) return 0;
  }
  int64_t t0 = 0;
  uint64_t head = 0;
  for (uint64_t k = 0; k < n; ++k) {
    for (int spins = 0; k >= head; ++spins) {
      head = c.LoadFlag(head_at);
      if (NowNs() > give_up || c.LoadFlag(failed_at) != 0) return 0;
      if (spins > 100) sched_yield();
    }
    if (k == 0) t0 = NowNs();
    PoolOffset off = 0;
    c.Fetch(&off, entries + (k % cap) * 8, 8);
    if (absl::Status st = h.alloc->Free(off); !st.ok()) {
      std::fprintf(stderr, "cxlrt bench alloc: handoff consumer: %s\n", st.ToString().c_str());
      return 0;
    }
    if ((k + 1) % kBatch == 0 || k + 1 == n) c.StoreFlag(tail_at, k + 1);
  }
  return Rate(n, NowNs() - t0);
}

// Blocks in flight: at most 4096, and at most an eighth of the pool (the
// owner also holds blocks freed but not yet reclaimed).
Handoff PlanHandoff(const char* kind, uint64_t pool_size, uint64_t size, uint64_t n, int run) {
  return {absl::StrCat("bench/", kind, "/", size, "/", run), static_cast<uint64_t>(NowNs()) | 1,
          size, n, std::clamp<uint64_t>(pool_size / 8 / size, kHandoffBatch, 4096)};
}

// Host 0 allocates and hands each block to host 1; host 1 frees it (a
// cross-host free, back through the allocator's ring to host 0, which
// reclaims it in its allocation slow path). Blocks per second end to end.
double CrossHostFrees(const std::string& uri, uint64_t pool_size, uint64_t size, uint64_t n,
                      int run) {
  const Handoff plan = PlanHandoff("handoff", pool_size, size, n, run);
  auto rates = InHosts(2, [&](int i) -> double {
    auto h = OpenHost(uri);
    return h.ok() ? HandoffRole(*h, i, plan) : 0;
  });
  return rates[0] > 0 ? rates[1] : 0;
}

// The same handoff between two threads of one host: the consumer's frees
// are local (into its thread cache, back to the arena when that is full,
// from where the producer's refills take them). The local counterpart of
// CrossHostFrees.
double CrossThreadFrees(const std::string& uri, uint64_t pool_size, uint64_t size, uint64_t n,
                        int run) {
  const Handoff plan = PlanHandoff("threads", pool_size, size, n, run);
  return InHosts(1, [&](int) -> double {
    auto h = OpenHost(uri);
    if (!h.ok()) return 0;
    double producer = 0;
    std::thread t([&] { producer = HandoffRole(*h, 0, plan); });
    const double rate = HandoffRole(*h, 1, plan);
    t.join();
    return producer > 0 ? rate : 0;
  })[0];
}

// Host 0 allocates `n` blocks and publishes their offsets in one named
// block; host 1 copies the list out and frees them all: each a remote free
// (checked against the owner's metadata, queued, pushed through the ring in
// batches of 16), the last push included. Unlike CrossHostFrees there is no
// per-block handoff, so this is what a host's remote frees cost, without
// the benchmark's transport. Host 1 also frees a list of `n` blocks of its
// own with the same loop, just before, in the same process: the local
// counterpart (a thread-cached allocate+free pair never leaves the cache; a
// list of a million frees does, like the remote one). Returns {remote,
// local} frees per second of host 1 (0: failed).
struct FreeRates {
  double remote = 0, local = 0;
};
FreeRates RemoteAndLocalFrees(const std::string& uri, uint64_t size, uint64_t n, int run) {
  const std::string name = absl::StrCat("bench/remote/", size, "/", run);
  const uint64_t token = static_cast<uint64_t>(NowNs()) | 1;
  auto rates = InHostsValues(2, [&](int i) -> std::vector<double> {
    auto h = OpenHost(uri);
    if (!h.ok()) return {};
    runtime::Coherence& c = h->pool->coherence();
    const int64_t give_up = NowNs() + 20'000'000'000;
    auto allocate_list = [&](std::vector<PoolOffset>* offs) {
      for (uint64_t k = 0; k < n; ++k) {
        auto off = h->alloc->Allocate(size);
        if (!off.ok()) {
          std::fprintf(stderr, "cxlrt bench alloc: remote frees: %s\n",
                       off.status().ToString().c_str());
          for (PoolOffset o : *offs) (void)h->alloc->Free(o);
          offs->clear();
          return;
        }
        offs->push_back(*off);
      }
    };
    auto free_list = [&](const std::vector<PoolOffset>& offs) -> double {
      const int64_t t0 = NowNs();
      for (PoolOffset off : offs) {
        if (!h->alloc->Free(off).ok()) return 0;
      }
      (void)h->alloc->Tick();  // pushes the queued rest (what the ring has room for)
      return Rate(offs.size(), NowNs() - t0);
    };
    // Layout: token and count (host 0), done (host 1), then the offsets.
    if (i == 0) {
      auto list = h->alloc->AllocateNamed(name, 128 + n * 8);
      if (!list.ok()) return {};
      struct Unname {
        Allocator& a;
        const std::string& name;
        ~Unname() { (void)a.FreeNamed(name); }
      } unname{*h->alloc, name};
      std::vector<PoolOffset> offs;
      allocate_list(&offs);
      c.StoreFlag(*list + 64, 0);
      c.StoreFlag(*list + 8, offs.size());  // 0: host 1 gives up at once
      c.CopyToPool(*list + 128, offs.data(), offs.size() * 8);
      c.StoreFlag(*list, token);
      if (offs.empty()) return {};
      while (c.LoadFlag(*list + 64) != token && NowNs() < give_up) usleep(200);
      return {1};
    }
    std::vector<PoolOffset> own;
    allocate_list(&own);
    if (own.empty()) return {};
    absl::StatusOr<allocator::NamedBlock> list;
    while (!(list = h->alloc->Find(name)).ok() || c.LoadFlag(list->offset) != token) {
      if (NowNs() > give_up) return {};
      usleep(100);
    }
    if (c.LoadFlag(list->offset + 8) != n) return {};
    std::vector<PoolOffset> offs(n);
    c.CopyFromPool(offs.data(), list->offset + 128, n * 8);
    const double local = free_list(own);
    const double remote = free_list(offs);
    c.StoreFlag(list->offset + 64, token);
    return {remote, local};
  });
  if (rates[0].empty() || rates[1].size() != 2) return {};
  return {rates[1][0], rates[1][1]};
}

struct Row {
  uint64_t size;
  double glibc, mimalloc, cxlrt_local, cxlrt_two_hosts, cross_host, cross_thread, cross_vs_thread,
      remote_frees, local_frees, remote_vs_local_frees;
};

std::string Mops(double r) { return r > 0 ? absl::StrFormat("%.2f", r / 1e6) : "-"; }

}  // namespace

int RunAllocBench(const AllocBenchOptions& o) {
  auto scratch = ScratchPool::Create(
      o.uri.empty() ? absl::StrCat("emu://bench-alloc-", getpid(), "?size=1G") : o.uri, 1ull << 30);
  if (!scratch.ok()) {
    std::fprintf(stderr, "cxlrt bench alloc: %s\n",
                 std::string(scratch.status().message()).c_str());
    return 1;
  }
  const runtime::PoolUri& uri = (*scratch)->uri();
  const std::string& open_uri = (*scratch)->open_uri();

  const Summary memcpy_bw = MeasureMemcpy(64 << 20, 5);
  const std::optional<PeerAllocator> mimalloc = LoadMimalloc();
  std::vector<Row> rows;
  std::vector<uint64_t> sizes = o.sizes;
  if (sizes.empty()) sizes.assign(std::begin(kSizes), std::end(kSizes));
  for (uint64_t size : sizes) {
    Row r{size, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    // One host, local pairs, beside glibc and mimalloc in the same child
    // process (a fresh one, like every host below), each repetition running
    // the three in turn: the ratios then compare like with like.
    const auto pairs = InHostsValues(1, [&](int) -> std::vector<double> {
      auto h = OpenHost(open_uri);
      if (!h.ok()) return {};
      const uint64_t n = OpsFor(CxlrtPairs(*h->alloc, size, 20000));
      const uint64_t n_glibc = OpsFor(PairRate(
          20000, [&] { return malloc(size); }, [](void* p) { free(p); }));
      std::vector<double> glibc, mi, cxlrt;
      for (int k = 0; k < o.reps; ++k) {
        glibc.push_back(PairRate(
            n_glibc, [&] { return malloc(size); }, [](void* p) { free(p); }));
        if (mimalloc) {
          mi.push_back(PairRate(
              n_glibc, [&] { return mimalloc->alloc(size); }, [&](void* p) { mimalloc->free(p); }));
        }
        cxlrt.push_back(CxlrtPairs(*h->alloc, size, n));
      }
      return {Summarize(cxlrt).median, Summarize(glibc).median,
              mi.empty() ? 0 : Summarize(mi).median};
    });
    if (pairs[0].size() == 3) {
      r.cxlrt_local = pairs[0][0];
      r.glibc = pairs[0][1];
      r.mimalloc = pairs[0][2];
    }
    const uint64_t n = OpsFor(r.cxlrt_local > 0 ? r.cxlrt_local : 1e6);
    auto both = InHosts(2, [&](int) -> double {
      auto h = OpenHost(open_uri);
      if (!h.ok()) return 0;
      return Summarize(Repeat(o.reps, [&] { return CxlrtPairs(*h->alloc, size, n); })).median;
    });
    r.cxlrt_two_hosts = both[0] > 0 && both[1] > 0 ? both[0] + both[1] : 0;
    // Handoffs between two hosts and between two threads of one host, in
    // turn; their ratio is the median of each run's.
    std::vector<double> cross, threads, cross_ratio;
    for (int k = 0; k < std::max(1, o.reps / 2); ++k) {
      threads.push_back(CrossThreadFrees(open_uri, (*scratch)->pool().size(), size, n, k));
      cross.push_back(CrossHostFrees(open_uri, (*scratch)->pool().size(), size, n, k));
      cross_ratio.push_back(threads.back() > 0 ? cross.back() / threads.back() : 0);
    }
    r.cross_host = Summarize(cross).median;
    r.cross_thread = Summarize(threads).median;
    r.cross_vs_thread = Summarize(cross_ratio).median;
    // Two lists (the remote and the local one) of at most an eighth of the
    // pool (a block above 256 KiB takes up to twice its size: whole 2 MiB
    // segments) and a million blocks each.
    const uint64_t nr = std::clamp<uint64_t>(
        std::min<uint64_t>(n, (*scratch)->pool().size() / 8 / std::max<uint64_t>(size, 64)), 16,
        1 << 20);
    // Remote and local frees measured in the same process, in turn; their
    // ratio is the median of each run's. At least three runs: a list of
    // large blocks is short (32768 of 4 KiB take about 2 ms), so one tick
    // or descheduling moves a single run a lot.
    std::vector<double> remote, local, ratio;
    for (int k = 0; k < std::max(3, o.reps); ++k) {
      const FreeRates f = RemoteAndLocalFrees(open_uri, size, nr, k);
      remote.push_back(f.remote);
      local.push_back(f.local);
      ratio.push_back(f.local > 0 ? f.remote / f.local : 0);
    }
    r.remote_frees = Summarize(remote).median;
    r.local_frees = Summarize(local).median;
    r.remote_vs_local_frees = Summarize(ratio).median;
    rows.push_back(r);
  }

  if (o.json) {
    nlohmann::json j;
    j["benchmark"] = "alloc";
    j["uri"] = uri.ToString();
    j["memcpy_gbps"] = memcpy_bw.median;
    j["malloc_provider"] = MallocProvider();
    for (const Row& r : rows) {
      nlohmann::json row = {
          {"size", r.size},
          {"glibc_pairs_per_s", r.glibc},
          {"cxlrt_local_pairs_per_s", r.cxlrt_local},
          {"cxlrt_two_hosts_pairs_per_s", r.cxlrt_two_hosts},
          {"cxlrt_cross_host_frees_per_s", r.cross_host},
          {"cxlrt_cross_thread_frees_per_s", r.cross_thread},
          {"cross_host_vs_cross_thread", r.cross_vs_thread},
          {"cxlrt_remote_frees_per_s", r.remote_frees},
          {"remote_vs_local", r.cxlrt_local > 0 ? r.remote_frees / r.cxlrt_local : 0},
          {"cxlrt_local_frees_per_s", r.local_frees},
          {"remote_vs_local_frees", r.remote_vs_local_frees},
          {"pair_time_vs_glibc", r.cxlrt_local > 0 ? r.glibc / r.cxlrt_local : 0},
          {"cross_vs_local", r.cxlrt_local > 0 ? r.cross_host / r.cxlrt_local : 0}};
      if (r.mimalloc > 0) row["mimalloc_pairs_per_s"] = r.mimalloc;
      j["results"].push_back(row);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("# cxlrt bench alloc %s (hardware domain, medians of %d)\n", uri.ToString().c_str(),
              o.reps);
  std::printf("# this machine's memcpy: %s; rates in millions of allocate+free pairs per second\n",
              FormatGbps(memcpy_bw.median).c_str());
  std::printf(
      "# glibc: malloc/free from %s; mimalloc: %s; both in the process that measures cxlrt's "
      "pairs, in turn with it\n",
      MallocProvider().c_str(), mimalloc ? "libmimalloc.so.2 (dlopen)" : "not installed");
  std::printf(
      "# handoffs (end to end, blocks/s): one side allocates and hands each block over, the "
      "other frees it; cross-thread: two threads of one host (local frees), cross-host: two "
      "hosts (remote frees); host/thread: their ratio\n"
      "# list frees (frees/s): a host freeing a list of its own blocks (local) and, just after, "
      "of another host's (remote)\n");
  std::printf("%10s %9s %9s %9s %11s %10s %13s %11s %12s %12s %13s %13s\n", "size", "glibc",
              "mimalloc", "cxlrt", "time/glibc", "cxlrt 2 h", "cross-thread", "cross-host",
              "host/thread", "local frees", "remote frees", "remote/local");
  auto ratio = [](double x) { return x > 0 ? absl::StrFormat("%.2f", x) : std::string("-"); };
  for (const Row& r : rows) {
    std::printf(
        "%10llu %9s %9s %9s %11s %10s %13s %11s %12s %12s %13s %13s\n",
        static_cast<unsigned long long>(r.size), Mops(r.glibc).c_str(), Mops(r.mimalloc).c_str(),
        Mops(r.cxlrt_local).c_str(), ratio(r.cxlrt_local > 0 ? r.glibc / r.cxlrt_local : 0).c_str(),
        Mops(r.cxlrt_two_hosts).c_str(), Mops(r.cross_thread).c_str(), Mops(r.cross_host).c_str(),
        ratio(r.cross_vs_thread).c_str(), Mops(r.local_frees).c_str(), Mops(r.remote_frees).c_str(),
        ratio(r.remote_vs_local_frees).c_str());
  }
  return 0;
}

}  // namespace cxlrt::bench
