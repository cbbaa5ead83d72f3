// VM harness helper (tests/vm/scenario_fence.sh, scenario_kill.sh): a host
// that keeps writing pool metadata across a fault, and the survivor's side.
//   kv_writer write URI SECONDS SIZE [NS]: attaches (CXLRT_HOST_ID as the
//     environment says; KV_WRITER_SLOT: that slot), then for up to SECONDS puts key w<i> (Block(i,
//     SIZE)) in namespace NS (default vm), with an allocate and a free of a private block around
//     each put; prints "OK i mono_ms" (flushed) after each put that returned
//     OK (KV_WRITER_PAUSE_US apart, default 2000), "GAP ms" when its CLOCK_MONOTONIC moved more
//     than 500 ms between two steps, and "ERR i message" and exits 3 at the first call that fails.
//   kv_writer recover URI SLOT: attaches and runs the allocator's
//     RecoverDeadHosts (fences and recovers every host seen dead) until SLOT
//     was recovered (30 s at most), prints the slots.
//   kv_writer verify URI LOG SIZE [NS]: reads every key LOG says committed ("OK i")
//     and compares it with Block(i, SIZE); exits 1 on any difference.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/kv/store.h"

namespace {

using namespace cxlrt;

std::vector<uint8_t> Block(uint64_t i, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(0x766dull * 1000003 + i);
  for (size_t k = 0; k < n; k += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + k, &x, std::min<size_t>(8, n - k));
  }
  return v;
}

int64_t MonoMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

int Fail(const char* what, const absl::Status& s) {
  std::printf("%s: %s\n", what, std::string(s.ToString()).c_str());
  std::fflush(stdout);
  return 1;
}

int Write(const std::string& uri, double seconds, size_t size, const std::string& ns) {
  runtime::AttachOptions options;  // KV_WRITER_SLOT: claim that slot by number
  if (const char* slot = std::getenv("KV_WRITER_SLOT")) options.slot = std::atoi(slot);
  auto h = bench::AttachHost(uri, options);
  if (!h.ok()) return Fail("attach", h.status());
  kv::StoreOptions so;
  so.create = true;
  auto store = kv::Store::Open(*h->alloc, so);
  if (!store.ok()) return Fail("store", store.status());
  std::printf("ATTACHED slot %u\n", h->membership->slot());
  std::fflush(stdout);
  const char* env = std::getenv("KV_WRITER_PAUSE_US");
  const useconds_t pause_us = env != nullptr ? std::atoi(env) : 2000;
  const int64_t start = MonoMs();
  int64_t last = start;
  for (uint64_t i = 0; MonoMs() - start < seconds * 1000; ++i) {
    const int64_t now = MonoMs();
    if (now - last > 500) std::printf("GAP %lld\n", static_cast<long long>(now - last));
    last = now;
    const std::vector<uint8_t> v = Block(i, size);
    auto scratch = h->alloc->Allocate(4096 + (i % 7) * 512);
    absl::Status s = scratch.status();
    if (s.ok()) s = (*store)->Put(ns, "w" + std::to_string(i), v.data(), v.size());
    if (s.ok()) s = h->alloc->Free(*scratch);
    if (!s.ok()) {
      std::printf("ERR %llu %s\n", static_cast<unsigned long long>(i),
                  std::string(s.ToString()).c_str());
      std::fflush(stdout);
      return 3;
    }
    std::printf("OK %llu %lld\n", static_cast<unsigned long long>(i),
                static_cast<long long>(MonoMs()));
    std::fflush(stdout);
    usleep(pause_us);  // slow enough that every key fits the store (no eviction)
  }
  std::printf("DONE\n");
  return 0;
}

int Recover(const std::string& uri, uint32_t want) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  // A fresh observer waits DeadAfter before a slot is dead or quiet to it:
  // recover until `want` was recovered (or 30 s).
  std::vector<uint32_t> all;
  const int64_t start = MonoMs();
  // (The allocator's own tick may recover it first: then the slot is free.)
  for (;;) {
    auto rec = h->pool->ReadHost(want);
    if (!rec.ok()) return Fail("read host", rec.status());
    if (rec->state == runtime::SlotState::kFree) break;
    if (MonoMs() - start > 30000) {
      std::printf("slot %u not recovered within 30 s\n", want);
      return 1;
    }
    auto slots = h->alloc->RecoverDeadHosts();
    if (!slots.ok()) return Fail("recover", slots.status());
    all.insert(all.end(), slots->begin(), slots->end());
    usleep(200000);
  }
  std::printf("slot %u recovered and free after %.1f s; this call recovered %zu host(s):", want,
              (MonoMs() - start) / 1e3, all.size());
  for (uint32_t s : all) std::printf(" %u", s);
  std::printf("\n");
  return 0;
}

int Verify(const std::string& uri, const std::string& log, size_t size, const std::string& ns) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  auto store = kv::Store::Open(*h->alloc, {});
  if (!store.ok()) return Fail("store", store.status());
  std::ifstream in(log);
  std::string tag;
  uint64_t i = 0, n = 0, bad = 0;
  std::string rest;
  std::vector<uint8_t> got(size);
  while (in >> tag) {
    std::getline(in, rest);
    if (tag != "OK") continue;
    i = std::strtoull(rest.c_str(), nullptr, 10);
    ++n;
    auto r = (*store)->Get(ns, "w" + std::to_string(i), got.data(), got.size());
    if (!r.ok() || *r != size || got != Block(i, size)) {
      ++bad;
      std::printf("w%llu: %s\n", static_cast<unsigned long long>(i),
                  r.ok() ? "bytes differ" : std::string(r.status().ToString()).c_str());
    }
  }
  std::printf("verified %llu committed keys, %llu bad\n", static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(bad));
  return bad == 0 && n > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string ns = argc > 5 ? argv[5] : "vm";
  if (mode == "write" && (argc == 5 || argc == 6)) {
    return Write(argv[2], std::atof(argv[3]), std::atoll(argv[4]), ns);
  }
  if (mode == "recover" && argc == 4) return Recover(argv[2], std::atoi(argv[3]));
  if (mode == "verify" && (argc == 5 || argc == 6)) {
    return Verify(argv[2], argv[3], std::atoll(argv[4]), ns);
  }
  std::fprintf(stderr,
               "usage: kv_writer write URI SECONDS SIZE [NS] | recover URI SLOT | verify URI LOG "
               "SIZE [NS]\n");
  return 2;
}
