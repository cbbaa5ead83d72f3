// The front door (cxlrt/cxlrt.h): one call opens or creates a pool,
// attaches and opens the allocator; stores and communicators made from a
// Host keep its state alive; bad URIs are clear errors.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlrt/cxlrt.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;

HostOptions Creating() {
  HostOptions o;
  o.create = true;
  o.attach.host_id = -1;  // any free slot, whatever CXLRT_HOST_ID says
  return o;
}

// Slots of the pool `uri` names that a host holds now, read from outside.
int AttachedSlots(const std::string& uri) {
  auto pool = runtime::Pool::Open(uri);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return -1;
  int n = 0;
  for (uint32_t i = 0; i < (*pool)->host_slots(); ++i) {
    auto r = (*pool)->ReadHost(i);
    if (r.ok() && r->state != runtime::SlotState::kFree) ++n;
  }
  return n;
}

void ExpectPutAndGet(kv::Store& store, const std::string& key) {
  const std::string value = "a block of KV cache for " + key;
  CXLRT_ASSERT_OK(store.Put("model", key, value.data(), value.size()));
  char got[128] = {};
  auto n = store.Get("model", key, got, sizeof(got));
  CXLRT_ASSERT_OK(n);
  EXPECT_EQ(std::string(got, *n), value);
}

TEST(HostTest, OneCallCreatesThePoolAttachesAndPutsAValue) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "64M");
  auto host = Host::Open(uri, Creating());
  CXLRT_ASSERT_OK(host);
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 1);
  kv::StoreOptions so;
  so.create = true;
  auto store = host->OpenStore(so);
  CXLRT_ASSERT_OK(store);
  ExpectPutAndGet(**store, "page-0");
  EXPECT_EQ(&host->allocator().pool(), &host->pool());
  EXPECT_EQ(host->membership().slot(), host->allocator().slot());
}

TEST(HostTest, AStoreOutlivesItsHostHandle) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "64M");
  std::shared_ptr<kv::Store> store;
  {
    auto host = Host::Open(uri, Creating());
    CXLRT_ASSERT_OK(host);
    kv::StoreOptions so;
    so.create = true;
    auto s = host->OpenStore(so);
    CXLRT_ASSERT_OK(s);
    store = *std::move(s);
    CXLRT_EXPECT_OK(host->Close());  // not the last share: the store keeps it
    EXPECT_TRUE(host->closed());
  }  // every Host handle gone
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 1);
  ExpectPutAndGet(*store, "after-the-host");
  store.reset();  // the last share: the allocator closes, the host detaches
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 0);
}

TEST(HostTest, ACommunicatorOutlivesItsHostHandle) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "64M");
  std::shared_ptr<collectives::Communicator> comm;
  {
    auto host = Host::Open(uri, Creating());
    CXLRT_ASSERT_OK(host);
    // A name its pool region could not carry is refused at once, on every
    // rank (before, its creation waited for a region it could never find).
    for (const char* bad : {"caf\xC3\xA9", "a\nb"}) {
      CXLRT_EXPECT_ERROR(host->CreateCommunicator(bad, 2, 1), absl::StatusCode::kInvalidArgument,
                         "printable ASCII");
    }
    auto c = host->CreateCommunicator("solo", 1, 0);
    CXLRT_ASSERT_OK(c);
    comm = *std::move(c);
  }
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  CXLRT_ASSERT_OK(
      comm->AllReduce(x, y, 4, collectives::DataType::kFloat32, collectives::RedOp::kSum));
  EXPECT_EQ(y[3], 4.0f);
  CXLRT_EXPECT_OK(comm->Destroy());
  comm.reset();
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 0);
}

TEST(HostTest, CopiesShareOneAttachmentAndTheLastCloseDetaches) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "64M");
  auto host = Host::Open(uri, Creating());
  CXLRT_ASSERT_OK(host);
  Host copy = *host;
  EXPECT_EQ(&copy.membership(), &host->membership());
  CXLRT_EXPECT_OK(host->Close());
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 1);
  CXLRT_EXPECT_OK(copy.Close());  // the last share: closes and detaches now
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 0);
  CXLRT_EXPECT_OK(copy.Close());  // again: nothing to do
  CXLRT_EXPECT_ERROR(copy.OpenStore(), absl::StatusCode::kFailedPrecondition, "closed");
  CXLRT_EXPECT_ERROR(copy.CreateCommunicator("late", 1, 0), absl::StatusCode::kFailedPrecondition,
                     "closed");
}

TEST(HostTest, CreateOpensAPoolThatExistsAndOpenAloneDoesNotCreate) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "", "64M");
  CXLRT_EXPECT_ERROR(Host::Open(OpenUri(uri)), absl::StatusCode::kNotFound, "");
  auto first = Host::Open(uri, Creating());
  CXLRT_ASSERT_OK(first);
  auto second = Host::Open(uri, Creating());  // exists now: opened, not made again
  CXLRT_ASSERT_OK(second);
  EXPECT_NE(first->membership().slot(), second->membership().slot());
  EXPECT_EQ(AttachedSlots(OpenUri(uri)), 2);
}

// Processes that all create the same pool at once (what a job's ranks do
// with create=true): one makes it, the others open it, none sees the
// half-made header.
TEST(HostTest, ProcessesRacingToCreateOnePoolAllOpenIt) {
  for (int round = 0; round < 5; ++round) {
    TempDir dir;
    const std::string uri = PoolUri(dir, "", "64M");
    constexpr int kProcs = 6;
    std::vector<pid_t> pids;
    for (int i = 0; i < kProcs; ++i) {
      pids.push_back(::cxlrt::testing::Spawn([&]() -> int {
        auto h = Host::Open(uri, Creating());
        if (!h.ok()) {
          fprintf(stderr, "racing creator: %s\n", h.status().ToString().c_str());
          return 1;
        }
        return 0;
      }));
    }
    for (pid_t p : pids) EXPECT_EQ(::cxlrt::testing::WaitExit(p), 0) << "round " << round;
  }
}

TEST(HostTest, BadUrisAreClearErrors) {
  TempDir dir;
  CXLRT_EXPECT_ERROR(Host::Open("nonsense"), absl::StatusCode::kInvalidArgument, "nonsense");
  CXLRT_EXPECT_ERROR(Host::Open("ftp://x"), absl::StatusCode::kInvalidArgument, "ftp");
  // Creating needs a size.
  CXLRT_EXPECT_ERROR(Host::Open("emu://nosize?dir=" + dir.path(), Creating()),
                     absl::StatusCode::kInvalidArgument, "size");
  // No URI: CXLRT_POOL, and saying so when it is not set.
  const char* saved = std::getenv("CXLRT_POOL");
  const std::string restore = saved ? saved : "";
  unsetenv("CXLRT_POOL");
  CXLRT_EXPECT_ERROR(Host::Open(), absl::StatusCode::kInvalidArgument, "CXLRT_POOL");
  const std::string uri = PoolUri(dir, "", "64M");
  setenv("CXLRT_POOL", uri.c_str(), 1);
  auto host = Host::Open("", Creating());
  CXLRT_EXPECT_OK(host);
  if (saved) {
    setenv("CXLRT_POOL", restore.c_str(), 1);
  } else {
    unsetenv("CXLRT_POOL");
  }
}

}  // namespace
}  // namespace cxlrt
