// The KV-cache store within one process: two or three emulated hosts (each
// its own open of the pool, membership, allocator and store), in the
// hardware and simulated coherence domains. Lifecycle, namespaces, quotas,
// prefix lookup, pins, eviction order, restart, bad input, and gets that
// race evictions.
#include "cxlrt/kv/store.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/kv/internal/eviction.h"
#include "cxlrt/kv/internal/store_view.h"
#include "cxlrt/runtime/membership.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::kv {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::CoherenceDomain;
using runtime::Membership;
using runtime::Pool;

struct Host : ::cxlrt::testing::TestHost {
  std::unique_ptr<Store> store;
};

StoreOptions SmallStore() {
  StoreOptions o;
  o.create = true;
  o.hosts = 4;
  o.entries_per_host = 256;
  o.pins_per_host = 128;
  o.max_namespaces = 8;
  return o;
}

// A host with the store open; a failed step is a test failure (and leaves
// the rest null).
Host OpenHost(const std::string& uri, bool create, StoreOptions so = SmallStore(),
              std::optional<uint32_t> slot = std::nullopt) {
  ::cxlrt::testing::TestHostOptions o;
  o.create_pool = create;
  o.slot = slot;
  Host h;
  auto base = ::cxlrt::testing::AttachTestHost(uri, o);
  EXPECT_TRUE(base.ok()) << base.status();
  if (!base.ok()) return h;
  static_cast<::cxlrt::testing::TestHost&>(h) = std::move(*base);
  auto s = Store::Open(*h.alloc, so);
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) h.store = std::move(*s);
  return h;
}

// A value whose bytes depend on the key and a version, so any byte from
// another key or put is caught.
std::vector<uint8_t> Value(absl::string_view key, size_t n, uint32_t version = 0) {
  std::vector<uint8_t> v(n);
  uint64_t x = KeyHash(version, key) | 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

void ExpectAuditClean(const Pool& pool) {
  std::vector<std::string> problems;
  // The hosts are live: an arena whose owner kept publishing through every
  // try of the audit is skipped as busy (a slow run, under TSan, meets it);
  // look again rather than call that a problem.
  absl::Status a;
  for (int i = 0; i < 5; ++i) {
    problems.clear();
    a = allocator::Audit(pool, &problems);
    if (a.ok() || !absl::StrContains(a.message(), "(busy)")) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(a.ok()) << a;
  absl::Status k = Audit(pool, &problems);
  EXPECT_TRUE(k.ok()) << k;
}

class StoreTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  void SetUp() override {
    create_ =
        PoolUri(dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam())), "160M");
    a_ = OpenHost(create_, true);
    ASSERT_NE(a_.store, nullptr);
    b_ = OpenHost(OpenUri(create_), false);
    ASSERT_NE(b_.store, nullptr);
  }
  void ExpectGet(Host& h, absl::string_view ns, absl::string_view key,
                 const std::vector<uint8_t>& want) {
    std::vector<uint8_t> got(want.size() + 7, 0xee);
    auto n = h.store->Get(ns, key, got.data(), got.size());
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, want.size());
    got.resize(*n);
    EXPECT_TRUE(got == want) << "wrong bytes for key " << key;
  }

  TempDir dir_;
  std::string create_;
  Host a_, b_;
};

TEST_P(StoreTest, AValuePutByOneHostIsGotByAnotherByteExact) {
  const std::vector<size_t> sizes = {1, 63, 64, 100, 4096, 16 << 10, 300 << 10, 3 << 20};
  for (size_t n : sizes) {
    const std::string key = absl::StrCat("block-", n);
    CXLRT_ASSERT_OK(a_.store->Put("llama/fp16", key, Value(key, n).data(), n));
  }
  for (size_t n : sizes) {
    const std::string key = absl::StrCat("block-", n);
    ExpectGet(b_, "llama/fp16", key, Value(key, n));
    ExpectGet(a_, "llama/fp16", key, Value(key, n));
    auto size = b_.store->ValueSize("llama/fp16", key);
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, n);
    EXPECT_EQ(b_.store->Contains("llama/fp16", key).value_or(false), true);
  }
  EXPECT_EQ(b_.store->Contains("llama/fp16", "nope").value_or(true), false);
  // Keys longer than the index's inline part, binary keys.
  const std::string long_key(200, 'k'), other_long = std::string(199, 'k') + "j";
  const std::string binary("\0\1\2\xff", 4);
  CXLRT_ASSERT_OK(b_.store->Put("llama/fp16", long_key, Value(long_key, 1000).data(), 1000));
  CXLRT_ASSERT_OK(b_.store->Put("llama/fp16", binary, Value(binary, 10).data(), 10));
  ExpectGet(a_, "llama/fp16", long_key, Value(long_key, 1000));
  ExpectGet(a_, "llama/fp16", binary, Value(binary, 10));
  EXPECT_EQ(a_.store->Contains("llama/fp16", other_long).value_or(true), false);
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, TheFirstWriterWinsAndASecondPutChangesNothing) {
  CXLRT_ASSERT_OK(a_.store->Put("ns", "k", Value("k", 500, 1).data(), 500));
  CXLRT_EXPECT_ERROR(a_.store->Put("ns", "k", Value("k", 700, 2).data(), 700),
                     absl::StatusCode::kAlreadyExists, "already in the store (put by host");
  CXLRT_EXPECT_ERROR(b_.store->Put("ns", "k", Value("k", 700, 2).data(), 700),
                     absl::StatusCode::kAlreadyExists, "already in the store");
  ExpectGet(b_, "ns", "k", Value("k", 500, 1));
  auto st = a_.store->Stats();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->namespaces.size(), 1u);
  EXPECT_EQ(st->namespaces[0].entries, 1u);
  EXPECT_EQ(st->namespaces[0].puts, 1u);
  EXPECT_EQ(st->namespaces[0].put_exists, 2u) << "a refusal is counted by the host refused";
}

TEST_P(StoreTest, BatchesOfLargeValuesArePutAndGotOnSeveralThreadsExactly) {
  constexpr size_t kSize = 128 << 10;  // 24 x 128 KiB: above the parallel threshold
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < 24; ++i) {
    keys.push_back(absl::StrCat("batch-", i));
    values.push_back(Value(keys.back(), kSize));
  }
  keys.push_back("batch-3");  // a duplicate within the batch: one of the two wins
  values.push_back(Value("other", kSize));
  keys.push_back("");  // a bad key fails alone
  values.push_back(Value("x", 10));
  std::vector<PutItem> puts;
  for (size_t i = 0; i < keys.size(); ++i)
    puts.push_back({keys[i], values[i].data(), values[i].size(), {}});
  auto put = a_.store->BatchPut("batch", puts);
  ASSERT_EQ(put.size(), keys.size());
  int exists = 0;
  for (size_t i = 0; i < 24; ++i) exists += put[i].code() == absl::StatusCode::kAlreadyExists;
  exists += put[24].code() == absl::StatusCode::kAlreadyExists;
  EXPECT_EQ(exists, 1) << "exactly one of the two puts of batch-3 is refused";
  EXPECT_EQ(put[25].code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<uint8_t>> got(24, std::vector<uint8_t>(kSize));
  std::vector<GetItem> gets;
  for (size_t i = 0; i < 24; ++i) gets.push_back({keys[i], got[i].data(), got[i].size(), {}});
  gets.push_back({"missing", got[0].data(), 0, {}});
  auto res = b_.store->BatchGet("batch", gets);
  ASSERT_EQ(res.size(), 25u);
  for (size_t i = 0; i < 24; ++i) {
    ASSERT_TRUE(res[i].ok()) << res[i].status();
    if (i == 3 && put[3].code() == absl::StatusCode::kAlreadyExists) {
      EXPECT_EQ(got[i], values[24]);
    } else {
      EXPECT_EQ(got[i], values[i]) << keys[i];
    }
  }
  EXPECT_EQ(res[24].status().code(), absl::StatusCode::kNotFound);
  ExpectAuditClean(*a_.pool);
}

// A value in parts (a paged KV block: the K and V pages of every layer,
// each in its own buffer) goes in and out without staging: read whole, it
// is the parts in order; read into parts, each gets its own bytes back.
TEST_P(StoreTest, ValuesInPartsAreGatheredAndScattered) {
  const std::vector<size_t> sizes = {4096, 100, 65536, 1};
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PutPart> parts;
  std::vector<uint8_t> whole;
  for (size_t i = 0; i < sizes.size(); ++i) {
    pages.push_back(Value(absl::StrCat("page-", i), sizes[i]));
    parts.push_back({pages.back().data(), sizes[i]});
    whole.insert(whole.end(), pages.back().begin(), pages.back().end());
  }
  std::vector<PutItem> puts = {{"block-0", nullptr, 0, parts}};
  auto put = a_.store->BatchPut("paged", puts);
  CXLRT_ASSERT_OK(put[0]);
  ExpectGet(b_, "paged", "block-0", whole);

  std::vector<std::vector<uint8_t>> got;
  std::vector<GetPart> out;
  for (size_t n : sizes) got.emplace_back(n, 0);
  for (auto& g : got) out.push_back({g.data(), g.size()});
  std::vector<GetItem> gets = {{"block-0", nullptr, 0, out}};
  auto res = b_.store->BatchGet("paged", gets);
  ASSERT_TRUE(res[0].ok()) << res[0].status();
  EXPECT_EQ(*res[0], whole.size());
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(got[i], pages[i]) << "part " << i;

  // Parts of another layout: refused, saying the sizes, and nothing copied
  // (a block read into the wrong layout would be wrong bytes).
  std::vector<uint8_t> small(sizes[0] + sizes[1], 0xee), rest(sizes[2], 0xee);
  std::vector<GetPart> wrong = {{small.data(), small.size()}, {rest.data(), rest.size()}};
  gets = {{"block-0", nullptr, 0, wrong}};
  res = b_.store->BatchGet("paged", gets);
  CXLRT_EXPECT_ERROR(res[0], absl::StatusCode::kInvalidArgument, "its 2 parts hold");
  EXPECT_EQ(small, std::vector<uint8_t>(small.size(), 0xee));
  // A buffer and parts at once is a caller's mistake, for puts and gets.
  puts = {{"block-1", whole.data(), whole.size(), parts}};
  put = a_.store->BatchPut("paged", puts);
  CXLRT_EXPECT_ERROR(put[0], absl::StatusCode::kInvalidArgument, "both a buffer and 4 parts");
  gets = {{"block-0", whole.data(), whole.size(), out}};
  res = b_.store->BatchGet("paged", gets);
  CXLRT_EXPECT_ERROR(res[0], absl::StatusCode::kInvalidArgument, "both a buffer and 4 parts");
  CXLRT_EXPECT_ERROR(b_.store->Get("paged", "block-1", whole.data(), whole.size()),
                     absl::StatusCode::kNotFound, "not in the store");
  ExpectAuditClean(*a_.pool);
}

// A batch may say what kind of memory its buffers are (BatchOptions):
// host memory said to be host is put and got as without it; memory said to
// be GPU memory is refused without a usable GPU (kUnavailable), and with
// one when it is not (kInvalidArgument). Nothing is stored or copied.
TEST_P(StoreTest, ABatchToldItsMemoryKindIsTakenAtItsWordOrRefused) {
  const std::vector<uint8_t> v = Value("told", 5000);
  const BatchOptions host{.memory = runtime::MemoryKind::kHost};
  const BatchOptions gpu{.memory = runtime::MemoryKind::kGpu};
  std::vector<PutItem> puts = {{"told-host", v.data(), v.size(), {}}};
  auto put = a_.store->BatchPut("kinds", puts, host);
  CXLRT_ASSERT_OK(put[0]);
  std::vector<uint8_t> got(v.size(), 0);
  std::vector<GetItem> gets = {{"told-host", got.data(), got.size(), {}}};
  auto res = b_.store->BatchGet("kinds", gets, host);
  ASSERT_TRUE(res[0].ok()) << res[0].status();
  EXPECT_EQ(got, v);

  const auto wrong = ::cxlrt::gpu::GpuAvailable() ? absl::StatusCode::kInvalidArgument
                                                  : absl::StatusCode::kUnavailable;
  const std::string why = ::cxlrt::gpu::GpuAvailable() ? "said to be in GPU memory" : "";
  puts = {{"told-gpu", v.data(), v.size(), {}}};
  put = a_.store->BatchPut("kinds", puts, gpu);
  CXLRT_EXPECT_ERROR(put[0], wrong, why);
  CXLRT_EXPECT_ERROR(b_.store->Get("kinds", "told-gpu", got.data(), got.size()),
                     absl::StatusCode::kNotFound, "not in the store");
  std::fill(got.begin(), got.end(), 0xee);
  res = b_.store->BatchGet("kinds", gets, gpu);
  CXLRT_EXPECT_ERROR(res[0], wrong, why);
  EXPECT_EQ(got, std::vector<uint8_t>(got.size(), 0xee));
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, NamespacesNeverSeeEachOthersEntries) {
  CXLRT_ASSERT_OK(a_.store->Put("tenant-a", "prefix0", Value("a", 100).data(), 100));
  CXLRT_ASSERT_OK(b_.store->Put("tenant-b", "prefix0", Value("b", 200).data(), 200));
  ExpectGet(b_, "tenant-a", "prefix0", Value("a", 100));
  ExpectGet(a_, "tenant-b", "prefix0", Value("b", 200));
  CXLRT_ASSERT_OK(a_.store->Put("tenant-a", "only-a", Value("x", 10).data(), 10));
  std::vector<uint8_t> buf(64);
  CXLRT_EXPECT_ERROR(b_.store->Get("tenant-b", "only-a", buf.data(), buf.size()),
                     absl::StatusCode::kNotFound, "not in the store");
  CXLRT_EXPECT_ERROR(b_.store->Get("tenant-c", "only-a", buf.data(), buf.size()),
                     absl::StatusCode::kNotFound, "namespace");
  PinSet pins;
  auto n = b_.store->Lookup("tenant-b", {"only-a"}, &pins);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  auto list = ListEntries(*a_.pool, "tenant-a");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 2u);
  for (const EntryInfo& e : *list) EXPECT_EQ(e.ns, "tenant-a");
  auto stats = ReadStats(*a_.pool);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->live_entries, 3u);
}

TEST_P(StoreTest, BadInputIsAClearErrorAndChangesNothing) {
  std::vector<uint8_t> v(100, 1);
  const std::string long_key(kMaxKeyBytes + 1, 'k'), long_ns(kMaxNamespaceBytes + 1, 'n');
  CXLRT_EXPECT_ERROR(a_.store->Put("ns", "", v.data(), 1), absl::StatusCode::kInvalidArgument,
                     "key is empty");
  CXLRT_EXPECT_ERROR(a_.store->Put("ns", long_key, v.data(), 1), absl::StatusCode::kInvalidArgument,
                     "at most 256");
  CXLRT_EXPECT_ERROR(a_.store->Put("", "k", v.data(), 1), absl::StatusCode::kInvalidArgument,
                     "namespace is empty");
  CXLRT_EXPECT_ERROR(a_.store->Put(long_ns, "k", v.data(), 1), absl::StatusCode::kInvalidArgument,
                     "namespace is 257 bytes");
  CXLRT_EXPECT_ERROR(a_.store->Put("ns", "k", v.data(), 0), absl::StatusCode::kInvalidArgument,
                     "0 bytes");
  CXLRT_ASSERT_OK(a_.store->Put("ns", "k", v.data(), 100));
  std::vector<uint8_t> small(99, 0x55);
  CXLRT_EXPECT_ERROR(b_.store->Get("ns", "k", small.data(), small.size()),
                     absl::StatusCode::kInvalidArgument, "is 100 bytes; the destination holds 99");
  EXPECT_EQ(small, std::vector<uint8_t>(99, 0x55)) << "nothing copied";
  CXLRT_ASSERT_OK(a_.store->SetQuota("ns", 50 << 10));
  std::vector<uint8_t> big(60 << 10);
  CXLRT_EXPECT_ERROR(a_.store->Put("ns", "big", big.data(), big.size()),
                     absl::StatusCode::kInvalidArgument, "exceeds the quota");
  ExpectGet(b_, "ns", "k", v);
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, ACorruptPoolIsReportedNeverReadOutsideIt) {
  CXLRT_ASSERT_OK(a_.store->Put("c", "torn", Value("torn", 100).data(), 100));
  CXLRT_ASSERT_OK(a_.store->Put("c", "hostile", Value("hostile", 100).data(), 100));
  auto list = ListEntries(*a_.pool);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  auto view = kv_internal::StoreView::Open(*a_.pool);
  ASSERT_TRUE(view.ok()) << view.status();
  runtime::Coherence& c = a_.pool->coherence();
  for (const EntryInfo& e : *list) {
    const PoolOffset off = (*view)->EntryOff(e.owner, e.index);
    auto entry = c.FetchObject<EntryLayout>(off);
    if (e.key == "torn") {
      entry.value_size ^= 1;  // a flipped bit: the checksum no longer holds
    } else {
      entry.block = a_.pool->size() - 10;  // whole, but pointing past the pool's end
      entry.checksum = kv_internal::EntryChecksum(entry);
    }
    c.PublishObject(off, entry);
  }
  std::vector<uint8_t> buf(100);
  CXLRT_EXPECT_ERROR(b_.store->Get("c", "torn", buf.data(), buf.size()),
                     absl::StatusCode::kNotFound, "not in the store");
  CXLRT_EXPECT_ERROR(b_.store->Get("c", "hostile", buf.data(), buf.size()),
                     absl::StatusCode::kDataLoss, "outside the pool");
  std::vector<std::string> problems;
  EXPECT_EQ(Audit(*a_.pool, &problems).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(problems.size(), 3u) << "checksum, bounds, and the counters that no longer match";
  // A damaged header: the store is refused, with what is wrong.
  const auto region = a_.pool->FindRegion(kStoreRegionName);
  ASSERT_TRUE(region.ok());
  uint64_t bad = 0x1234;
  c.Publish(region->offset + offsetof(StoreHeaderLayout, entries_per_host), &bad, 8);
  CXLRT_EXPECT_ERROR(ReadStats(*a_.pool), absl::StatusCode::kDataLoss, "checksum mismatch");
}

TEST(StoreOpenTest, AStoreIsMadeOnlyWhenAskedAndItsGeometryIsChecked) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "32M");
  auto pool = Pool::Create(create);
  ASSERT_TRUE(pool.ok());
  auto m = Membership::Attach(**pool, {});
  ASSERT_TRUE(m.ok());
  auto alloc = allocator::Allocator::Open(**pool, **m);
  ASSERT_TRUE(alloc.ok());
  CXLRT_EXPECT_ERROR(Store::Open(**alloc), absl::StatusCode::kNotFound, "has no KV store");
  EXPECT_FALSE(HasStore(**pool));
  StoreOptions bad = SmallStore();
  bad.entries_per_host = 1000;
  CXLRT_EXPECT_ERROR(Store::Open(**alloc, bad), absl::StatusCode::kInvalidArgument,
                     "not a power of two");
  bad = SmallStore();
  bad.hosts = 100000;
  CXLRT_EXPECT_ERROR(Store::Open(**alloc, bad), absl::StatusCode::kInvalidArgument, "host slots");
  StoreOptions big = SmallStore();
  big.entries_per_host = 1 << 20;  // 128 MiB of index per host: more than the pool
  CXLRT_EXPECT_ERROR(Store::Open(**alloc, big), absl::StatusCode::kInvalidArgument, "");
  auto s = Store::Open(**alloc, SmallStore());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(HasStore(**pool));
}

TEST(StoreOpenTest, AHostWithoutAPartitionIsRefused) {
  TempDir dir;
  const std::string create = PoolUri(dir, "", "32M");
  Host a = OpenHost(create, true);
  ASSERT_NE(a.store, nullptr);
  auto pool = Pool::Open(OpenUri(create));
  ASSERT_TRUE(pool.ok());
  runtime::AttachOptions ao;
  ao.slot = 5;  // the store has 4 partitions
  auto m = Membership::Attach(**pool, ao);
  ASSERT_TRUE(m.ok());
  auto alloc = allocator::Allocator::Open(**pool, **m);
  ASSERT_TRUE(alloc.ok());
  CXLRT_EXPECT_ERROR(Store::Open(**alloc), absl::StatusCode::kFailedPrecondition,
                     "host slot 5 has no partition");
}

TEST_P(StoreTest, LookupReturnsTheLongestCachedPrefixAndPinsIt) {
  std::vector<std::string> chain;
  for (int i = 0; i < 10; ++i) chain.push_back(absl::StrCat("hash-", i));
  for (int i = 0; i < 6; ++i) {
    Host& h = i % 2 ? b_ : a_;  // the prefix spans both hosts' partitions
    CXLRT_ASSERT_OK(h.store->Put("m", chain[i], Value(chain[i], 1000).data(), 1000));
  }
  CXLRT_ASSERT_OK(a_.store->Put("m", chain[8], Value(chain[8], 1000).data(), 1000));  // after a gap
  PinSet pins;
  auto n = b_.store->Lookup("m", chain, &pins);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 6u);
  EXPECT_EQ(pins.size(), 6u);
  // Pinned entries cannot be deleted (nor evicted) by their owner.
  CXLRT_EXPECT_ERROR(a_.store->Delete("m", chain[0]), absl::StatusCode::kFailedPrecondition,
                     "pinned");
  CXLRT_EXPECT_ERROR(a_.store->Delete("m", chain[1]), absl::StatusCode::kFailedPrecondition,
                     "belongs to host");
  ExpectGet(a_, "m", chain[0], Value(chain[0], 1000));
  b_.store->Release(pins);
  EXPECT_TRUE(pins.empty());
  CXLRT_EXPECT_OK(a_.store->Delete("m", chain[0]));
  CXLRT_EXPECT_ERROR(a_.store->Delete("m", chain[0]), absl::StatusCode::kNotFound, "not in");
  n = b_.store->Lookup("m", chain, &pins);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  b_.store->Release(pins);
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, APinExpiresWithItsLeaseWhileItsHostLives) {
  StoreOptions so = SmallStore();
  so.pin_lease = absl::Milliseconds(300);
  Host c = OpenHost(OpenUri(create_), false, so);
  ASSERT_NE(c.store, nullptr);
  CXLRT_ASSERT_OK(a_.store->Put("lease", "k", Value("k", 100).data(), 100));
  PinSet pins;
  auto n = c.store->Lookup("lease", {"k"}, &pins);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  CXLRT_EXPECT_ERROR(a_.store->Delete("lease", "k"), absl::StatusCode::kFailedPrecondition,
                     "pinned");
  // c keeps beating; once its heartbeat passes the pin's lease the pin no
  // longer holds.
  absl::Status st;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(st = a_.store->Delete("lease", "k")).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CXLRT_EXPECT_OK(st);
  auto alive = a_.membership->Host(c.membership->slot());
  ASSERT_TRUE(alive.ok());
  EXPECT_EQ(alive->liveness, runtime::Liveness::kAlive) << "the pin expired, not its host";
  c.store->Release(pins);
}

TEST_P(StoreTest, AQuotaEvictsTheNamespacesOldestEntriesOfTheWriter) {
  CXLRT_ASSERT_OK(a_.store->SetQuota("q", 100 << 10));
  CXLRT_ASSERT_OK(a_.store->Put("other", "keep", Value("keep", 50 << 10).data(), 50 << 10));
  for (int i = 0; i < 6; ++i) {
    const std::string key = absl::StrCat("q", i);
    CXLRT_ASSERT_OK(a_.store->Put("q", key, Value(key, 30 << 10).data(), 30 << 10));
    if (i == 1) ExpectGet(a_, "q", "q0", Value("q0", 30 << 10));  // q0 is now more recent than q1
    if (i == 3) {
      // 100 KiB hold three 30 KiB values: the fourth put evicted one, the
      // least recently used, which is q1 (q0 was read after q1's put).
      EXPECT_EQ(b_.store->Contains("q", "q1").value_or(true), false);
      EXPECT_EQ(b_.store->Contains("q", "q0").value_or(false), true);
    }
  }
  // At the end the three newest are left.
  auto stats = ReadStats(*a_.pool);
  ASSERT_TRUE(stats.ok());
  for (const NamespaceStats& ns : stats->namespaces) {
    if (ns.name == "q") {
      EXPECT_EQ(ns.entries, 3u);
      EXPECT_LE(ns.bytes, 100u << 10);
      EXPECT_EQ(ns.evictions, 3u);
      EXPECT_EQ(ns.quota, 100u << 10);
    }
  }
  for (const char* gone : {"q0", "q1", "q2"}) {
    EXPECT_EQ(b_.store->Contains("q", gone).value_or(true), false) << gone;
  }
  for (const char* kept : {"q3", "q4", "q5"}) ExpectGet(b_, "q", kept, Value(kept, 30 << 10));
  ExpectGet(b_, "other", "keep", Value("keep", 50 << 10));
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, AFullPoolEvictsTheWritersOwnEntriesAndKeepsPinnedOnes) {
  // 160 MiB pool: 1 MiB values, far more than fit.
  const size_t n = 1 << 20;
  PinSet pins;
  for (int i = 0; i < 250; ++i) {
    const std::string key = absl::StrCat("blk", i);
    SCOPED_TRACE(i);
    CXLRT_ASSERT_OK(a_.store->Put("full", key, Value(key, n).data(), n));
    if (i == 0) {
      auto got = b_.store->Lookup("full", {key}, &pins);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, 1u);
    }
  }
  ExpectGet(b_, "full", "blk249", Value("blk249", n));
  ExpectGet(b_, "full", "blk0", Value("blk0", n));  // pinned: never evicted
  EXPECT_EQ(b_.store->Contains("full", "blk1").value_or(true), false);
  auto stats = ReadStats(*a_.pool);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->namespaces.size(), 1u);
  EXPECT_GT(stats->namespaces[0].evictions, 100u);
  b_.store->Release(pins);
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, S3FifoKeepsEntriesReadAgainAndEvictsOneHitWonders) {
  // A third host with S3-FIFO: a quota forces evictions among its entries.
  StoreOptions so = SmallStore();
  so.policy = EvictionPolicy::kS3Fifo;
  Host c = OpenHost(OpenUri(create_), false, so);
  ASSERT_NE(c.store, nullptr);
  CXLRT_ASSERT_OK(c.store->SetQuota("s3", 20 << 10));
  for (int i = 0; i < 10; ++i) {
    const std::string key = absl::StrCat("hot", i);
    CXLRT_ASSERT_OK(c.store->Put("s3", key, Value(key, 1024).data(), 1024));
    ExpectGet(c, "s3", key, Value(key, 1024));  // read again: earns the main queue
  }
  for (int i = 0; i < 30; ++i) {  // a scan of one-hit entries
    const std::string key = absl::StrCat("scan", i);
    CXLRT_ASSERT_OK(c.store->Put("s3", key, Value(key, 1024).data(), 1024));
  }
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(b_.store->Contains("s3", absl::StrCat("hot", i)).value_or(false), true) << i;
  }
  EXPECT_EQ(b_.store->Contains("s3", "scan0").value_or(true), false);
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, ValuesOf64MiBArePutAndGot) {
  const size_t n = 64 << 20;
  std::vector<uint8_t> v = Value("big", n);
  CXLRT_ASSERT_OK(a_.store->Put("big", "k", v.data(), n));
  ExpectGet(b_, "big", "k", v);
  CXLRT_EXPECT_OK(a_.store->Delete("big", "k"));
  ExpectAuditClean(*a_.pool);
}

TEST_P(StoreTest, AReopenedHostFindsItsEntriesAndCounters) {
  for (int i = 0; i < 20; ++i) {
    const std::string key = absl::StrCat("r", i);
    CXLRT_ASSERT_OK(a_.store->Put("persist", key, Value(key, 5000).data(), 5000));
  }
  const uint32_t slot = a_.membership->slot();
  a_.store.reset();
  CXLRT_ASSERT_OK(a_.alloc->Close());
  a_.alloc.reset();
  CXLRT_ASSERT_OK(a_.membership->Detach());
  a_.membership.reset();
  a_.pool.reset();
  // Entries stay readable while their host is gone...
  ExpectGet(b_, "persist", "r7", Value("r7", 5000));
  // ...and the host that takes the slot again owns them.
  Host again = OpenHost(OpenUri(create_), false, SmallStore(), slot);
  ASSERT_NE(again.store, nullptr);
  for (int i = 0; i < 20; ++i) {
    const std::string key = absl::StrCat("r", i);
    ExpectGet(again, "persist", key, Value(key, 5000));
  }
  CXLRT_EXPECT_OK(again.store->Delete("persist", "r3"));
  auto stats = again.store->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->namespaces[0].entries, 19u);
  EXPECT_EQ(stats->namespaces[0].puts, 20u);
  ExpectAuditClean(*b_.pool);
}

// A namespace record read while its writer is preempted halfway through it
// is torn, not corrupt: the reader waits for the writer (torn_read.h)
// instead of failing the Get with kDataLoss, which eight back-to-back
// retries did whenever the registering thread lost its CPU mid-write (the
// racing-gets test below met it under TSan).
TEST_P(StoreTest, ANamespaceRecordHalfWrittenByAPreemptedWriterIsWaitedFor) {
  CXLRT_ASSERT_OK(a_.store->Put("first", "k", "v", 1));  // record 0
  auto region = a_.pool->FindRegion(kStoreRegionName);
  ASSERT_TRUE(region.ok()) << region.status();
  runtime::Coherence& c = a_.pool->coherence();
  const auto h = c.FetchObject<StoreHeaderLayout>(region->offset);
  const runtime::PoolOffset rec = region->offset + h.namespaces_offset + sizeof(NamespaceLayout);
  NamespaceLayout n = {};
  n.used = 1;
  n.name_len = 6;
  std::memcpy(n.name, "second", 6);
  n.checksum = kv_internal::NamespaceChecksum(n);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&n);
  // The writer: the record's first line, a pause as if preempted, the rest.
  c.Publish(rec, bytes, 64);
  std::thread rest([&] {
    absl::SleepFor(absl::Milliseconds(10));
    c.Publish(rec + 64, bytes + 64, sizeof(n) - 64);
  });
  auto got = b_.store->ValueSize("second", "k");
  rest.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
}

TEST_P(StoreTest, GetsRacingEvictionsNeverReturnOtherBytes) {
  // Host a puts and deletes keys over and over, each put of a key with a
  // new version (so a stale block shows as wrong bytes); host b gets them
  // from two threads. Every get either fails with kNotFound or returns
  // exactly the bytes of one version of that key.
  constexpr int kKeys = 8;
  constexpr size_t kSize = 8192;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::vector<uint8_t> buf(kSize);
      for (uint64_t r = t; !stop.load(); ++r) {
        const std::string key = absl::StrCat("race", r % kKeys);
        auto n = b_.store->Get("race", key, buf.data(), buf.size());
        if (!n.ok()) {
          if (n.status().code() != absl::StatusCode::kNotFound) {
            ADD_FAILURE() << key << ": " << n.status();
            ++wrong;
          }
          continue;
        }
        // The version is in the first 4 bytes; the rest must match it.
        uint32_t version;
        std::memcpy(&version, buf.data(), 4);
        std::vector<uint8_t> want = Value(key, kSize, version);
        std::memcpy(want.data(), &version, 4);
        if (*n != kSize || buf != want) {
          ADD_FAILURE() << key << ": " << *n << " bytes of version " << version << " differ";
          ++wrong;
        } else {
          ++ok;
        }
      }
    });
  }
  const absl::Time end = absl::Now() + absl::Milliseconds(1500);
  for (uint32_t version = 1; absl::Now() < end; ++version) {
    const std::string key = absl::StrCat("race", version % kKeys);
    std::vector<uint8_t> v = Value(key, kSize, version);
    std::memcpy(v.data(), &version, 4);
    (void)a_.store->Delete("race", key);
    absl::Status st = a_.store->Put("race", key, v.data(), v.size());
    ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kAlreadyExists) << st;
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(ok.load(), 0u);
  ExpectAuditClean(*a_.pool);
}

INSTANTIATE_TEST_SUITE_P(Domains, StoreTest,
                         ::testing::Values(CoherenceDomain::kHardware, CoherenceDomain::kSimulated),
                         ::testing::PrintToStringParamName());

TEST(EvictionOrderTest, LruEvictsTheLeastRecentlyUsed) {
  kv_internal::EvictionOrder o(kv_internal::Policy::kLru, 16);
  for (uint32_t i = 0; i < 5; ++i) o.Insert(i, i);
  o.Touch(0);
  auto all = [](uint32_t) { return true; };
  EXPECT_EQ(o.TakeVictims(2, all), (std::vector<uint32_t>{1, 2}));
  o.Reinstate(1);  // kept (pinned): now the most recent
  EXPECT_EQ(o.TakeVictims(10, [](uint32_t i) { return i != 4; }), (std::vector<uint32_t>{3, 0, 1}));
  EXPECT_EQ(o.size(), 1u);
}

TEST(EvictionOrderTest, S3FifoEvictsOneHitWondersBeforeReReadEntries) {
  kv_internal::EvictionOrder o(kv_internal::Policy::kS3Fifo, 64);
  for (uint32_t i = 0; i < 20; ++i) o.Insert(i, 100 + i);
  for (uint32_t i = 0; i < 20; i += 2) o.Touch(i);  // the even ones are read again
  // Nine odd ones leave from the small queue; then it is under a tenth of
  // the entries and the main queue (read-again entries) gives one.
  auto victims = o.TakeVictims(9, [](uint32_t) { return true; });
  ASSERT_EQ(victims.size(), 9u);
  for (uint32_t v : victims) EXPECT_EQ(v % 2, 1u) << "a re-read entry went first: " << v;
  // An evicted key that comes back goes to the main queue (a ghost hit):
  // it outlives new one-hit entries.
  o.Insert(victims[0], 100 + victims[0]);
  for (uint32_t i = 30; i < 40; ++i) o.Insert(i, 1000 + i);
  auto next = o.TakeVictims(10, [](uint32_t) { return true; });
  EXPECT_EQ(std::count(next.begin(), next.end(), victims[0]), 0);
}

}  // namespace
}  // namespace cxlrt::kv
