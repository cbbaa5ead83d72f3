// The KV-cache store across processes (emulated hosts): 2, 4 and 8 hosts
// putting, getting, looking up and evicting one key space with every read
// verified; a writer killed mid-put and mid-commit; a reader killed holding
// pins; an owner killed with entries pinned by others; an eviction killed
// halfway. After each, the survivors' results are checked and both the
// allocator's and the store's audits are clean.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::kv {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::TestScale;
using ::cxlrt::testing::WaitExit;
using runtime::CoherenceDomain;
using runtime::Pool;

constexpr absl::Duration kLease = absl::Milliseconds(400);

struct Host : ::cxlrt::testing::TestHost {
  std::unique_ptr<Store> store;
};

StoreOptions Geometry() {
  StoreOptions o;
  o.create = true;
  o.hosts = 8;
  o.entries_per_host = 1024;
  o.pins_per_host = 256;
  o.max_namespaces = 4;
  o.pin_lease = absl::Seconds(5);
  return o;
}

// Attaches as a host with a short lease and opens the store.
absl::StatusOr<Host> Attach(const std::string& uri, std::optional<uint32_t> slot = std::nullopt,
                            StoreOptions so = Geometry()) {
  ::cxlrt::testing::TestHostOptions o;
  o.slot = slot;
  o.lease = kLease;
  o.tick = absl::Milliseconds(2);
  Host h;
  CXLRT_ASSIGN_OR_RETURN(static_cast<::cxlrt::testing::TestHost&>(h),
                         ::cxlrt::testing::AttachTestHost(uri, o));
  CXLRT_ASSIGN_OR_RETURN(h.store, Store::Open(*h.alloc, so));
  return h;
}

// A self-describing value: [key hash 8][version 4][body crc 4][body...].
// A get that returns bytes of another key, another put or a torn block
// fails Verify.
std::vector<uint8_t> MakeValue(absl::string_view key, size_t n, uint32_t version) {
  std::vector<uint8_t> v(std::max<size_t>(n, 16));
  const uint64_t kh = KeyHash(0, key);
  std::mt19937_64 rng(kh ^ version);
  for (size_t i = 16; i < v.size(); ++i) v[i] = static_cast<uint8_t>(rng());
  const uint32_t crc = runtime::Crc32c(v.data() + 16, v.size() - 16);
  std::memcpy(v.data(), &kh, 8);
  std::memcpy(v.data() + 8, &version, 4);
  std::memcpy(v.data() + 12, &crc, 4);
  return v;
}

bool Verify(absl::string_view key, const uint8_t* v, size_t n) {
  if (n < 16) return false;
  uint64_t kh;
  uint32_t crc;
  std::memcpy(&kh, v, 8);
  std::memcpy(&crc, v + 12, 4);
  return kh == KeyHash(0, key) && crc == runtime::Crc32c(v + 16, n - 16);
}

void ExpectAuditsClean(const Pool& pool) {
  std::vector<std::string> problems;
  absl::Status a = allocator::Audit(pool, &problems);
  EXPECT_TRUE(a.ok()) << a;
  absl::Status k = Audit(pool, &problems);
  EXPECT_TRUE(k.ok()) << k;
}

// Waits until child `pid` sets the shared word `flag`. False when the child
// exits first, or (killed then) does not get there within `timeout`.
bool WaitSet(const uint64_t* flag, pid_t pid, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return false;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// Waits until `survivor` has recovered host `slot` (lease expired, fenced,
// arena recovered, slot released).
void RecoverDead(Host& survivor, uint32_t slot) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto r = survivor.alloc->RecoverDeadHosts();
    ASSERT_TRUE(r.ok()) << r.status();
    if (std::find(r->begin(), r->end(), slot) != r->end()) return;
    auto v = survivor.membership->Host(slot);
    if (v.ok() && v->liveness == runtime::Liveness::kFree) return;  // the tick did it
    absl::SleepFor(absl::Milliseconds(20));
  }
  FAIL() << "host " << slot << " was not recovered in time";
}

// --- Concurrency ---

struct Shape {
  CoherenceDomain domain;
  int hosts;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << runtime::CoherenceDomainName(s.domain) << "_" << s.hosts;
}

class StoreConcurrencyTest : public ::testing::TestWithParam<Shape> {};

// Per host, in shared memory: operations done and what they found.
struct Tally {
  uint64_t puts, gets, hits, lookups, pinned, wrong, errors;
};

TEST_P(StoreConcurrencyTest, HostsShareOneKeySpaceAndNoReadEverReturnsWrongBytes) {
  const Shape shape = GetParam();
  TempDir dir;
  const std::string create =
      PoolUri(dir, absl::StrCat("coherence=", runtime::CoherenceDomainName(shape.domain)), "96M");
  ASSERT_TRUE(Pool::Create(create).ok());
  const std::string uri = OpenUri(create);
  {
    // Make the store and a quota small enough that hosts evict all along.
    auto maker = Attach(uri);
    ASSERT_TRUE(maker.ok()) << maker.status();
    CXLRT_ASSERT_OK(maker->store->SetQuota("shared", 2 << 20));
  }
  auto* tally =
      static_cast<Tally*>(mmap(nullptr, sizeof(Tally) * shape.hosts, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(tally, 0, sizeof(Tally) * shape.hosts);
  const int ops = 3000 * TestScale() / std::max(1, shape.hosts / 2);
  std::vector<pid_t> kids;
  for (int h = 0; h < shape.hosts; ++h) {
    kids.push_back(Spawn([&, h]() -> int {
      auto host = Attach(uri);
      if (!host.ok()) {
        fprintf(stderr, "host %d: %s\n", h, host.status().ToString().c_str());
        return 10;
      }
      Tally& t = tally[h];
      std::mt19937_64 rng(1234 + h);
      std::vector<uint8_t> buf(300 << 10);
      auto key_of = [](uint64_t k) { return absl::StrCat("prefix-", k); };
      for (int op = 0; op < ops; ++op) {
        const uint64_t k = rng() % 120;
        const std::string key = key_of(k);
        switch (rng() % 4) {
          case 0: {  // put: most blocks 16 KiB, some larger
            const size_t n = rng() % 8 == 0 ? (256 << 10) : (16 << 10) + rng() % 1000;
            auto v = MakeValue(key, n, static_cast<uint32_t>(h * 1000000 + op));
            absl::Status st = host->store->Put("shared", key, v.data(), v.size());
            if (st.ok()) {
              ++t.puts;
            } else if (st.code() != absl::StatusCode::kAlreadyExists &&
                       st.code() != absl::StatusCode::kResourceExhausted) {
              fprintf(stderr, "host %d put: %s\n", h, st.ToString().c_str());
              ++t.errors;
            }
            break;
          }
          case 1:
          case 2: {  // get
            ++t.gets;
            auto n = host->store->Get("shared", key, buf.data(), buf.size());
            if (n.ok()) {
              ++t.hits;
              if (!Verify(key, buf.data(), *n)) ++t.wrong;
            } else if (n.status().code() != absl::StatusCode::kNotFound) {
              fprintf(stderr, "host %d get: %s\n", h, n.status().ToString().c_str());
              ++t.errors;
            }
            break;
          }
          case 3: {  // lookup a chain, then get every pinned key: it must be there
            std::vector<std::string> chain;
            for (int j = 0; j < 4; ++j) chain.push_back(key_of((k + j) % 120));
            PinSet pins;
            auto n = host->store->Lookup("shared", chain, &pins);
            ++t.lookups;
            if (!n.ok()) {
              ++t.errors;
              break;
            }
            t.pinned += *n;
            for (size_t j = 0; j < *n; ++j) {
              auto got = host->store->Get("shared", chain[j], buf.data(), buf.size());
              if (!got.ok() || !Verify(chain[j], buf.data(), *got)) {
                fprintf(stderr, "host %d: pinned key %s: %s\n", h, chain[j].c_str(),
                        got.ok() ? "wrong bytes" : got.status().ToString().c_str());
                ++t.wrong;
              }
            }
            host->store->Release(pins);
            break;
          }
        }
      }
      return 0;
    }));
  }
  for (pid_t kid : kids) EXPECT_EQ(WaitExit(kid, absl::Seconds(240)), 0);
  Tally sum = {};
  for (int h = 0; h < shape.hosts; ++h) {
    sum.puts += tally[h].puts;
    sum.gets += tally[h].gets;
    sum.hits += tally[h].hits;
    sum.lookups += tally[h].lookups;
    sum.pinned += tally[h].pinned;
    sum.wrong += tally[h].wrong;
    sum.errors += tally[h].errors;
  }
  munmap(tally, sizeof(Tally) * shape.hosts);
  printf("%d hosts: %lu puts, %lu gets (%lu hits), %lu lookups pinning %lu keys\n", shape.hosts,
         sum.puts, sum.gets, sum.hits, sum.lookups, sum.pinned);
  EXPECT_EQ(sum.wrong, 0u) << "a read returned bytes its writer did not write";
  EXPECT_EQ(sum.errors, 0u);
  EXPECT_GT(sum.puts, 0u);
  EXPECT_GT(sum.hits, 0u) << "hosts never read each other's entries";
  EXPECT_GT(sum.pinned, 0u);
  auto pool = Pool::Open(uri);
  ASSERT_TRUE(pool.ok());
  ExpectAuditsClean(**pool);
  auto stats = ReadStats(**pool);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->namespaces.size(), 1u);
  EXPECT_LE(stats->namespaces[0].bytes, uint64_t{2} << 20) << "the quota holds across hosts";
  EXPECT_GT(stats->namespaces[0].evictions, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, StoreConcurrencyTest,
    ::testing::Values(Shape{CoherenceDomain::kHardware, 2}, Shape{CoherenceDomain::kSimulated, 2},
                      Shape{CoherenceDomain::kHardware, 4}, Shape{CoherenceDomain::kSimulated, 4},
                      Shape{CoherenceDomain::kHardware, 8}, Shape{CoherenceDomain::kSimulated, 8}),
    ::testing::PrintToStringParamName());

// --- Crashes ---

class StoreCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string create = PoolUri(dir_, "", "64M");
    ASSERT_TRUE(Pool::Create(create).ok());
    uri_ = OpenUri(create);
    auto s = Attach(uri_);
    ASSERT_TRUE(s.ok()) << s.status();
    survivor_ = std::move(*s);
    shared_ = static_cast<uint64_t*>(
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  }
  void TearDown() override { munmap(shared_, 4096); }

  // Bytes the allocator holds for callers in host `slot`'s arena.
  uint64_t ArenaBytes(uint32_t slot) {
    auto st = allocator::ReadStats(*survivor_.pool);
    EXPECT_TRUE(st.ok());
    for (const auto& h : st.value_or(allocator::AllocatorStats{}).hosts) {
      if (h.slot == slot) return h.bytes_in_use;
    }
    return 0;
  }
  void ExpectValue(Host& h, absl::string_view key, size_t n, uint32_t version) {
    std::vector<uint8_t> buf(n);
    auto got = h.store->Get("ns", key, buf.data(), buf.size());
    ASSERT_TRUE(got.ok()) << key << ": " << got.status();
    EXPECT_EQ(buf, MakeValue(key, n, version)) << key;
  }

  TempDir dir_;
  std::string uri_;
  Host survivor_;
  uint64_t* shared_ = nullptr;
};

TEST_F(StoreCrashTest, AWriterKilledMidPutLeavesNothingVisibleAndItsSpaceIsReclaimed) {
  pid_t victim = Spawn([&]() -> int {
    auto h = Attach(uri_);
    if (!h.ok()) return 10;
    shared_[0] = h->membership->slot();
    auto kept = MakeValue("kept", 40000, 1);
    if (!h->store->Put("ns", "kept", kept.data(), kept.size()).ok()) return 11;
    if (!runtime::ArmFaults("kv.put.copied:crash").ok()) return 12;
    auto v = MakeValue("lost", 100000, 2);
    (void)h->store->Put("ns", "lost", v.data(), v.size());
    return 13;
  });
  EXPECT_EQ(WaitExit(victim), runtime::kFaultExitCode);
  const uint32_t slot = static_cast<uint32_t>(shared_[0]);
  EXPECT_EQ(survivor_.store->Contains("ns", "lost").value_or(true), false);
  ExpectValue(survivor_, "kept", 40000, 1);
  RecoverDead(survivor_, slot);
  // The committed entry's block stays (durable); the unfinished put's went
  // with the victim's private blocks.
  EXPECT_LT(ArenaBytes(slot), 100000u);
  EXPECT_GE(ArenaBytes(slot), 40000u);
  ExpectAuditsClean(*survivor_.pool);
  // A host taking the slot again drops the unfinished put and keeps the rest.
  auto again = Attach(uri_, slot);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectValue(*again, "kept", 40000, 1);
  EXPECT_EQ(again->store->Contains("ns", "lost").value_or(true), false);
  auto v = MakeValue("lost", 100000, 3);
  CXLRT_EXPECT_OK(again->store->Put("ns", "lost", v.data(), v.size()));
  ExpectValue(survivor_, "lost", 100000, 3);
  ExpectAuditsClean(*survivor_.pool);
}

TEST_F(StoreCrashTest, AWriterKilledInsideItsCommitHasItsEntryFinishedByRecovery) {
  pid_t victim = Spawn([&]() -> int {
    auto h = Attach(uri_);
    if (!h.ok()) return 10;
    shared_[0] = h->membership->slot();
    if (!runtime::ArmFaults("alloc.redo.block_changed:crash").ok()) return 12;
    auto v = MakeValue("sealed-by-recovery", 70000, 4);
    (void)h->store->Put("ns", "sealed-by-recovery", v.data(), v.size());
    return 13;
  });
  EXPECT_EQ(WaitExit(victim), runtime::kFaultExitCode);
  const uint32_t slot = static_cast<uint32_t>(shared_[0]);
  // The block turned durable but the seal was not stored: invisible until
  // recovery of the arena finishes the step.
  EXPECT_EQ(survivor_.store->Contains("ns", "sealed-by-recovery").value_or(true), false);
  RecoverDead(survivor_, slot);
  ExpectValue(survivor_, "sealed-by-recovery", 70000, 4);
  ExpectAuditsClean(*survivor_.pool);
}

TEST_F(StoreCrashTest, PinsOfAKilledReaderExpireWithItsLease) {
  for (int i = 0; i < 3; ++i) {
    const std::string key = absl::StrCat("p", i);
    auto v = MakeValue(key, 5000, 1);
    CXLRT_ASSERT_OK(survivor_.store->Put("ns", key, v.data(), v.size()));
  }
  pid_t reader = Spawn([&]() -> int {
    auto h = Attach(uri_);
    if (!h.ok()) return 10;
    PinSet pins;
    auto n = h->store->Lookup("ns", {"p0", "p1", "p2", "p3"}, &pins);
    if (!n.ok() || *n != 3) return 11;
    shared_[1] = 1;
    pause();  // killed holding its pins
    return 12;
  });
  ASSERT_TRUE(WaitSet(&shared_[1], reader)) << "the reader did not pin its keys";
  CXLRT_EXPECT_ERROR(survivor_.store->Delete("ns", "p1"), absl::StatusCode::kFailedPrecondition,
                     "pinned");
  kill(reader, SIGKILL);
  EXPECT_EQ(WaitExit(reader), 128 + SIGKILL);
  // Once its lease has run out, its pins no longer hold.
  absl::Status st;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!(st = survivor_.store->Delete("ns", "p1")).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CXLRT_EXPECT_OK(st);
  EXPECT_EQ(survivor_.store->Contains("ns", "p1").value_or(true), false);
  ExpectValue(survivor_, "p0", 5000, 1);
  ExpectAuditsClean(*survivor_.pool);
}

TEST_F(StoreCrashTest, AnOwnerKilledWithPinnedEntriesLeavesThemReadableAndWhole) {
  pid_t owner = Spawn([&]() -> int {
    auto h = Attach(uri_);
    if (!h.ok()) return 10;
    shared_[0] = h->membership->slot();
    for (int i = 0; i < 5; ++i) {
      const std::string key = absl::StrCat("o", i);
      auto v = MakeValue(key, 300000, 7);
      if (!h->store->Put("ns", key, v.data(), v.size()).ok()) return 11;
    }
    shared_[1] = 1;
    pause();
    return 12;
  });
  ASSERT_TRUE(WaitSet(&shared_[1], owner)) << "the owner did not put its entries";
  const uint32_t slot = static_cast<uint32_t>(shared_[0]);
  PinSet pins;
  auto n = survivor_.store->Lookup("ns", {"o0", "o1", "o2", "o3", "o4"}, &pins);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5u);
  kill(owner, SIGKILL);
  EXPECT_EQ(WaitExit(owner), 128 + SIGKILL);
  RecoverDead(survivor_, slot);
  for (int i = 0; i < 5; ++i) ExpectValue(survivor_, absl::StrCat("o", i), 300000, 7);
  ExpectAuditsClean(*survivor_.pool);
  survivor_.store->Release(pins);
  // The slot's next host owns them and can evict them.
  auto again = Attach(uri_, slot);
  ASSERT_TRUE(again.ok()) << again.status();
  CXLRT_EXPECT_OK(again->store->Delete("ns", "o0"));
  ExpectValue(*again, "o4", 300000, 7);
  ExpectAuditsClean(*survivor_.pool);
}

TEST_F(StoreCrashTest, AnEvictionKilledHalfwayIsFinishedWhenTheSlotReopens) {
  pid_t victim = Spawn([&]() -> int {
    auto h = Attach(uri_);
    if (!h.ok()) return 10;
    shared_[0] = h->membership->slot();
    for (const char* key : {"e0", "e1"}) {
      auto v = MakeValue(key, 50000, 1);
      if (!h->store->Put("ns", key, v.data(), v.size()).ok()) return 11;
    }
    if (!runtime::ArmFaults("kv.evict.unsealed:crash").ok()) return 12;
    (void)h->store->Delete("ns", "e0");
    return 13;
  });
  EXPECT_EQ(WaitExit(victim), runtime::kFaultExitCode);
  const uint32_t slot = static_cast<uint32_t>(shared_[0]);
  EXPECT_EQ(survivor_.store->Contains("ns", "e0").value_or(true), false);
  ExpectValue(survivor_, "e1", 50000, 1);
  RecoverDead(survivor_, slot);
  const uint64_t held = ArenaBytes(slot);
  auto again = Attach(uri_, slot);
  ASSERT_TRUE(again.ok()) << again.status();
  again->store.reset();                   // reopening finished the eviction
  CXLRT_ASSERT_OK(again->alloc->Tick());  // publishes the arena's counters
  EXPECT_LT(ArenaBytes(slot), held) << "the unsealed entry's block was freed";
  ExpectAuditsClean(*survivor_.pool);
  ExpectValue(survivor_, "e1", 50000, 1);
}

}  // namespace
}  // namespace cxlrt::kv

namespace cxlrt::kv {
namespace {

// Issue 13, defect 6: a host killed while making the KV store (its block
// allocated and zeroed, its header not written) left a store every later
// open waited 10 s for and then refused as "not written", forever; the
// pool check failed with "0 problems". Now the check lists it, and the next
// open frees the unwritten block once its creator's lease has run out and
// makes the store afresh.
TEST(StoreCreationCrashTest, AStoreWhoseCreatorDiedUnwrittenIsMadeAgain) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "128M");
  ASSERT_TRUE(runtime::Pool::Create(create).ok());
  const std::string uri = OpenUri(create);
  pid_t victim = Spawn([&]() -> int {
    if (!runtime::ArmFaults("kv.create.zeroed:crash").ok()) return 12;
    (void)Attach(uri);
    return 13;
  });
  ASSERT_EQ(WaitExit(victim), runtime::kFaultExitCode);
  {
    auto pool = runtime::Pool::Open(uri);
    CXLRT_ASSERT_OK(pool);
    std::vector<std::string> problems;
    EXPECT_FALSE(Audit(**pool, &problems).ok());
    ASSERT_FALSE(problems.empty()) << "a failed KV audit listed no problem";
    EXPECT_NE(problems[0].find("not written"), std::string::npos) << problems[0];
  }
  const absl::Time start = absl::Now();
  auto h = Attach(uri);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "open waited out its whole deadline";
  auto v = MakeValue("k", 5000, 1);
  CXLRT_ASSERT_OK(h->store->Put("ns", "k", v.data(), v.size()));
  std::vector<uint8_t> got(v.size());
  CXLRT_ASSERT_OK(h->store->Get("ns", "k", got.data(), got.size()));
  EXPECT_EQ(got, v);
  std::vector<std::string> problems;
  CXLRT_EXPECT_OK(Audit(*h->pool, &problems));
}

}  // namespace
}  // namespace cxlrt::kv
