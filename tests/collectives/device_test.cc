// cxlrt/collectives/device.h on any machine: without a GPU (or a build without
// CUDA) every pointer is host memory, calls that need a device say why, and
// collectives and KV calls on host memory never touch the device path.
// With a GPU, device memory is told from host and pool memory.
#include "cxlrt/collectives/device.h"

#include <vector>

#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {
namespace {

TEST(DeviceTest, HostAndPoolMemoryAreNeverDeviceMemory) {
  ::cxlrt::testing::TempDir dir;
  auto pool = runtime::Pool::Create(::cxlrt::testing::PoolUri(dir, "", "16M"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<uint8_t> heap(4096);
  int stack = 0;
  EXPECT_EQ(KindOf(heap.data()), MemoryKind::kHost);
  EXPECT_EQ(KindOf(&stack), MemoryKind::kHost);
  EXPECT_EQ(KindOf((*pool)->backend().base() + 8192), MemoryKind::kHost);
  EXPECT_EQ(KindOf(nullptr), MemoryKind::kHost);
}

TEST(DeviceTest, WithoutAGpuEveryDeviceCallSaysWhy) {
  if (DevicesAvailable()) GTEST_SKIP() << "a GPU is present: gpu_test covers it";
  const std::string why = DevicesUnavailableReason();
  EXPECT_FALSE(why.empty());
  ::cxlrt::testing::TempDir dir;
  auto pool = runtime::Pool::Create(::cxlrt::testing::PoolUri(dir, "", "16M"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto engine = MakeDeviceEngine((*pool)->coherence(), (*pool)->backend().base(), (*pool)->size());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(engine.status().message()).find(why), std::string::npos) << engine.status();
  EXPECT_EQ(DeviceAlloc(1024).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(PinnedAlloc(1024).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StreamCreate().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(DeviceCopy(nullptr, nullptr, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(DescribeDevices(nullptr, 0).find("no device"), std::string::npos);
  uint64_t flags[64] = {};
  for (Doorbell d : kDoorbells) {
    EXPECT_EQ(TimePingPong(d, nullptr, nullptr, flags, flags + 32, 8, 1, 1).status().code(),
              absl::StatusCode::kUnavailable)
        << DoorbellName(d);
  }
}

TEST(DeviceTest, WithAGpuDeviceMemoryIsToldApart) {
  if (!DevicesAvailable()) GTEST_SKIP() << "no GPU: " << DevicesUnavailableReason();
  auto d = DeviceAlloc(1 << 20);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(KindOf(*d), MemoryKind::kDevice);
  EXPECT_EQ(KindOf(static_cast<uint8_t*>(*d) + 4096), MemoryKind::kDevice);
  auto p = PinnedAlloc(4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(KindOf(*p), MemoryKind::kHost);
  DeviceFree(*d);
  PinnedFree(*p);
}

}  // namespace
}  // namespace cxlrt::collectives
