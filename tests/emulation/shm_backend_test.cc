#include "cxlrt/emulation/shm_backend.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/topology.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::emulation {
namespace {

using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::TempDir;
using runtime::ChooseEmulationNode;
using runtime::NumaNode;

NumaNode Node(int id, int cpus, uint64_t mem, std::vector<int> distance) {
  NumaNode n;
  n.id = id;
  n.cpu_count = cpus;
  n.cpulist = cpus ? "0" : "";
  n.mem_total = mem;
  n.distance = std::move(distance);
  return n;
}

TEST(NodeChoiceTest, OneNodeMachinesUseNodeZeroAndSaySo) {
  auto c = ChooseEmulationNode({Node(0, 2, 1 << 30, {10})}, std::nullopt, 0);
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->node, 0);
  EXPECT_NE(c->reason.find("the only NUMA node"), std::string::npos) << c->reason;
}

TEST(NodeChoiceTest, ACpulessNodeStandsInForTheCxlDevice) {
  auto c =
      ChooseEmulationNode({Node(0, 4, 1 << 30, {10, 20, 30}), Node(1, 4, 1 << 30, {20, 10, 30}),
                           Node(2, 0, 1 << 30, {30, 30, 10})},
                          std::nullopt, 0);
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->node, 2);
  EXPECT_NE(c->reason.find("CPU-less"), std::string::npos);
}

TEST(NodeChoiceTest, WithoutACpulessNodeTheFarthestNodeIsUsed) {
  auto c =
      ChooseEmulationNode({Node(0, 4, 1 << 30, {10, 21, 31}), Node(1, 4, 1 << 30, {21, 10, 21}),
                           Node(2, 4, 1 << 30, {31, 21, 10})},
                          std::nullopt, 0);
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->node, 2);
  EXPECT_NE(c->reason.find("farthest"), std::string::npos);
  // A CPU-less node without memory is no candidate.
  auto d = ChooseEmulationNode({Node(0, 4, 1 << 30, {10, 20}), Node(1, 0, 0, {20, 10})},
                               std::nullopt, 0);
  CXLRT_ASSERT_OK(d);
  EXPECT_EQ(d->node, 0);
}

TEST(NodeChoiceTest, ARequestedNodeMustExistAndHaveMemory) {
  std::vector<NumaNode> nodes = {Node(0, 2, 1 << 30, {10, 20}), Node(1, 0, 0, {20, 10})};
  CXLRT_EXPECT_ERROR(ChooseEmulationNode(nodes, 4, 0), absl::StatusCode::kInvalidArgument,
                     "node=4 does not exist (this machine has nodes 0, 1)");
  CXLRT_EXPECT_ERROR(ChooseEmulationNode(nodes, 1, 0), absl::StatusCode::kInvalidArgument,
                     "node=1 has no memory");
  auto c = ChooseEmulationNode(nodes, 0, 0);
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->node, 0);
  auto none = ChooseEmulationNode({}, std::nullopt, 0);
  CXLRT_ASSERT_OK(none);
  EXPECT_EQ(none->node, -1);
}

TEST(TopologyTest, ReadsNodesFromSysfs) {
  TempDir root;
  auto write = [&](const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(root.path() + rel).parent_path());
    std::ofstream(root.path() + rel) << text;
  };
  write("/devices/system/node/node0/cpulist", "0-3\n");
  write("/devices/system/node/node0/meminfo",
        "Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 1 kB\n");
  write("/devices/system/node/node0/distance", "10 20\n");
  write("/devices/system/node/node1/cpulist", "\n");
  write("/devices/system/node/node1/meminfo", "Node 1 MemTotal:       2048 kB\n");
  write("/devices/system/node/node1/distance", "20 10\n");
  write("/bus/dax/devices/dax0.0/size", "4294967296\n");
  write("/bus/dax/devices/dax0.0/align", "2097152\n");
  write("/bus/dax/devices/dax0.0/target_node", "1\n");
  auto nodes = runtime::ReadNumaNodes(root.path());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].cpu_count, 4);
  EXPECT_EQ(nodes[0].mem_total, 1024u * 1024);
  EXPECT_EQ(nodes[1].cpu_count, 0);
  EXPECT_EQ(nodes[1].distance, (std::vector<int>{20, 10}));
  auto choice = ChooseEmulationNode(nodes, std::nullopt, 0);
  CXLRT_ASSERT_OK(choice);
  EXPECT_EQ(choice->node, 1);
  auto dax = runtime::ReadDaxDevices(root.path());
  ASSERT_EQ(dax.size(), 1u);
  EXPECT_EQ(dax[0].path, "/dev/dax0.0");
  EXPECT_EQ(dax[0].size, 4ull << 30);
  EXPECT_EQ(dax[0].align, 2u << 20);
  EXPECT_EQ(dax[0].target_node, 1);
}

TEST(ShmBackendTest, PoolFilesLiveInTheDirectoryAsked) {
  TempDir dir;
  std::string uri = PoolUri(dir);
  auto pool = runtime::Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  const std::string path = ShmPoolPath(*runtime::ParsePoolUri(uri));
  EXPECT_EQ(path.rfind(dir.path() + "/cxlrt-t", 0), 0u) << path;
  EXPECT_EQ((*pool)->backend().info().path, path);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 8u << 20);
  // Reserved in full: no hole for a later SIGBUS.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8u << 20);
}

TEST(ShmBackendTest, TheDefaultNodeIsChosenAndReported) {
  TempDir dir;
  auto pool = runtime::Pool::Create(PoolUri(dir));
  CXLRT_ASSERT_OK(pool);
  const auto& info = (*pool)->backend().info();
  EXPECT_FALSE(info.placement.empty());
  auto nodes = runtime::ReadNumaNodes();
  if (!nodes.empty()) {
    EXPECT_GE(info.numa_node, 0) << info.placement;
  }
}

TEST(ShmBackendTest, ANodeThatDoesNotExistIsRefusedAndNothingIsLeft) {
  TempDir dir;
  std::string uri = PoolUri(dir, "node=1000");
  CXLRT_EXPECT_ERROR(runtime::Pool::Create(uri), absl::StatusCode::kInvalidArgument,
                     "node=1000 does not exist");
  EXPECT_NE(access(ShmPoolPath(*runtime::ParsePoolUri(uri)).c_str(), F_OK), 0);
}

// Resident bytes of this process (mapped pool pages count).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(ShmBackendTest, PrefaultZeroMapsPagesOnFirstTouchOnly) {
  TempDir dir;
  const std::string uri = PoolUri(dir, "prefault=0", "64M");
  uint64_t before = ResidentBytes();
  auto pool = runtime::Pool::Create(uri);
  CXLRT_ASSERT_OK(pool);
  // The pool's metadata is written, not its 64 MiB mapped.
  EXPECT_LT(ResidentBytes() - before, 16u << 20);
  // Still reserved in full at creation: no hole for a later SIGBUS.
  struct stat st;
  ASSERT_EQ(stat(ShmPoolPath(*runtime::ParsePoolUri(uri)).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 64u << 20);
  // The default (prefault=1) maps every page when opening.
  before = ResidentBytes();
  auto opened = runtime::Pool::Open(testing::OpenUri(uri));
  CXLRT_ASSERT_OK(opened);
  EXPECT_GE(ResidentBytes() - before, 60u << 20);
}

TEST(ShmBackendTest, AMissingDirectoryIsNotFound) {
  CXLRT_EXPECT_ERROR(runtime::Pool::Create("emu://x?size=8M&dir=/nonexistent/cxlrt"),
                     absl::StatusCode::kNotFound, "/nonexistent/cxlrt/cxlrt-x.pool");
}

}  // namespace
}  // namespace cxlrt::emulation
