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
//   kv_writer cross-a URI DIR / cross-b URI DIR: one process in each kernel
//     (scenario_basic.sh), signalling through files in DIR: remote frees of
//     A's blocks by B, drained from A's ring; a pin of B's holding off A's delete.
//   kv_writer bigput URI SIZE KEY: attaches, prints "PUT STARTED", puts SIZE bytes
//     under (big, KEY), prints "PUT DONE ms" (scenario_kill.sh kills it in between).
//   kv_writer bigcheck URI SLOT SIZE KEY: no entry (big, KEY), SLOT's arena empty,
//     SIZE bytes allocate again, the store's audit clean.
#include <time.h>
#include <unistd.h>

#include <algorithm>
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
using runtime::PoolOffset;

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
  // (The allocator's own tick in another process may recover it first:
  // then the slot is free, or it was free when this process attached and
  // this process took it.)
  for (;;) {
    if (h->membership->slot() == want) break;
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
  std::printf("slot %u recovered and %s after %.1f s; this call recovered %zu host(s):", want,
              h->membership->slot() == want ? "taken again by this process" : "free",
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

// --- cross: two kernels, one process each (tests/vm/scenario_basic.sh). ---
// They signal through files in DIR (the 9p share): the harness's ordering.

void Signal(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/flag.x_" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) {
    fsync(fileno(f));
    std::fclose(f);
  }
  std::printf("signal %s\n", name.c_str());
  std::fflush(stdout);
}

bool Await(const std::string& dir, const std::string& name, int seconds = 60) {
  const std::string path = dir + "/flag.x_" + name;
  const int64_t start = MonoMs();
  while (access(path.c_str(), F_OK) != 0) {
    if (MonoMs() - start > seconds * 1000) {
      std::printf("timed out waiting for %s\n", name.c_str());
      std::fflush(stdout);
      return false;
    }
    usleep(100000);
  }
  return true;
}

constexpr int kCrossBlocks = 200;
constexpr size_t kCrossSize = 4096;
constexpr size_t kPinSize = 256 * 1024;
const char kPinNs[] = "pin";
const char kPinKey[] = "held";

// A: allocates kCrossBlocks blocks (each filled with Block(1000 + i)) and
// hands their offsets to B, which checks and frees them (remote frees, into
// this arena's ring); then ticks until its bytes in use are back to what they
// were. Then puts an entry that B pins, tries to delete it (refused while
// pinned), allocates and fills blocks of its size (none may be its block),
// and deletes it once B released the pin.
int CrossA(const std::string& uri, const std::string& dir) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  kv::StoreOptions so;
  so.create = true;
  auto store = kv::Store::Open(*h->alloc, so);
  if (!store.ok()) return Fail("store", store.status());
  auto& coh = h->pool->coherence();
  if (absl::Status s = h->alloc->Tick(); !s.ok()) return Fail("tick", s);
  const allocator::HostStats before = h->alloc->LocalStats();
  std::string offsets;
  for (int i = 0; i < kCrossBlocks; ++i) {
    auto off = h->alloc->Allocate(kCrossSize);
    if (!off.ok()) return Fail("allocate", off.status());
    const std::vector<uint8_t> v = Block(1000 + i, kCrossSize);
    coh.Publish(*off, v.data(), v.size());
    offsets += std::to_string(*off) + "\n";
  }
  const allocator::HostStats held = h->alloc->LocalStats();
  { std::ofstream(dir + "/cross.offsets") << offsets; }
  std::printf("slot %u allocated %d blocks of %zu B: bytes in use %llu -> %llu\n", h->alloc->slot(),
              kCrossBlocks, kCrossSize, static_cast<unsigned long long>(before.bytes_in_use),
              static_cast<unsigned long long>(held.bytes_in_use));
  if (held.bytes_in_use < before.bytes_in_use + kCrossBlocks * kCrossSize) {
    std::printf("FAIL: bytes in use did not grow by the blocks\n");
    return 1;
  }
  Signal(dir, "allocated");
  if (!Await(dir, "freed")) return 1;
  const int64_t start = MonoMs();
  allocator::HostStats after;
  for (;;) {
    if (absl::Status s = h->alloc->Tick(); !s.ok()) return Fail("tick", s);
    after = h->alloc->LocalStats();
    if (after.bytes_in_use <= before.bytes_in_use) break;
    if (MonoMs() - start > 10000) {
      std::printf("FAIL: bytes in use %llu, not back to %llu, 10 s after B's frees\n",
                  static_cast<unsigned long long>(after.bytes_in_use),
                  static_cast<unsigned long long>(before.bytes_in_use));
      return 1;
    }
    usleep(20000);
  }
  std::printf(
      "B's %d remote frees drained from the ring after %lld ms: bytes in use %llu, "
      "rejected frees %llu\n",
      kCrossBlocks, static_cast<long long>(MonoMs() - start),
      static_cast<unsigned long long>(after.bytes_in_use),
      static_cast<unsigned long long>(after.rejected_frees));
  if (after.rejected_frees != 0) return 1;
  if (absl::Status s = allocator::Audit(*h->pool); !s.ok()) return Fail("allocator audit", s);

  // Pins across kernels.
  const std::vector<uint8_t> v = Block(7777, kPinSize);
  if (absl::Status s = (*store)->Put(kPinNs, kPinKey, v.data(), v.size()); !s.ok()) {
    return Fail("put", s);
  }
  Signal(dir, "put");
  if (!Await(dir, "pinned")) return 1;
  absl::Status del = (*store)->Delete(kPinNs, kPinKey);
  std::printf("delete while B pins it: %s\n", std::string(del.ToString()).c_str());
  if (!absl::IsFailedPrecondition(del)) {
    std::printf("FAIL: the delete of a pinned entry was not refused\n");
    return 1;
  }
  // Blocks of the entry's size, filled: none may be the pinned entry's block.
  std::vector<PoolOffset> fill;
  const std::vector<uint8_t> junk(kPinSize, 0xee);
  for (int i = 0; i < 16; ++i) {
    auto off = h->alloc->Allocate(kPinSize);
    if (!off.ok()) return Fail("allocate", off.status());
    coh.Publish(*off, junk.data(), junk.size());
    fill.push_back(*off);
  }
  Signal(dir, "refused");
  if (!Await(dir, "released")) return 1;
  for (PoolOffset off : fill) {
    if (absl::Status s = h->alloc->Free(off); !s.ok()) return Fail("free", s);
  }
  del = (*store)->Delete(kPinNs, kPinKey);
  std::printf("delete after B released: %s\n", std::string(del.ToString()).c_str());
  if (!del.ok()) return 1;
  std::vector<uint8_t> got(kPinSize);
  auto r = (*store)->Get(kPinNs, kPinKey, got.data(), got.size());
  if (!absl::IsNotFound(r.status())) {
    std::printf("FAIL: get after the delete: %s\n",
                r.ok() ? "found" : std::string(r.status().ToString()).c_str());
    return 1;
  }
  if (absl::Status s = kv::Audit(*h->pool); !s.ok()) return Fail("kv audit", s);
  Signal(dir, "deleted");
  std::printf("CROSS-A OK\n");
  return 0;
}

// B: checks A's blocks byte-exact and frees them (each a remote free);
// pins A's entry, reads it byte-exact after A's refused delete and A's
// allocations, releases it, and sees it gone after A's delete.
int CrossB(const std::string& uri, const std::string& dir) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  auto store = kv::Store::Open(*h->alloc, {});
  if (!store.ok()) return Fail("store", store.status());
  auto& coh = h->pool->coherence();
  if (!Await(dir, "allocated")) return 1;
  std::ifstream in(dir + "/cross.offsets");
  std::vector<PoolOffset> offs;
  for (uint64_t off; in >> off;) offs.push_back(off);
  if (offs.size() != kCrossBlocks) {
    std::printf("FAIL: %zu offsets, not %d\n", offs.size(), kCrossBlocks);
    return 1;
  }
  std::vector<uint8_t> got(kCrossSize);
  int bad = 0;
  for (int i = 0; i < kCrossBlocks; ++i) {
    coh.Fetch(got.data(), offs[i], got.size());
    if (got != Block(1000 + i, kCrossSize)) ++bad;
  }
  std::printf("slot %u: %d of A's %d blocks byte-exact\n", h->alloc->slot(), kCrossBlocks - bad,
              kCrossBlocks);
  if (bad != 0) return 1;
  for (PoolOffset off : offs) {
    if (absl::Status s = h->alloc->Free(off); !s.ok()) return Fail("remote free", s);
  }
  if (absl::Status s = h->alloc->Tick(); !s.ok()) return Fail("tick", s);  // push the queue
  const allocator::HostStats mine = h->alloc->LocalStats();
  std::printf("freed %d blocks of A's (remote); my bytes in use %llu\n", kCrossBlocks,
              static_cast<unsigned long long>(mine.bytes_in_use));
  Signal(dir, "freed");

  if (!Await(dir, "put")) return 1;
  kv::PinSet pins;
  const std::vector<std::string> chain = {kPinKey};
  auto n = (*store)->Lookup(kPinNs, chain, &pins);
  if (!n.ok()) return Fail("lookup", n.status());
  if (*n != 1 || pins.size() != 1) {
    std::printf("FAIL: lookup found %zu, pins %zu\n", *n, pins.size());
    return 1;
  }
  const std::vector<uint8_t> want = Block(7777, kPinSize);
  std::vector<uint8_t> val(kPinSize);
  auto r = (*store)->Get(kPinNs, kPinKey, val.data(), val.size());
  if (!r.ok() || *r != kPinSize || val != want) {
    std::printf("FAIL: pinned entry before the delete: %s\n",
                r.ok() ? "bytes differ" : std::string(r.status().ToString()).c_str());
    return 1;
  }
  Signal(dir, "pinned");
  if (!Await(dir, "refused")) return 1;
  std::fill(val.begin(), val.end(), 0);
  r = (*store)->Get(kPinNs, kPinKey, val.data(), val.size());
  if (!r.ok() || *r != kPinSize || val != want) {
    std::printf("FAIL: pinned entry after A's delete and allocations: %s\n",
                r.ok() ? "bytes differ" : std::string(r.status().ToString()).c_str());
    return 1;
  }
  std::printf("pinned entry byte-exact after A's refused delete and 16 allocations of its size\n");
  (*store)->Release(pins);
  Signal(dir, "released");
  if (!Await(dir, "deleted")) return 1;
  auto c = (*store)->Contains(kPinNs, kPinKey);
  if (!c.ok() || *c) {
    std::printf("FAIL: the entry is still there after A's delete\n");
    return 1;
  }
  std::printf("CROSS-B OK\n");
  return 0;
}

// --- bigput: one large put that a kill interrupts (scenario_kill.sh). ---

std::vector<uint8_t> BigValue(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; k += 4096) v[k] = static_cast<uint8_t>(k >> 12);
  return v;
}

int BigPut(const std::string& uri, size_t size, const std::string& key) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  auto store = kv::Store::Open(*h->alloc, {});
  if (!store.ok()) return Fail("store", store.status());
  const std::vector<uint8_t> v = BigValue(size);
  std::printf("ATTACHED slot %u\n", h->membership->slot());
  std::printf("PUT STARTED %zu %lld\n", size, static_cast<long long>(MonoMs()));
  std::fflush(stdout);
  const int64_t start = MonoMs();
  absl::Status s = (*store)->Put("big", key, v.data(), v.size());
  if (!s.ok()) return Fail("put", s);
  std::printf("PUT DONE %lld ms\n", static_cast<long long>(MonoMs() - start));
  std::fflush(stdout);
  return 0;
}

// After the big put's host was recovered: no entry, no block of its arena
// left, room for the value again, the store's audit clean.
int BigCheck(const std::string& uri, uint32_t slot, size_t size, const std::string& key) {
  auto h = bench::AttachHost(uri, {});
  if (!h.ok()) return Fail("attach", h.status());
  auto store = kv::Store::Open(*h->alloc, {});
  if (!store.ok()) return Fail("store", store.status());
  auto c = (*store)->Contains("big", key);
  if (!c.ok()) return Fail("contains", c.status());
  if (*c) {
    std::printf("FAIL: the interrupted put left an entry\n");
    return 1;
  }
  auto st = allocator::ReadStats(*h->pool);
  if (!st.ok()) return Fail("stats", st.status());
  for (const allocator::HostStats& hs : st->hosts) {
    if (hs.slot == slot && hs.bytes_in_use + hs.bytes_cached + hs.huge_segments > 0) {
      std::printf("FAIL: slot %u's arena still holds %llu B in use, %llu huge segments\n", slot,
                  static_cast<unsigned long long>(hs.bytes_in_use),
                  static_cast<unsigned long long>(hs.huge_segments));
      return 1;
    }
  }
  if (absl::Status s = kv::Audit(*h->pool); !s.ok()) return Fail("kv audit", s);
  // The space came back: the same size allocates again (and is freed).
  auto off = h->alloc->Allocate(size);
  if (!off.ok()) return Fail("allocate the put's size again", off.status());
  if (absl::Status s = h->alloc->Free(*off); !s.ok()) return Fail("free", s);
  std::printf("no entry '%s', slot %u's arena empty, %zu B allocate again; heap free %llu B\n",
              key.c_str(), slot, size, static_cast<unsigned long long>(st->free_bytes));
  return 0;
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
  if (mode == "bigput" && argc == 5) return BigPut(argv[2], std::atoll(argv[3]), argv[4]);
  if (mode == "bigcheck" && argc == 6) {
    return BigCheck(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), argv[5]);
  }
  if (mode == "cross-a" && argc == 4) return CrossA(argv[2], argv[3]);
  if (mode == "cross-b" && argc == 4) return CrossB(argv[2], argv[3]);
  std::fprintf(
      stderr,
      "usage: kv_writer write URI SECONDS SIZE [NS] | recover URI SLOT | verify URI LOG "
      "SIZE [NS] | cross-a URI DIR | cross-b URI DIR | bigput URI SIZE KEY | bigcheck URI SLOT "
      "SIZE KEY\n");
  return 2;
}
