// What this machine has for a pool: NUMA nodes (sysfs), their memory
// attributes (hwloc), CXL and device-DAX devices (sysfs), huge pages, and
// the choice of the node an emulated pool binds to.
// Thread-safety: pure functions over the filesystem; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cxlrt::runtime {

struct NumaNode {
  int id = 0;
  std::string cpulist;  // as sysfs prints it, "" for a CPU-less node
  int cpu_count = 0;
  uint64_t mem_total = 0;     // bytes
  std::vector<int> distance;  // to node 0, 1, ... in the order of `nodes`
  // hwloc memory attributes from HMAT, when the firmware provides them.
  std::optional<uint64_t> read_bandwidth_mbps;
  std::optional<uint64_t> read_latency_ns;
};

struct DaxDevice {
  std::string name;  // dax0.0
  std::string path;  // /dev/dax0.0
  uint64_t size = 0;
  uint64_t align = 0;
  int target_node = -1;
};

struct HugePages {
  std::string thp_enabled;  // "always [madvise] never" as sysfs prints it
  std::string thp_shmem;    // shmem_enabled
  uint64_t free_2m = 0, total_2m = 0, free_1g = 0, total_1g = 0;
};

// NUMA nodes under `sysfs_root`/devices/system/node. Empty when the kernel
// has no NUMA support (then everything is one node 0).
std::vector<NumaNode> ReadNumaNodes(const std::string& sysfs_root = "/sys");

// Adds hwloc's memory attributes to `nodes` where hwloc knows them.
void AddHwlocMemoryAttributes(std::vector<NumaNode>* nodes);

// CXL devices listed under /sys/bus/cxl/devices (memdevs, regions...).
std::vector<std::string> ReadCxlDevices(const std::string& sysfs_root = "/sys");
std::vector<DaxDevice> ReadDaxDevices(const std::string& sysfs_root = "/sys");
HugePages ReadHugePages(const std::string& sysfs_root = "/sys");

struct NodeChoice {
  int node = -1;  // -1: do not bind
  std::string reason;
};

// The node an emulated pool binds to. `requested`: the URI's node=, which
// must exist and have memory (kInvalidArgument otherwise). Default: a
// CPU-less node with memory (it stands in for a CXL expander), else the node
// farthest from `current_node`, else node 0. Pure, for tests.
absl::StatusOr<NodeChoice> ChooseEmulationNode(const std::vector<NumaNode>& nodes,
                                               std::optional<int> requested, int current_node);

// The nodes of the `count` devices of an emulated pool: all on `requested`
// when given; else round-robin over the CPU-less nodes with memory when
// there are several (one device per expander, as on a real pool); else all
// on ChooseEmulationNode's choice. Pure, for tests.
absl::StatusOr<std::vector<NodeChoice>> ChooseDeviceNodes(const std::vector<NumaNode>& nodes,
                                                          std::optional<int> requested,
                                                          int current_node, uint32_t count);

// The NUMA node of the CPU this thread runs on (0 when unknown).
int CurrentNode();

}  // namespace cxlrt::runtime
