#include "bench/alloc_bench.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#ifdef CXLRT_HAVE_MIMALLOC
#include <mimalloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator.h"
#include "bench/harness.h"
#include "nlohmann/json.hpp"
#include "runtime/membership.h"
#include "runtime/pool.h"

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
// returns a rate written to shared memory. Returns the rates (0: failed).
std::vector<double> InHosts(int count, const std::function<double(int)>& body) {
  auto* out = static_cast<double*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> pids;
  fflush(nullptr);
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      out[i] = body(i);
      fflush(nullptr);
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<double> rates;
  for (int i = 0; i < count; ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    rates.push_back(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out[i] : 0);
  }
  munmap(out, 4096);
  return rates;
}

// Host 0 allocates and hands each block to host 1 through a ring in the
// pool; host 1 frees it (a cross-host free, back through the allocator's
// ring to host 0, which reclaims it in its allocation slow path). Returns
// blocks per second end to end, measured by host 1.
double CrossHostFrees(const std::string& uri, uint64_t pool_size, uint64_t size, uint64_t n,
                      int run) {
  const std::string name = absl::StrCat("bench/handoff/", size, "/", run);
  // The handoff block is not zeroed when allocated: the consumer starts
  // only once the producer has reset it and stamped this run's token.
  const uint64_t token = static_cast<uint64_t>(NowNs()) | 1;
  constexpr uint64_t kBatch = 64;
  // Blocks in flight: at most 4096, and at most an eighth of the pool (the
  // owner also holds blocks freed but not yet reclaimed).
  const uint64_t kCap = std::clamp<uint64_t>(pool_size / 8 / size, kBatch, 4096);
  auto rates = InHosts(2, [&](int i) -> double {
    auto h = OpenHost(uri);
    if (!h.ok()) return 0;
    runtime::Coherence& c = h->pool->coherence();
    // Handoff ring: head line (host 0), tail line (host 1), entries.
    absl::StatusOr<PoolOffset> ring;
    const int64_t give_up = NowNs() + 30'000'000'000;
    if (i == 0) {
      ring = h->alloc->AllocateNamed(name, 256 + kCap * 8);
    } else {
      while (!(ring = [&]() -> absl::StatusOr<PoolOffset> {
                auto b = h->alloc->Find(name);
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
    if (i == 0) {
      c.StoreFlag(head_at, 0);
      c.StoreFlag(tail_at, 0);
      c.StoreFlag(failed_at, 0);
      c.StoreFlag(token_at, token);
      struct Unname {
        Allocator& a;
        const std::string& name;
        ~Unname() { (void)a.FreeNamed(name); }
      } unname{*h->alloc, name};
      uint64_t tail = 0;
      for (uint64_t k = 0; k < n; ++k) {
        for (int spins = 0; k - tail >= kCap; ++spins) {
          tail = c.LoadFlag(tail_at);
          if (NowNs() > give_up) return 0;
          if (spins > 100) sched_yield();  // a loaded machine: let the consumer run
        }
        auto off = h->alloc->Allocate(size);
        // Full while frees are still on their way back: take them in, retry.
        while (absl::IsResourceExhausted(off.status()) && NowNs() < give_up) {
          (void)h->alloc->Tick();
          usleep(50);
          off = h->alloc->Allocate(size);
        }
        if (!off.ok()) {
          std::fprintf(stderr, "cxlrt bench alloc: cross-host producer: %s\n",
                       off.status().ToString().c_str());
          c.StoreFlag(failed_at, 1);  // the consumer stops waiting
          return 0;
        }
        c.Write(entries + (k % kCap) * 8, &*off, 8);
        if ((k + 1) % kBatch == 0 || k + 1 == n) {
          c.Flush(entries, kCap * 8);
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
      c.Fetch(&off, entries + (k % kCap) * 8, 8);
      if (absl::Status st = h->alloc->Free(off); !st.ok()) {
        std::fprintf(stderr, "cxlrt bench alloc: cross-host consumer: %s\n", st.ToString().c_str());
        return 0;
      }
      if ((k + 1) % kBatch == 0 || k + 1 == n) c.StoreFlag(tail_at, k + 1);
    }
    return Rate(n, NowNs() - t0);
  });
  return rates[0] > 0 ? rates[1] : 0;
}

// Host 0 allocates `n` blocks and publishes their offsets in one named
// block; host 1 copies the list out, then frees them all: each a remote
// free (checked against the owner's metadata, queued, pushed through the
// ring in batches of 16). Returns host 1's frees per second, the last
// push included. Unlike CrossHostFrees there is no per-block handoff, so
// this is what a host's remote frees cost, without the benchmark's
// transport.
double RemoteFreeRate(const std::string& uri, uint64_t size, uint64_t n, int run) {
  const std::string name = absl::StrCat("bench/remote/", size, "/", run);
  const uint64_t token = static_cast<uint64_t>(NowNs()) | 1;
  auto rates = InHosts(2, [&](int i) -> double {
    auto h = OpenHost(uri);
    if (!h.ok()) return 0;
    runtime::Coherence& c = h->pool->coherence();
    const int64_t give_up = NowNs() + 20'000'000'000;
    // Layout: token and count (host 0), done (host 1), then the offsets.
    if (i == 0) {
      auto list = h->alloc->AllocateNamed(name, 128 + n * 8);
      if (!list.ok()) return 0;
      struct Unname {
        Allocator& a;
        const std::string& name;
        ~Unname() { (void)a.FreeNamed(name); }
      } unname{*h->alloc, name};
      std::vector<PoolOffset> offs;
      for (uint64_t k = 0; k < n; ++k) {
        auto off = h->alloc->Allocate(size);
        if (!off.ok()) {
          std::fprintf(stderr, "cxlrt bench alloc: remote frees: %s\n",
                       off.status().ToString().c_str());
          for (PoolOffset o : offs) (void)h->alloc->Free(o);
          offs.clear();
          break;
        }
        offs.push_back(*off);
      }
      c.StoreFlag(*list + 64, 0);
      c.StoreFlag(*list + 8, offs.size());  // 0: host 1 gives up at once
      c.CopyToPool(*list + 128, offs.data(), offs.size() * 8);
      c.StoreFlag(*list, token);
      if (offs.empty()) return 0;
      while (c.LoadFlag(*list + 64) != token && NowNs() < give_up) usleep(200);
      return 1;
    }
    absl::StatusOr<allocator::NamedBlock> list;
    while (!(list = h->alloc->Find(name)).ok() || c.LoadFlag(list->offset) != token) {
      if (NowNs() > give_up) return 0;
      usleep(100);
    }
    if (c.LoadFlag(list->offset + 8) != n) return 0;
    std::vector<PoolOffset> offs(n);
    c.CopyFromPool(offs.data(), list->offset + 128, n * 8);
    const int64_t t0 = NowNs();
    for (PoolOffset off : offs) {
      if (!h->alloc->Free(off).ok()) return 0;
    }
    (void)h->alloc->Tick();  // pushes the queued rest (what the ring has room for)
    const double rate = Rate(n, NowNs() - t0);
    c.StoreFlag(list->offset + 64, token);
    return rate;
  });
  return rates[0] > 0 ? rates[1] : 0;
}

// Frees/s of a host freeing a list of `n` blocks of its own (the local
// counterpart of RemoteFreeRate: same list, same loop).
double LocalFreeRate(const std::string& uri, uint64_t size, uint64_t n) {
  return InHosts(1, [&](int) -> double {
    auto h = OpenHost(uri);
    if (!h.ok()) return 0;
    std::vector<PoolOffset> offs;
    for (uint64_t k = 0; k < n; ++k) {
      auto off = h->alloc->Allocate(size);
      if (!off.ok()) break;
      offs.push_back(*off);
    }
    const int64_t t0 = NowNs();
    for (PoolOffset off : offs) {
      if (!h->alloc->Free(off).ok()) return 0;
    }
    return Rate(offs.size(), NowNs() - t0);
  })[0];
}

struct Row {
  uint64_t size;
  double glibc, mimalloc, cxlrt_local, cxlrt_two_hosts, cross_host, remote_frees, local_frees;
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
  std::vector<Row> rows;
  std::vector<uint64_t> sizes = o.sizes;
  if (sizes.empty()) sizes.assign(std::begin(kSizes), std::end(kSizes));
  for (uint64_t size : sizes) {
    Row r{size, 0, 0, 0, 0, 0, 0, 0};
    auto median = [&](const std::function<double()>& fn) {
      return Summarize(Repeat(o.reps, fn)).median;
    };
    const uint64_t n_glibc = OpsFor(PairRate(
        20000, [&] { return malloc(size); }, [](void* p) { free(p); }));
    r.glibc = median([&] {
      return PairRate(
          n_glibc, [&] { return malloc(size); }, [](void* p) { free(p); });
    });
#ifdef CXLRT_HAVE_MIMALLOC
    r.mimalloc = median([&] {
      return PairRate(
          n_glibc, [&] { return mi_malloc(size); }, [](void* p) { mi_free(p); });
    });
#endif
    // One host, local pairs: in a child, so that every measurement starts
    // from a fresh process like the two-host one.
    r.cxlrt_local = InHosts(1, [&](int) -> double {
      auto h = OpenHost(open_uri);
      if (!h.ok()) return 0;
      const uint64_t n = OpsFor(CxlrtPairs(*h->alloc, size, 20000));
      return Summarize(Repeat(o.reps, [&] { return CxlrtPairs(*h->alloc, size, n); })).median;
    })[0];
    const uint64_t n = OpsFor(r.cxlrt_local > 0 ? r.cxlrt_local : 1e6);
    auto both = InHosts(2, [&](int) -> double {
      auto h = OpenHost(open_uri);
      if (!h.ok()) return 0;
      return Summarize(Repeat(o.reps, [&] { return CxlrtPairs(*h->alloc, size, n); })).median;
    });
    r.cxlrt_two_hosts = both[0] > 0 && both[1] > 0 ? both[0] + both[1] : 0;
    std::vector<double> cross;
    for (int k = 0; k < std::max(1, o.reps / 2); ++k)
      cross.push_back(CrossHostFrees(open_uri, (*scratch)->pool().size(), size, n, k));
    r.cross_host = Summarize(cross).median;
    // At most a quarter of the pool and a million blocks outstanding.
    const uint64_t nr = std::clamp<uint64_t>(
        std::min<uint64_t>(n, (*scratch)->pool().size() / 4 / std::max<uint64_t>(size, 64)), 16,
        1 << 20);
    std::vector<double> remote;
    for (int k = 0; k < std::max(1, o.reps / 2); ++k) {
      remote.push_back(RemoteFreeRate(open_uri, size, nr, k));
    }
    r.remote_frees = Summarize(remote).median;
    std::vector<double> local;
    for (int k = 0; k < std::max(1, o.reps / 2); ++k)
      local.push_back(LocalFreeRate(open_uri, size, nr));
    r.local_frees = Summarize(local).median;
    rows.push_back(r);
  }

  if (o.json) {
    nlohmann::json j;
    j["benchmark"] = "alloc";
    j["uri"] = uri.ToString();
    j["memcpy_gbps"] = memcpy_bw.median;
    for (const Row& r : rows) {
      nlohmann::json row = {
          {"size", r.size},
          {"glibc_pairs_per_s", r.glibc},
          {"cxlrt_local_pairs_per_s", r.cxlrt_local},
          {"cxlrt_two_hosts_pairs_per_s", r.cxlrt_two_hosts},
          {"cxlrt_cross_host_frees_per_s", r.cross_host},
          {"cxlrt_remote_frees_per_s", r.remote_frees},
          {"remote_vs_local", r.cxlrt_local > 0 ? r.remote_frees / r.cxlrt_local : 0},
          {"cxlrt_local_frees_per_s", r.local_frees},
          {"remote_vs_local_frees", r.local_frees > 0 ? r.remote_frees / r.local_frees : 0},
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
      "# cross-host: one host allocates, hands each block over, the other frees it "
      "(end to end); remote: frees/s of a host freeing a list of another's blocks; local frees: "
      "the same of its own blocks\n");
  std::printf("%10s %9s %9s %9s %12s %11s %11s %12s %9s %13s %12s %13s\n", "size", "glibc",
              "mimalloc", "cxlrt", "time/glibc", "cxlrt 2 h", "cross-host", "cross/local", "remote",
              "remote/local", "local frees", "remote/lfree");
  for (const Row& r : rows) {
    auto ratio = [&](double x) {
      return r.cxlrt_local > 0 ? absl::StrFormat("%.2f", x / r.cxlrt_local) : std::string("-");
    };
    std::printf(
        "%10llu %9s %9s %9s %12s %11s %11s %12s %9s %13s %12s %13s\n",
        static_cast<unsigned long long>(r.size), Mops(r.glibc).c_str(), Mops(r.mimalloc).c_str(),
        Mops(r.cxlrt_local).c_str(),
        r.cxlrt_local > 0 ? absl::StrFormat("%.2f", r.glibc / r.cxlrt_local).c_str() : "-",
        Mops(r.cxlrt_two_hosts).c_str(), Mops(r.cross_host).c_str(), ratio(r.cross_host).c_str(),
        Mops(r.remote_frees).c_str(), ratio(r.remote_frees).c_str(), Mops(r.local_frees).c_str(),
        r.local_frees > 0 ? absl::StrFormat("%.2f", r.remote_frees / r.local_frees).c_str() : "-");
  }
  return 0;
}

}  // namespace cxlrt::bench
