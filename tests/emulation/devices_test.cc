// Multi-device pools (devices=D) and the placement helpers upper layers use
// to stripe data across devices.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "cxlrt/emulation/shm_backend.h"
#include "cxlrt/runtime/placement.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/topology.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::emulation {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::DeviceMap;
using runtime::Pool;

TEST(DeviceMapTest, AnswersWhichDeviceHoldsAnOffset) {
  DeviceMap m(64 << 20, 4);
  EXPECT_EQ(m.device_size(), 16u << 20);
  EXPECT_EQ(m.DeviceOf(0), 0u);
  EXPECT_EQ(m.DeviceOf((16 << 20) - 1), 0u);
  EXPECT_EQ(m.DeviceOf(16 << 20), 1u);
  EXPECT_EQ(m.DeviceOf((64 << 20) - 1), 3u);
  EXPECT_EQ(m.Span(2), std::make_pair(uint64_t{32} << 20, uint64_t{48} << 20));
}

TEST(DeviceMapTest, SplitsRangesAtDeviceBoundaries) {
  DeviceMap m(64 << 20, 4);
  auto pieces = m.Split((16 << 20) - 100, (16 << 20) + 200);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].device, 0u);
  EXPECT_EQ(pieces[0].length, 100u);
  EXPECT_EQ(pieces[1].device, 1u);
  EXPECT_EQ(pieces[1].offset, 16u << 20);
  EXPECT_EQ(pieces[1].length, 16u << 20);
  EXPECT_EQ(pieces[2].device, 2u);
  EXPECT_EQ(pieces[2].length, 100u);
  EXPECT_TRUE(m.Split(5, 0).empty());
  EXPECT_EQ(DeviceMap(8 << 20, 1).Split(0, 8 << 20).size(), 1u);
}

TEST(DeviceMapTest, ClipsARangeToOneDevice) {
  DeviceMap m(64 << 20, 4);
  auto [a, b] = m.Clip(1, 2 << 20, 20 << 20);
  EXPECT_EQ(a, 16u << 20);
  EXPECT_EQ(b, 20u << 20);
  auto [c, d] = m.Clip(3, 2 << 20, 20 << 20);
  EXPECT_EQ(c, d) << "device 3 holds none of it";
}

TEST(DeviceMapTest, StripesChunksRoundRobinFromAnyDevice) {
  DeviceMap m(64 << 20, 4);
  std::vector<uint32_t> got;
  for (uint64_t i = 0; i < 6; ++i) got.push_back(m.StripeDevice(i, 2));
  EXPECT_EQ(got, (std::vector<uint32_t>{2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(DeviceMap(8 << 20, 1).StripeDevice(7), 0u);
}

TEST(DevicesTest, APoolOfFourDevicesHasFourBackings) {
  TempDir dir;
  std::string uri = PoolUri(dir, "devices=4", "32M");
  auto pool = Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  EXPECT_EQ((*pool)->devices().count(), 4u);
  EXPECT_EQ((*pool)->header().device_count, 4u);
  EXPECT_EQ((*pool)->header().device_size, 8u << 20);
  // A copy: the loop after pool->reset() below reads the paths.
  const auto devs = (*pool)->backend().info().devices;
  ASSERT_EQ(devs.size(), 4u);
  auto parsed = runtime::ParsePoolUri(uri);
  for (uint32_t d = 0; d < 4; ++d) {
    EXPECT_EQ(devs[d].path, ShmDevicePath(*parsed, d));
    EXPECT_EQ(devs[d].offset, d * (8ull << 20));
    struct stat st;
    ASSERT_EQ(stat(devs[d].path.c_str(), &st), 0) << devs[d].path;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 8u << 20);
  }
  // The heap starts on device 0 and every device holds part of it.
  EXPECT_EQ((*pool)->HeapOnDevice(0).first, (*pool)->header().heap_offset);
  EXPECT_EQ((*pool)->HeapOnDevice(3).second, 32u << 20);

  // Bytes written across a device boundary read back through another open.
  const uint64_t boundary = 16 << 20;
  std::vector<char> data(8192);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  (*pool)->coherence().CopyToPool(boundary - 4096, data.data(), data.size());
  auto again = Pool::Open(OpenUri(uri));
  CXLRT_ASSERT_OK(again);
  EXPECT_EQ((*again)->devices().count(), 4u);
  std::vector<char> out(data.size());
  (*again)->coherence().CopyFromPool(out.data(), boundary - 4096, out.size());
  EXPECT_EQ(out, data);

  pool->reset();
  again->reset();
  CXLRT_ASSERT_OK(Pool::Destroy(OpenUri(uri)));
  for (const auto& d : devs) EXPECT_NE(access(d.path.c_str(), F_OK), 0) << d.path << " left";
}

TEST(DevicesTest, AMissingDeviceBackingIsDataLoss) {
  TempDir dir;
  std::string uri = PoolUri(dir, "devices=3", "12M");
  auto pool = Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  const std::string last = (*pool)->backend().info().devices[2].path;
  pool->reset();
  ASSERT_EQ(unlink(last.c_str()), 0);
  CXLRT_EXPECT_ERROR(Pool::Open(OpenUri(uri)), absl::StatusCode::kDataLoss,
                     "12 MiB in 3 devices but its backing holds 8 MiB");
}

TEST(DevicesTest, ADeviceBackingOfTheWrongSizeIsDataLoss) {
  TempDir dir;
  std::string uri = PoolUri(dir, "devices=2", "8M");
  auto pool = Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  const std::string second = (*pool)->backend().info().devices[1].path;
  pool->reset();
  ASSERT_EQ(truncate(second.c_str(), 2 << 20), 0);
  CXLRT_EXPECT_ERROR(Pool::Open(OpenUri(uri)), absl::StatusCode::kDataLoss, second);
}

TEST(DevicesTest, ASizeThatDoesNotSplitIntoDevicesIsRefused) {
  TempDir dir;
  std::string uri = PoolUri(dir, "devices=3", "8M");
  CXLRT_EXPECT_ERROR(Pool::Create(uri), absl::StatusCode::kInvalidArgument,
                     "does not split into 3 devices");
  EXPECT_NE(access(ShmPoolPath(*runtime::ParsePoolUri(uri)).c_str(), F_OK), 0);
}

TEST(DevicesTest, CreatingOverAnyExistingDeviceFileIsAlreadyExists) {
  TempDir dir;
  std::string uri = PoolUri(dir, "devices=2", "8M");
  auto parsed = runtime::ParsePoolUri(uri);
  const std::string second = ShmDevicePath(*parsed, 1);
  FILE* f = fopen(second.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  CXLRT_EXPECT_ERROR(Pool::Create(uri), absl::StatusCode::kAlreadyExists, second);
  EXPECT_NE(access(ShmPoolPath(*parsed).c_str(), F_OK), 0) << "a failed create left device 0";
}

runtime::NumaNode Node(int id, int cpus, uint64_t mem) {
  runtime::NumaNode n;
  n.id = id;
  n.cpu_count = cpus;
  n.mem_total = mem;
  return n;
}

TEST(DeviceNodesTest, DevicesGoRoundRobinOverCpulessNodes) {
  auto c = runtime::ChooseDeviceNodes(
      {Node(0, 4, 1 << 30), Node(1, 0, 1 << 30), Node(2, 0, 1 << 30)}, std::nullopt, 0, 3);
  CXLRT_ASSERT_OK(c);
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].node, 1);
  EXPECT_EQ((*c)[1].node, 2);
  EXPECT_EQ((*c)[2].node, 1);
}

TEST(DeviceNodesTest, ARequestedNodeOrAOneNodeMachineHoldsEveryDevice) {
  auto asked = runtime::ChooseDeviceNodes(
      {Node(0, 4, 1 << 30), Node(1, 0, 1 << 30), Node(2, 0, 1 << 30)}, 2, 0, 2);
  CXLRT_ASSERT_OK(asked);
  EXPECT_EQ((*asked)[0].node, 2);
  EXPECT_EQ((*asked)[1].node, 2);
  auto one = runtime::ChooseDeviceNodes({Node(0, 2, 1 << 30)}, std::nullopt, 0, 4);
  CXLRT_ASSERT_OK(one);
  for (const auto& n : *one) EXPECT_EQ(n.node, 0);
}

}  // namespace
}  // namespace cxlrt::emulation
