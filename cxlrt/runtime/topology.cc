#include "cxlrt/runtime/topology.h"

#include <dirent.h>
#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::runtime {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

uint64_t ReadU64(const std::string& path, int base = 10) {
  auto s = ReadFile(path);
  if (!s) return 0;
  try {
    return std::stoull(*s, nullptr, base);
  } catch (...) {
    return 0;
  }
}

std::vector<std::string> ListDir(const std::string& path, absl::string_view prefix) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(std::string(prefix), 0) == 0 && name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

int CountCpus(const std::string& cpulist) {
  int count = 0;
  for (absl::string_view part : absl::StrSplit(cpulist, ',', absl::SkipEmpty())) {
    std::vector<std::string> range = absl::StrSplit(part, '-');
    int a = 0, b = 0;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &a)) {
      ++count;
    } else if (range.size() == 2 && absl::SimpleAtoi(range[0], &a) &&
               absl::SimpleAtoi(range[1], &b) && b >= a) {
      count += b - a + 1;
    }
  }
  return count;
}

}  // namespace

std::vector<NumaNode> ReadNumaNodes(const std::string& sysfs_root) {
  std::vector<NumaNode> nodes;
  const std::string dir = sysfs_root + "/devices/system/node";
  for (const std::string& name : ListDir(dir, "node")) {
    int id = 0;
    if (!absl::SimpleAtoi(name.substr(4), &id)) continue;
    NumaNode n;
    n.id = id;
    n.cpulist = ReadFile(dir + "/" + name + "/cpulist").value_or("");
    n.cpu_count = CountCpus(n.cpulist);
    if (auto meminfo = ReadFile(dir + "/" + name + "/meminfo")) {
      for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
        size_t at = line.find("MemTotal:");
        if (at == absl::string_view::npos) continue;
        std::vector<std::string> words =
            absl::StrSplit(line.substr(at + 9), ' ', absl::SkipWhitespace());
        uint64_t kb = 0;
        if (!words.empty() && absl::SimpleAtoi(words[0], &kb)) n.mem_total = kb * 1024;
      }
    }
    if (auto dist = ReadFile(dir + "/" + name + "/distance")) {
      for (absl::string_view w : absl::StrSplit(*dist, ' ', absl::SkipWhitespace())) {
        int v = 0;
        if (absl::SimpleAtoi(w, &v)) n.distance.push_back(v);
      }
    }
    nodes.push_back(std::move(n));
  }
  std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.id < b.id; });
  return nodes;
}

void AddHwlocMemoryAttributes(std::vector<NumaNode>* nodes) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return;
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return;
  }
  hwloc_obj_t node = nullptr;
  while ((node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node)) != nullptr) {
    auto it = std::find_if(nodes->begin(), nodes->end(), [&](const NumaNode& n) {
      return n.id == static_cast<int>(node->os_index);
    });
    if (it == nodes->end()) continue;
    hwloc_location initiator;
    initiator.type = HWLOC_LOCATION_TYPE_CPUSET;
    initiator.location.cpuset = node->cpuset;
    hwloc_uint64_t value = 0;
    const bool has_cpus = node->cpuset && !hwloc_bitmap_iszero(node->cpuset);
    hwloc_location* where = has_cpus ? &initiator : nullptr;
    unsigned long flags = 0;
    if (hwloc_memattr_get_value(topo, HWLOC_MEMATTR_ID_READ_BANDWIDTH, node, where, flags,
                                &value) == 0 &&
        value) {
      it->read_bandwidth_mbps = value;
    }
    if (hwloc_memattr_get_value(topo, HWLOC_MEMATTR_ID_READ_LATENCY, node, where, flags, &value) ==
            0 &&
        value) {
      it->read_latency_ns = value;
    }
  }
  hwloc_topology_destroy(topo);
}

std::vector<std::string> ReadCxlDevices(const std::string& sysfs_root) {
  return ListDir(sysfs_root + "/bus/cxl/devices", "");
}

std::vector<DaxDevice> ReadDaxDevices(const std::string& sysfs_root) {
  std::vector<DaxDevice> out;
  const std::string dir = sysfs_root + "/bus/dax/devices";
  for (const std::string& name : ListDir(dir, "dax")) {
    DaxDevice d;
    d.name = name;
    d.path = "/dev/" + name;
    d.size = ReadU64(dir + "/" + name + "/size");
    d.align = ReadU64(dir + "/" + name + "/align");
    auto node = ReadFile(dir + "/" + name + "/target_node");
    int n = -1;
    if (node && absl::SimpleAtoi(*node, &n)) d.target_node = n;
    out.push_back(d);
  }
  return out;
}

HugePages ReadHugePages(const std::string& sysfs_root) {
  HugePages h;
  h.thp_enabled = ReadFile(sysfs_root + "/kernel/mm/transparent_hugepage/enabled").value_or("");
  h.thp_shmem = ReadFile(sysfs_root + "/kernel/mm/transparent_hugepage/shmem_enabled").value_or("");
  const std::string hp = sysfs_root + "/kernel/mm/hugepages";
  h.total_2m = ReadU64(hp + "/hugepages-2048kB/nr_hugepages");
  h.free_2m = ReadU64(hp + "/hugepages-2048kB/free_hugepages");
  h.total_1g = ReadU64(hp + "/hugepages-1048576kB/nr_hugepages");
  h.free_1g = ReadU64(hp + "/hugepages-1048576kB/free_hugepages");
  return h;
}

absl::StatusOr<NodeChoice> ChooseEmulationNode(const std::vector<NumaNode>& nodes,
                                               std::optional<int> requested, int current_node) {
  if (nodes.empty()) {
    if (requested && *requested != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node=", *requested, " was asked for, but this machine has no NUMA nodes"));
    }
    return NodeChoice{-1, "this kernel reports no NUMA nodes; pages are not bound"};
  }
  std::vector<std::string> ids;
  for (const NumaNode& n : nodes) ids.push_back(absl::StrCat(n.id));
  if (requested) {
    auto it = std::find_if(nodes.begin(), nodes.end(), [&](auto& n) { return n.id == *requested; });
    if (it == nodes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node=", *requested, " does not exist (this machine has node",
                       nodes.size() > 1 ? "s " : " ", absl::StrJoin(ids, ", "), ")"));
    }
    if (it->mem_total == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node=", *requested, " has no memory to hold a pool"));
    }
    return NodeChoice{*requested, absl::StrCat("node ", *requested, " as the URI asks")};
  }
  for (const NumaNode& n : nodes) {
    if (n.cpu_count == 0 && n.mem_total > 0) {
      return NodeChoice{n.id, absl::StrCat("node ", n.id,
                                           ": CPU-less memory node, the closest stand-in for a "
                                           "CXL memory expander")};
    }
  }
  if (nodes.size() > 1) {
    auto cur =
        std::find_if(nodes.begin(), nodes.end(), [&](auto& n) { return n.id == current_node; });
    if (cur != nodes.end() && cur->distance.size() == nodes.size()) {
      size_t best = 0;
      for (size_t k = 0; k < nodes.size(); ++k) {
        if (nodes[k].mem_total > 0 && cur->distance[k] > cur->distance[best]) best = k;
      }
      if (nodes[best].id != current_node) {
        return NodeChoice{
            nodes[best].id,
            absl::StrCat("node ", nodes[best].id, ": farthest from this CPU's node ", current_node,
                         " (distance ", cur->distance[best], "), like memory behind a CXL link")};
      }
    }
  }
  return NodeChoice{nodes[0].id, nodes.size() == 1
                                     ? absl::StrCat("node ", nodes[0].id,
                                                    ": the only NUMA node (no CXL or CPU-less "
                                                    "node here)")
                                     : absl::StrCat("node ", nodes[0].id,
                                                    ": no CPU-less or "
                                                    "farther node found")};
}

absl::StatusOr<std::vector<NodeChoice>> ChooseDeviceNodes(const std::vector<NumaNode>& nodes,
                                                          std::optional<int> requested,
                                                          int current_node, uint32_t count) {
  std::vector<const NumaNode*> cpuless;
  for (const NumaNode& n : nodes) {
    if (n.cpu_count == 0 && n.mem_total > 0) cpuless.push_back(&n);
  }
  std::vector<NodeChoice> out;
  if (!requested && count > 1 && cpuless.size() > 1) {
    for (uint32_t d = 0; d < count; ++d) {
      const NumaNode& n = *cpuless[d % cpuless.size()];
      out.push_back(
          {n.id, absl::StrCat("node ", n.id, ": CPU-less memory node ", d % cpuless.size() + 1,
                              " of ", cpuless.size(), ", one per device round-robin")});
    }
    return out;
  }
  CXLRT_ASSIGN_OR_RETURN(NodeChoice one, ChooseEmulationNode(nodes, requested, current_node));
  out.assign(count, one);
  return out;
}

int CurrentNode() {
  unsigned cpu = 0, node = 0;
  if (getcpu(&cpu, &node) != 0) return 0;
  return static_cast<int>(node);
}

}  // namespace cxlrt::runtime
