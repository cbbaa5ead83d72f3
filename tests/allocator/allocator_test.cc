// The pooled allocator in one process: every size path, alignment, named
// blocks, statistics, bad input, cross-host frees between two hosts of one
// process, and what Close leaves behind. Audit() is clean after each.
#include "cxlrt/allocator/allocator.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/membership.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::allocator {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::CoherenceDomain;
using runtime::Membership;
using runtime::Pool;

// One emulated host: its own open of the pool, membership and allocator.
struct Host {
  std::unique_ptr<Pool> pool;
  std::unique_ptr<Membership> membership;
  std::unique_ptr<Allocator> alloc;
};

Host OpenHost(const std::string& uri, bool create = false, AllocatorOptions options = {}) {
  Host h;
  auto pool = create ? Pool::Create(uri) : Pool::Open(uri);
  EXPECT_TRUE(pool.ok()) << pool.status();
  h.pool = std::move(*pool);
  runtime::AttachOptions ao;
  ao.host_id = -1;
  auto m = Membership::Attach(*h.pool, ao);
  EXPECT_TRUE(m.ok()) << m.status();
  h.membership = std::move(*m);
  options.tick = absl::ZeroDuration();  // deterministic: tests call Tick()
  auto a = Allocator::Open(*h.pool, *h.membership, options);
  EXPECT_TRUE(a.ok()) << a.status();
  if (a.ok()) h.alloc = std::move(*a);
  return h;
}

void ExpectAuditClean(const Pool& pool) {
  std::vector<std::string> problems;
  absl::Status s = Audit(pool, &problems);
  EXPECT_TRUE(s.ok()) << s;
}

// Fills [off, off+n) with bytes derived from `off` and checks them back.
void Fill(Pool& pool, PoolOffset off, uint64_t n) {
  std::vector<uint8_t> b(n);
  for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((off >> 6) + i * 31);
  pool.coherence().CopyToPool(off, b.data(), n);
}
bool Check(Pool& pool, PoolOffset off, uint64_t n) {
  std::vector<uint8_t> b(n);
  pool.coherence().CopyFromPool(b.data(), off, n);
  for (uint64_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<uint8_t>((off >> 6) + i * 31)) return false;
  }
  return true;
}

class AllocatorTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  void SetUp() override {
    create_ =
        PoolUri(dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam())), "64M");
    a_ = OpenHost(create_, true);
    ASSERT_NE(a_.alloc, nullptr);
  }
  Host Second() { return OpenHost(OpenUri(create_)); }

  TempDir dir_;
  std::string create_;
  Host a_;
};

TEST_P(AllocatorTest, EverySizeClassGivesDisjointAlignedBlocksThatHoldTheirBytes) {
  std::vector<std::pair<PoolOffset, uint64_t>> blocks;
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    for (uint64_t size : {uint64_t{kClassSizes[c]} - 1, uint64_t{kClassSizes[c]}}) {
      if (size == 0) continue;
      for (int k = 0; k < 3; ++k) {
        auto off = a_.alloc->Allocate(size);
        ASSERT_TRUE(off.ok()) << size << ": " << off.status();
        EXPECT_EQ(*off % 64, 0u);
        auto usable = a_.alloc->BlockSize(*off);
        ASSERT_TRUE(usable.ok());
        EXPECT_GE(*usable, size);
        EXPECT_EQ(*usable, ClassFor(size, 64) ? kClassSizes[*ClassFor(size, 64)] : 0);
        Fill(*a_.pool, *off, size);
        blocks.push_back({*off, size});
      }
    }
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first) << "blocks overlap";
  }
  for (auto [off, size] : blocks) EXPECT_TRUE(Check(*a_.pool, off, size)) << off;
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  ExpectAuditClean(*a_.pool);
  for (auto [off, size] : blocks) CXLRT_EXPECT_OK(a_.alloc->Free(off));
  HostStats st = a_.alloc->LocalStats();
  EXPECT_EQ(st.bytes_in_use, 0u);
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, PageRunsAndHugeBlocksServeLargeSizes) {
  std::vector<PoolOffset> got;
  for (uint64_t size : {uint64_t{300} << 10, uint64_t{1} << 20, uint64_t{1984} << 10,
                        (uint64_t{2} << 20) + 1, uint64_t{5} << 20}) {
    auto off = a_.alloc->Allocate(size);
    ASSERT_TRUE(off.ok()) << size << ": " << off.status();
    auto usable = a_.alloc->BlockSize(*off);
    ASSERT_TRUE(usable.ok());
    EXPECT_GE(*usable, size);
    EXPECT_EQ(*off % kPageSize, 0u);
    if (size > (uint64_t{1984} << 10)) {
      EXPECT_EQ(*off % kSegmentSize, 0u) << "huge blocks are whole segments";
    }
    Fill(*a_.pool, *off, size);
    got.push_back(*off);
  }
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(Check(*a_.pool, got[i], 100));
  }
  HostStats st = a_.alloc->LocalStats();
  EXPECT_GT(st.pages_allocated, 0u);
  EXPECT_EQ(st.huge_segments, 2u + 3u);  // 2 MiB + 1 B and 5 MiB
  ExpectAuditClean(*a_.pool);
  for (PoolOffset off : got) CXLRT_EXPECT_OK(a_.alloc->Free(off));
  EXPECT_EQ(a_.alloc->LocalStats().bytes_in_use, 0u);
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, AlignmentIsHonouredUpToWholeSegments) {
  for (uint64_t align : {uint64_t{128}, uint64_t{4096}, uint64_t{65536}, uint64_t{2} << 20}) {
    for (uint64_t size : {uint64_t{100}, uint64_t{5000}, uint64_t{70000}}) {
      auto off = a_.alloc->Allocate(size, {.alignment = align});
      ASSERT_TRUE(off.ok()) << size << "/" << align << ": " << off.status();
      EXPECT_EQ(*off % align, 0u) << size << " aligned to " << align;
      CXLRT_EXPECT_OK(a_.alloc->Free(*off));
    }
  }
  CXLRT_EXPECT_ERROR(a_.alloc->Allocate(100, {.alignment = 96}), absl::StatusCode::kInvalidArgument,
                     "not a power of two");
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, BadRequestsAreClearErrorsAndLeaveTheHeapConsistent) {
  CXLRT_EXPECT_ERROR(a_.alloc->Allocate(0), absl::StatusCode::kInvalidArgument, "0 bytes");
  CXLRT_EXPECT_ERROR(a_.alloc->Allocate(1ull << 40), absl::StatusCode::kInvalidArgument,
                     "the heap of");
  CXLRT_EXPECT_ERROR(a_.alloc->Free(16), absl::StatusCode::kInvalidArgument, "not in the heap");
  CXLRT_EXPECT_ERROR(a_.alloc->Free(a_.pool->size() + 4096), absl::StatusCode::kInvalidArgument,
                     "not in the heap");
  auto off = a_.alloc->Allocate(1000);
  ASSERT_TRUE(off.ok());
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*off + 64), absl::StatusCode::kInvalidArgument,
                     "not the start of a block");
  CXLRT_ASSERT_OK(a_.alloc->Free(*off));
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*off), absl::StatusCode::kFailedPrecondition, "double free");
  auto big = a_.alloc->Allocate(3 << 20);
  ASSERT_TRUE(big.ok());
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*big + (2 << 20)), absl::StatusCode::kInvalidArgument,
                     "inside");
  CXLRT_ASSERT_OK(a_.alloc->Free(*big));
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*big), absl::StatusCode::kFailedPrecondition, "double free");
  ExpectAuditClean(*a_.pool);

  // Fill the heap with huge blocks until it is full: a clear error, and
  // everything frees back.
  std::vector<PoolOffset> all;
  absl::StatusOr<PoolOffset> r;
  while ((r = a_.alloc->Allocate(4 << 20)).ok()) all.push_back(*r);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("longest free run"), std::string::npos)
      << r.status();
  EXPECT_FALSE(all.empty());
  ExpectAuditClean(*a_.pool);
  for (PoolOffset o : all) CXLRT_EXPECT_OK(a_.alloc->Free(o));
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, NamedBlocksAreFoundByOtherHostsAndFreedOnlyByName) {
  auto off = a_.alloc->AllocateNamed("comm/job7/slots", 5000);
  ASSERT_TRUE(off.ok()) << off.status();
  Fill(*a_.pool, *off, 5000);
  CXLRT_EXPECT_ERROR(a_.alloc->AllocateNamed("comm/job7/slots", 10),
                     absl::StatusCode::kAlreadyExists, "already exists");
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  auto found = b.alloc->Find("comm/job7/slots");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->offset, *off);
  EXPECT_EQ(found->size, 5000u);
  EXPECT_EQ(found->owner_host, a_.alloc->slot());
  EXPECT_TRUE(Check(*b.pool, found->offset, 5000));
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*off), absl::StatusCode::kFailedPrecondition, "FreeNamed");
  CXLRT_EXPECT_ERROR(b.alloc->Free(*off), absl::StatusCode::kFailedPrecondition, "FreeNamed");
  CXLRT_EXPECT_ERROR(b.alloc->Find("nope"), absl::StatusCode::kNotFound, "nope");
  ExpectAuditClean(*a_.pool);
  // Another host frees it by name: the block goes back to its owner.
  CXLRT_ASSERT_OK(b.alloc->FreeNamed("comm/job7/slots"));
  CXLRT_EXPECT_ERROR(b.alloc->Find("comm/job7/slots"), absl::StatusCode::kNotFound, "no region");
  CXLRT_ASSERT_OK(b.alloc->Tick());  // pushes the queued remote free
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  EXPECT_EQ(a_.alloc->LocalStats().durable_bytes, 0u);
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, CommitAndFreeDurableChangeTheBlockAndTheWordTogether) {
  auto words = a_.alloc->AllocateNamed("test/words", 64);
  ASSERT_TRUE(words.ok()) << words.status();
  runtime::Coherence& c = a_.pool->coherence();
  for (uint64_t size : {uint64_t{100}, uint64_t{200000}, uint64_t{5} << 20}) {
    SCOPED_TRACE(size);
    auto block = a_.alloc->Allocate(size);
    ASSERT_TRUE(block.ok()) << block.status();
    CXLRT_EXPECT_ERROR(a_.alloc->FreeDurable(*block, *words, 1),
                       absl::StatusCode::kFailedPrecondition, "not a durable block");
    CXLRT_ASSERT_OK(a_.alloc->CommitDurable(*block, *words, size));
    EXPECT_EQ(c.FetchObject<uint64_t>(*words), size);
    CXLRT_EXPECT_ERROR(a_.alloc->CommitDurable(*block, *words, 1),
                       absl::StatusCode::kFailedPrecondition, "not a private block");
    EXPECT_EQ(c.FetchObject<uint64_t>(*words), size) << "a refused call stores nothing";
    CXLRT_ASSERT_OK(a_.alloc->FreeDurable(*block, *words, 0));
    EXPECT_EQ(c.FetchObject<uint64_t>(*words), 0u);
    // Freed: a slab or page block is "not durable"; a huge one's segments are gone.
    EXPECT_FALSE(a_.alloc->FreeDurable(*block, *words, 1).ok());
    EXPECT_EQ(c.FetchObject<uint64_t>(*words), 0u);
  }
  // Bad words and blocks of other hosts are refused.
  auto mine = a_.alloc->Allocate(64);
  ASSERT_TRUE(mine.ok());
  CXLRT_EXPECT_ERROR(a_.alloc->CommitDurable(*mine, *words + 4, 1),
                     absl::StatusCode::kInvalidArgument, "8-byte aligned");
  CXLRT_EXPECT_ERROR(a_.alloc->CommitDurable(*mine, 0, 1), absl::StatusCode::kInvalidArgument,
                     "word of the heap");
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  CXLRT_EXPECT_ERROR(b.alloc->CommitDurable(*mine, *words, 1), absl::StatusCode::kInvalidArgument,
                     "not in a block of host");
  // A committed block outlives its allocator, a private one does not.
  CXLRT_ASSERT_OK(a_.alloc->CommitDurable(*mine, *words, 5));
  CXLRT_ASSERT_OK(a_.alloc->Close());
  ExpectAuditClean(*a_.pool);
  auto st = ReadStats(*a_.pool);
  ASSERT_TRUE(st.ok());
  uint64_t durable = 0;
  for (const HostStats& h : st->hosts) durable += h.durable_bytes;
  EXPECT_EQ(durable, 128u) << "the words block and the committed block";
}

TEST_P(AllocatorTest, AnotherHostsFreeTravelsThroughTheRingToTheOwner) {
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  std::vector<PoolOffset> blocks;
  for (int i = 0; i < 100; ++i) {
    auto off = a_.alloc->Allocate(256);
    ASSERT_TRUE(off.ok());
    blocks.push_back(*off);
  }
  auto page_block = a_.alloc->Allocate(500 << 10);
  auto huge_block = a_.alloc->Allocate(3 << 20);
  ASSERT_TRUE(page_block.ok() && huge_block.ok());
  blocks.push_back(*page_block);
  blocks.push_back(*huge_block);
  for (PoolOffset off : blocks) CXLRT_EXPECT_OK(b.alloc->Free(off));
  CXLRT_ASSERT_OK(b.alloc->Tick());  // pushes what did not fit in the ring
  EXPECT_GT(a_.alloc->LocalStats().bytes_in_use, 0u) << "the owner reclaims only when it looks";
  for (int i = 0; i < 10; ++i) {
    CXLRT_ASSERT_OK(a_.alloc->Tick());
    CXLRT_ASSERT_OK(b.alloc->Tick());
  }
  EXPECT_EQ(a_.alloc->LocalStats().bytes_in_use, 0u);
  EXPECT_EQ(a_.alloc->LocalStats().rejected_frees, 0u);
  // A remote double free of a block the owner holds in its cache is caught
  // by the owner, counted, and changes nothing.
  auto off = a_.alloc->Allocate(256);
  ASSERT_TRUE(off.ok());
  CXLRT_ASSERT_OK(b.alloc->Free(*off));
  CXLRT_ASSERT_OK(b.alloc->Tick());
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  CXLRT_ASSERT_OK(b.alloc->Free(*off));
  CXLRT_ASSERT_OK(b.alloc->Tick());
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  EXPECT_EQ(a_.alloc->LocalStats().rejected_frees, 1u);
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, FreesQueuedForAnOwnerThatRestartedDropOnlyItsPrivateBlocks) {
  // Host b's blocks, freed by host a faster than b's ring takes them: most
  // wait in a's queue. Then b closes and its slot's next host takes over
  // (a new epoch) and allocates again, likely the very blocks b had. a's
  // queued frees of b's private blocks are moot (b's private blocks went
  // with it) and must not free the new host's; the durable ones still
  // apply.
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  const uint32_t slot = b.membership->slot();
  std::vector<PoolOffset> blocks;
  for (int i = 0; i < 3000; ++i) {
    auto off = b.alloc->Allocate(256);
    ASSERT_TRUE(off.ok()) << off.status();
    blocks.push_back(*off);
  }
  for (int i = 0; i < 50; ++i) {
    auto off = b.alloc->Allocate(4096, {.durable = true});
    ASSERT_TRUE(off.ok()) << off.status();
    blocks.push_back(*off);
  }
  for (PoolOffset off : blocks) CXLRT_ASSERT_OK(a_.alloc->Free(off));
  // b closes: what sits in its ring is applied, its private blocks reclaimed.
  b.alloc.reset();
  b.membership.reset();
  b.pool.reset();
  Host b2 = Second();
  ASSERT_NE(b2.alloc, nullptr);
  ASSERT_EQ(b2.membership->slot(), slot);
  std::vector<PoolOffset> mine;
  for (int i = 0; i < 3000; ++i) {
    auto off = b2.alloc->Allocate(256);
    ASSERT_TRUE(off.ok()) << off.status();
    Fill(*b2.pool, *off, 256);
    mine.push_back(*off);
  }
  for (int i = 0; i < 10; ++i) {
    CXLRT_ASSERT_OK(a_.alloc->Tick());
    CXLRT_ASSERT_OK(b2.alloc->Tick());
  }
  const HostStats st = b2.alloc->LocalStats();
  EXPECT_EQ(st.rejected_frees, 0u) << "a free meant for the previous incarnation reached b2";
  EXPECT_EQ(st.durable_bytes, 0u) << "the durable blocks' frees were lost";
  EXPECT_EQ(st.bytes_in_use, 3000u * 256) << "b2's own blocks were freed under it";
  for (PoolOffset off : mine) {
    EXPECT_TRUE(Check(*b2.pool, off, 256));
    CXLRT_EXPECT_OK(b2.alloc->Free(off));
  }
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, ManyCrossHostFreesComeBackAndAreReused) {
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  for (uint64_t size : {uint64_t{64}, uint64_t{4096}, uint64_t{100000}, uint64_t{1} << 20}) {
    for (int i = 0; i < 3000; ++i) {
      auto off = a_.alloc->Allocate(size);
      ASSERT_TRUE(off.ok()) << size << " #" << i << ": " << off.status();
      absl::Status st = b.alloc->Free(*off);
      ASSERT_TRUE(st.ok()) << size << " #" << i << ": " << st;
      if (i % 50 == 0) {
        CXLRT_ASSERT_OK(a_.alloc->Tick());
        CXLRT_ASSERT_OK(b.alloc->Tick());
      }
    }
    for (int i = 0; i < 5; ++i) {
      CXLRT_ASSERT_OK(b.alloc->Tick());
      CXLRT_ASSERT_OK(a_.alloc->Tick());
    }
    EXPECT_EQ(a_.alloc->LocalStats().bytes_in_use, 0u) << size;
    EXPECT_EQ(a_.alloc->LocalStats().rejected_frees, 0u) << size;
    ExpectAuditClean(*a_.pool);
  }
}

TEST_P(AllocatorTest, AnOwnerReclaimsRemoteFreesWithoutATick) {
  // No tick anywhere: the owner's refills must find the frees on their own
  // (a full sweep of the rings now and then), so its heap stays small.
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  for (int i = 0; i < 200000; ++i) {
    auto off = a_.alloc->Allocate(64);
    ASSERT_TRUE(off.ok()) << i << ": " << off.status();
    ASSERT_TRUE(b.alloc->Free(*off).ok());
  }
  EXPECT_LE(a_.alloc->LocalStats().segments, 2u)
      << "200000 blocks of 64 B (12 MiB) freed remotely were not reused";
}

TEST_P(AllocatorTest, StatisticsArePublishedForToolsToRead) {
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a_.alloc->Allocate(64).ok());
  ASSERT_TRUE(a_.alloc->Allocate(1 << 20).ok());
  HostStats local = a_.alloc->LocalStats();
  EXPECT_EQ(local.classes[0].handed_out, 10u);
  EXPECT_EQ(local.bytes_in_use, 640u + (1u << 20));
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  auto st = ReadStats(*a_.pool);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->hosts.size(), 1u);
  EXPECT_EQ(st->hosts[0].slot, a_.alloc->slot());
  EXPECT_EQ(st->hosts[0].bytes_in_use, 640u + (1u << 20));
  EXPECT_GT(st->hosts[0].bytes_cached, 0u) << "refills take a batch";
  EXPECT_GT(st->free_bytes, 0u);
  EXPECT_LE(st->largest_free_extent, st->free_bytes);
  EXPECT_GE(st->fragmentation, 0.0);
  EXPECT_LT(st->fragmentation, 1.0);
}

TEST_P(AllocatorTest, ClosingReclaimsPrivateBlocksAndKeepsDurableOnes) {
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  auto priv = b.alloc->Allocate(4096);
  auto durable = b.alloc->Allocate(4096, {.durable = true});
  auto named = b.alloc->AllocateNamed("kept", 100);
  ASSERT_TRUE(priv.ok() && durable.ok() && named.ok());
  Fill(*b.pool, *named, 100);
  const uint32_t slot = b.alloc->slot();
  CXLRT_ASSERT_OK(b.alloc->Close());
  auto st = ReadStats(*a_.pool);
  ASSERT_TRUE(st.ok());
  bool seen = false;
  for (const HostStats& h : st->hosts) {
    if (h.slot != slot) continue;
    seen = true;
    EXPECT_EQ(h.owner_epoch, 0u);
    EXPECT_EQ(h.bytes_in_use, 4096u + 128u) << "the durable and named blocks stay";
  }
  EXPECT_TRUE(seen);
  ExpectAuditClean(*a_.pool);
  // A free of the departed host's durable block is done in place.
  CXLRT_ASSERT_OK(a_.alloc->Free(*durable));
  CXLRT_ASSERT_OK(a_.alloc->FreeNamed("kept"));
  ExpectAuditClean(*a_.pool);
}

INSTANTIATE_TEST_SUITE_P(Domains, AllocatorTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

TEST_P(AllocatorTest, ThreadCachesCatchDoubleFreesWhereverTheBlockIs) {
  // In the freeing thread's cache, in another thread's cache, and back in
  // the arena after the cache overflowed: each second free is refused.
  auto off = a_.alloc->Allocate(64);
  ASSERT_TRUE(off.ok());
  CXLRT_ASSERT_OK(a_.alloc->Free(*off));
  CXLRT_EXPECT_ERROR(a_.alloc->Free(*off), absl::StatusCode::kFailedPrecondition, "double free");
  std::thread([&] {
    CXLRT_EXPECT_ERROR(a_.alloc->Free(*off), absl::StatusCode::kFailedPrecondition, "double free");
  }).join();
  std::vector<PoolOffset> many;
  for (int i = 0; i < 1000; ++i) {
    auto b = a_.alloc->Allocate(64);
    ASSERT_TRUE(b.ok());
    many.push_back(*b);
  }
  for (PoolOffset b : many) CXLRT_ASSERT_OK(a_.alloc->Free(b));
  for (PoolOffset b : many) {
    CXLRT_EXPECT_ERROR(a_.alloc->Free(b), absl::StatusCode::kFailedPrecondition, "double free");
  }
  EXPECT_EQ(a_.alloc->LocalStats().bytes_in_use, 0u);
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, ThreadsAllocateAndFreeEachOthersBlocksExactly) {
  // Four threads; each frees half of its blocks itself and hands the other
  // half to the next thread, so blocks cross caches. Every block holds its
  // bytes while in use, no block is handed to two threads, and at the end
  // the statistics say nothing is in use.
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::vector<PoolOffset>> inbox(kThreads);
  std::vector<std::mutex> inbox_mu(kThreads);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      uint8_t* base = const_cast<uint8_t*>(a_.pool->backend().base());
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t size = 64u << (rng() % 7);  // 64 B .. 4 KiB
        auto off = a_.alloc->Allocate(size);
        if (!off.ok()) {
          ++errors;
          continue;
        }
        std::memset(base + *off, t + 1, size);
        std::vector<PoolOffset> mine;
        {
          std::lock_guard<std::mutex> l(inbox_mu[t]);
          mine.swap(inbox[t]);
        }
        for (PoolOffset o : mine) {
          if (!a_.alloc->Free(o).ok()) ++errors;
        }
        bool bytes_ok = true;
        for (uint64_t i = 0; i < size; ++i) bytes_ok &= base[*off + i] == t + 1;
        if (!bytes_ok) ++errors;
        if (r % 2) {
          if (!a_.alloc->Free(*off).ok()) ++errors;
        } else {
          std::lock_guard<std::mutex> l(inbox_mu[(t + 1) % kThreads]);
          inbox[(t + 1) % kThreads].push_back(*off);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (PoolOffset o : inbox[t]) CXLRT_EXPECT_OK(a_.alloc->Free(o));
  }
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(a_.alloc->LocalStats().bytes_in_use, 0u);
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, StatisticsCountBlocksInThreadCachesAsCached) {
  std::vector<PoolOffset> blocks;
  for (int i = 0; i < 10; ++i) {
    auto off = a_.alloc->Allocate(100);
    ASSERT_TRUE(off.ok());
    blocks.push_back(*off);
  }
  for (int i = 0; i < 4; ++i) CXLRT_ASSERT_OK(a_.alloc->Free(blocks[i]));
  std::thread([&] { CXLRT_EXPECT_OK(a_.alloc->Free(blocks[4])); }).join();
  HostStats st = a_.alloc->LocalStats();
  EXPECT_EQ(st.classes[PlainClassFor(100)].handed_out, 5u);
  EXPECT_EQ(st.bytes_in_use, 5u * kClassSizes[PlainClassFor(100)]);
  CXLRT_ASSERT_OK(a_.alloc->Tick());
  auto published = ReadStats(*a_.pool);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->hosts[0].bytes_in_use, st.bytes_in_use);
  ExpectAuditClean(*a_.pool);
}

TEST_P(AllocatorTest, AThreadThatOutlivesItsAllocatorLeavesNothingBehind) {
  // The thread caches a block, the allocator closes (taking the block
  // back), then the thread exits: nothing touches the closed allocator.
  std::atomic<int> step{0};
  std::thread t([&] {
    auto off = a_.alloc->Allocate(64);
    EXPECT_TRUE(off.ok());
    if (off.ok()) CXLRT_EXPECT_OK(a_.alloc->Free(*off));
    step = 1;
    while (step != 2) std::this_thread::yield();
  });
  while (step != 1) std::this_thread::yield();
  CXLRT_ASSERT_OK(a_.alloc->Close());
  a_.alloc.reset();
  step = 2;
  t.join();
  ExpectAuditClean(*a_.pool);
  Host b = Second();
  ASSERT_NE(b.alloc, nullptr);
  EXPECT_EQ(b.alloc->LocalStats().bytes_in_use, 0u);
}

TEST(AllocatorDeviceTest, BlocksPlacedOnADeviceLieWithinItAndBadDevicesAreRefused) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "devices=2", "128M");
  Host h = OpenHost(uri, true);
  ASSERT_NE(h.alloc, nullptr);
  const runtime::DeviceMap& d = h.pool->devices();
  ASSERT_EQ(d.count(), 2u);
  for (int dev : {0, 1, 1, 0}) {
    for (uint64_t size : {uint64_t{4096}, uint64_t{3} << 20}) {
      auto off = h.alloc->Allocate(size, {.device = dev});
      ASSERT_TRUE(off.ok()) << off.status();
      EXPECT_EQ(d.DeviceOf(*off), static_cast<uint32_t>(dev));
      EXPECT_EQ(d.DeviceOf(*off + size - 1), static_cast<uint32_t>(dev)) << "spills over";
      CXLRT_EXPECT_OK(h.alloc->Free(*off));
    }
  }
  CXLRT_EXPECT_ERROR(h.alloc->Allocate(64, {.device = 2}), absl::StatusCode::kInvalidArgument,
                     "device 2");
  // More than a device holds: a clear error, not a block across two.
  CXLRT_EXPECT_ERROR(h.alloc->Allocate(100 << 20, {.device = 0}),
                     absl::StatusCode::kResourceExhausted, "");
  ExpectAuditClean(*h.pool);
}

// Bytes of memory behind the files of a pool (its device files included).
uint64_t ReservedBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    struct stat st;
    if (stat(e.path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

TEST(LazyReservationTest, APoolMadeWithReserveLazyGetsMemoryAsItsHeapGrows) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "reserve=lazy&devices=2", "256M");
  Host h = OpenHost(uri, true);
  ASSERT_NE(h.alloc, nullptr);
  const uint64_t at_start = ReservedBytes(dir.path());
  EXPECT_LT(at_start, 16u << 20) << "the tables, not the heap";
  std::vector<PoolOffset> blocks;
  for (uint64_t size : {uint64_t{64}, uint64_t{40} << 10, uint64_t{12} << 20}) {
    for (int dev : {0, 1}) {
      auto off = h.alloc->Allocate(size, {.device = dev});
      ASSERT_TRUE(off.ok()) << off.status();
      Fill(*h.pool, *off, size);
      blocks.push_back(*off);
    }
  }
  const uint64_t grown = ReservedBytes(dir.path());
  EXPECT_GE(grown, at_start + (24u << 20));
  EXPECT_LT(grown, 128u << 20) << "reserved far more than the heap used";
  // Another open of a lazy pool is not pre-faulted into reserving it all.
  Host other = OpenHost(testing::OpenUri(uri));
  ASSERT_NE(other.alloc, nullptr);
  EXPECT_LT(ReservedBytes(dir.path()), 128u << 20);
  for (PoolOffset off : blocks) CXLRT_EXPECT_OK(h.alloc->Free(off));
  ExpectAuditClean(*h.pool);
}

TEST(LazyReservationTest, AFullFilesystemIsAClearErrorAtTheClaimNeverASigbus) {
  TempDir dir;
  const std::string mnt = dir.path() + "/small";
  ASSERT_EQ(mkdir(mnt.c_str(), 0700), 0);
  // A 64 MiB tmpfs in a mount namespace of the child's own, holding a pool
  // of 48 MiB, filled by another file after the pool was made: the heap
  // runs out of memory long before it runs out of segments.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64m") != 0) {
      _exit(77);
    }
    const std::string uri = absl::StrCat("emu://lazy?size=48M&reserve=lazy&dir=", mnt);
    {
      // Creating on a full filesystem: a clear error, no file left behind.
      const int full = open((mnt + "/full").c_str(), O_CREAT | O_RDWR, 0600);
      if (full < 0 || posix_fallocate(full, 0, 63 << 20) != 0) _exit(5);
      auto pool = Pool::Create(uri);
      if (pool.ok() || pool.status().code() != absl::StatusCode::kResourceExhausted) _exit(6);
      if (access((mnt + "/cxlrt-lazy.pool").c_str(), F_OK) == 0) _exit(7);
      close(full);
      unlink((mnt + "/full").c_str());
    }
    {
      // A tmpfs without a size limit (statvfs says 0 blocks) takes a lazy pool.
      const std::string unlimited = mnt + "/unlimited";
      if (mkdir(unlimited.c_str(), 0700) != 0 ||
          mount("tmpfs", unlimited.c_str(), "tmpfs", 0, "size=0") != 0) {
        _exit(8);
      }
      if (!Pool::Create(absl::StrCat("emu://u?size=8M&reserve=lazy&dir=", unlimited)).ok()) {
        _exit(9);
      }
    }
    Host h = OpenHost(uri, true);
    if (h.alloc == nullptr) _exit(2);
    const int ballast = open((mnt + "/ballast").c_str(), O_CREAT | O_RDWR, 0600);
    if (ballast < 0 || posix_fallocate(ballast, 0, 40 << 20) != 0) _exit(4);
    uint64_t allocated = 0;
    for (;;) {
      auto off = h.alloc->Allocate(1 << 20);
      if (!off.ok()) {
        const bool clear = off.status().code() == absl::StatusCode::kResourceExhausted &&
                           absl::StrContains(off.status().message(), "cannot reserve");
        if (!clear) fprintf(stderr, "unexpected: %s\n", off.status().ToString().c_str());
        _exit(clear && allocated >= (8u << 20) ? 0 : 3);
      }
      Fill(*h.pool, *off, 1 << 20);  // a SIGBUS here if memory were missing
      allocated += 1 << 20;
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 77) {
    if (getenv("CI") != nullptr) FAIL() << "under CI=true this test must run: it needs root";
    GTEST_SKIP() << "needs a private mount namespace (root) for a small tmpfs";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(PoolPtrTest, ResolvesInTheMappingAndChecksRawPointers) {
  TempDir dir;
  auto pool = Pool::Create(PoolUri(dir));
  CXLRT_ASSERT_OK(pool);
  const uint8_t* base = (*pool)->backend().base();
  PoolPtr<uint64_t> p(4096);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(p.Get(**pool)), base + 4096);
  auto back = PoolPtr<uint64_t>::FromRaw(**pool, p.Get(**pool));
  CXLRT_ASSERT_OK(back);
  EXPECT_EQ(back->offset(), 4096u);
  uint64_t local = 0;
  CXLRT_EXPECT_ERROR(PoolPtr<uint64_t>::FromRaw(**pool, &local), absl::StatusCode::kInvalidArgument,
                     "does not point into");
  const auto* last = reinterpret_cast<const uint64_t*>(base + (*pool)->size() - 4);
  EXPECT_FALSE(PoolPtr<uint64_t>::FromRaw(**pool, last).ok()) << "a T must fit";
  EXPECT_FALSE(PoolPtr<int>()) << "default is null";
}

TEST(SizeClassTest, ClassesCoverEverySmallSizeWithBoundedWaste) {
  for (uint64_t size = 1; size <= kMaxSmallSize; size += 61) {
    auto c = ClassFor(size, 64);
    ASSERT_TRUE(c.has_value()) << size;
    EXPECT_GE(kClassSizes[*c], size);
    if (size > 64) {
      EXPECT_LT(kClassSizes[*c], size * 3 / 2 + 64) << size;
    }
  }
  EXPECT_FALSE(ClassFor(kMaxSmallSize + 1, 64).has_value());
  EXPECT_EQ(kClassSizes[*ClassFor(100, 4096)], 4096u) << "aligned classes are powers of two";
  EXPECT_FALSE(ClassFor(100, 128 << 10).has_value()) << "beyond 64 KiB alignment: segments";
}

}  // namespace
}  // namespace cxlrt::allocator

namespace cxlrt::allocator {
namespace {

// Issue 13, defect 9: an allocator header with a valid checksum whose table
// offsets wrap around 2^64 passed the old sums, and every opener aborted.
// Each is kDataLoss naming the layout now, for every table.
TEST(AllocatorHeaderTest, TableOffsetsThatWrapAreDataLossNotAnAbort) {
  for (int field = 0; field < 5; ++field) {
    TempDir dir;
    const std::string create = PoolUri(dir, "", "64M");
    PoolOffset at = 0;
    {
      Host h = OpenHost(create, true);
      ASSERT_TRUE(h.alloc);
      at = h.pool->header().heap_offset;
    }
    auto pool = Pool::Open(OpenUri(create));
    CXLRT_ASSERT_OK(pool);
    runtime::Coherence& c = (*pool)->coherence();
    auto hdr = c.FetchObject<AllocatorHeaderLayout>(at);
    switch (field) {
      case 0:
        hdr.segment_table = ~uint64_t{0} - 64ull * hdr.segment_count + 1;
        break;
      case 1:
        hdr.arenas = ~uint64_t{0} - 4095;
        break;
      case 2:
        hdr.row_stride = 0xFFFFFF80u;  // the rings then pass the metadata's end
        break;
      case 3:
        hdr.ring_tails = ~uint64_t{0} - 127;
        break;
      case 4:
        hdr.ring_entries = hdr.ring_tails - 128;  // overlaps the table before it
        break;
    }
    hdr.checksum = allocator_internal::AllocatorHeaderChecksum(hdr);
    c.PublishObject(at, hdr);
    runtime::AttachOptions ao;
    ao.host_id = -1;
    auto m = Membership::Attach(**pool, ao);
    CXLRT_ASSERT_OK(m);
    auto a = Allocator::Open(**pool, **m);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss)
        << "field " << field << ": " << a.status();
    std::vector<std::string> problems;
    EXPECT_FALSE(Audit(**pool, &problems).ok()) << "field " << field;
  }
}

}  // namespace
}  // namespace cxlrt::allocator
