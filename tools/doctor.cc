// `cxlrt doctor`: what this machine offers a pool, what cxlrt will use, and
// every knob (CXLRT_* variable) with its value and where it came from.
#include <dlfcn.h>
#include <numa.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/runtime/cpu_features.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/topology.h"
#include "cxlrt/runtime/units.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace cxlrt::tools {
namespace {

using nlohmann::json;

struct CudaInfo {
  std::string toolkit;  // path of nvcc, "" when none
  bool driver = false;
  int devices = 0;
  std::string note;
};

CudaInfo ProbeCuda() {
  CudaInfo c;
#ifdef CXLRT_CUDA_TOOLKIT
  c.toolkit = std::string(CXLRT_CUDA_TOOLKIT) + "/nvcc";
#endif
  if (c.toolkit.empty() && access("/usr/local/cuda/bin/nvcc", X_OK) == 0) {
    c.toolkit = "/usr/local/cuda/bin/nvcc";
  }
  // The driver API, loaded at run time: no link dependency on CUDA.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    c.note = "no CUDA driver (libcuda.so.1 not found)";
    return c;
  }
  c.driver = true;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  int rc = init ? init(0) : -1;
  if (rc == 0 && count && count(&c.devices) == 0) {
    c.note = absl::StrCat(c.devices, " CUDA device(s)");
  } else {
    c.note = absl::StrCat("CUDA driver present but cuInit failed (error ", rc, "): no usable GPU");
  }
  dlclose(lib);
  return c;
}

// The GPU data path (cxlrt/gpu/gpu.h): devices, their PCI and NUMA
// place, and whether a pool registers with CUDA (a scratch emulated pool of
// 64 MiB, made and destroyed here).
std::string ProbeGpuPath() {
  if (!gpu::GpuAvailable()) {
    return "unavailable: " + gpu::GpuUnavailableReason();
  }
  const std::string uri = absl::StrCat("emu://doctor-", getpid(), "?size=64M");
  auto pool = runtime::Pool::Create(uri);
  if (!pool.ok()) return gpu::DescribeGpus(nullptr, 0);
  std::string out = gpu::DescribeGpus((*pool)->backend().base(), (*pool)->size());
  pool->reset();
  (void)runtime::Pool::Destroy(uri, {.force = true});
  return out;
}

}  // namespace

// The kernel's clock source, and whether it counts a pause of the VM it
// runs in (docs/membership.md, "A clock that stops with the host").
std::string ClockSourceLine(std::string* name) {
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  if (!(f >> *name)) *name = "unknown";
  if (*name == "kvm-clock" || *name == "xen" || *name == "hyperv_clocksource_tsc_page") {
    return absl::StrCat(*name,
                        ": stops while the VM is paused; a paused host learns of its "
                        "fencing from the pool, on its next call");
  }
  return *name;
}

int Doctor(bool as_json) {
  const auto& cpu = runtime::GetCpuFeatures();
  std::vector<runtime::NumaNode> nodes = runtime::ReadNumaNodes();
  runtime::AddHwlocMemoryAttributes(&nodes);
  const bool numa = numa_available() >= 0;
  auto cxl = runtime::ReadCxlDevices();
  auto dax = runtime::ReadDaxDevices();
  auto huge = runtime::ReadHugePages();
  CudaInfo cuda = ProbeCuda();
  const std::string gpu = ProbeGpuPath();
  std::string clocksource;
  const std::string clock_line = ClockSourceLine(&clocksource);
  auto choice = runtime::ChooseEmulationNode(nodes, std::nullopt, runtime::CurrentNode());
  std::vector<int> cpuless;
  for (const auto& n : nodes) {
    if (n.cpu_count == 0 && n.mem_total > 0) cpuless.push_back(n.id);
  }
  const bool have_cxl = !cxl.empty() || !dax.empty();
  std::string verdict = have_cxl
                            ? absl::StrCat("CXL hardware found: use dax://",
                                           dax.empty() ? "/dev/daxX.Y" : dax[0].path,
                                           " for a real pool (emulated pools still work)")
                            : absl::StrCat(
                                  "no CXL device on this machine: cxlrt uses the emulated pool "
                                  "(emu://), bound to ",
                                  choice.ok() ? choice->reason : std::string("no node"));

  std::vector<std::string> flags;
  for (auto [name, has] : {std::pair{"clflush", cpu.clflush},
                           {"clflushopt", cpu.clflushopt},
                           {"clwb", cpu.clwb},
                           {"movdir64b", cpu.movdir64b},
                           {"sse3", cpu.sse3},
                           {"ssse3", cpu.ssse3},
                           {"sse4.1", cpu.sse41},
                           {"sse4.2", cpu.sse42},
                           {"popcnt", cpu.popcnt},
                           {"cx16", cpu.cx16},
                           {"lahf", cpu.lahf},
                           {"avx", cpu.avx},
                           {"avx2", cpu.avx2},
                           {"fma", cpu.fma},
                           {"f16c", cpu.f16c},
                           {"bmi1", cpu.bmi1},
                           {"bmi2", cpu.bmi2},
                           {"lzcnt", cpu.lzcnt},
                           {"movbe", cpu.movbe},
                           {"osxsave", cpu.osxsave},
                           {"avx512f", cpu.avx512f},
                           {"avx512bw", cpu.avx512bw},
                           {"avx512cd", cpu.avx512cd},
                           {"avx512dq", cpu.avx512dq},
                           {"avx512vl", cpu.avx512vl}}) {
    if (has) flags.push_back(name);
  }
  // The kernels' vector level: what cpuid and xgetbv allow, what
  // CXLRT_CPU_LEVEL asked for, and what runs.
  const runtime::CpuLevel level = runtime::ActiveCpuLevel();
  const std::optional<runtime::CpuLevel> requested = runtime::RequestedCpuLevel();
  const std::string above =
      cpu.max_level == runtime::CpuLevel::kAvx512
          ? ""
          : runtime::MissingForCpuLevel(
                cpu, static_cast<runtime::CpuLevel>(static_cast<int>(cpu.max_level) + 1));
  const std::string level_line = absl::StrCat(
      runtime::CpuLevelName(level), " (this CPU and OS allow ",
      runtime::CpuLevelName(cpu.max_level),
      above.empty() ? "" : absl::StrCat(", not higher: no ", above), "; CXLRT_CPU_LEVEL ",
      requested ? runtime::CpuLevelName(*requested) : "auto", ")");

  if (as_json) {
    json j;
    j["cpu"] = {{"writeback", runtime::FlushInstructionName(cpu.writeback)},
                {"invalidate", runtime::FlushInstructionName(cpu.invalidate)},
                {"features", flags},
                {"xcr0", cpu.xcr0},
                {"level", runtime::CpuLevelName(level)},
                {"max_level", runtime::CpuLevelName(cpu.max_level)},
                {"requested_level", requested ? runtime::CpuLevelName(*requested) : "auto"},
                {"missing_for_next_level", above}};
    j["numa_available"] = numa;
    j["numa_nodes"] = json::array();
    for (const auto& n : nodes) {
      json jn = {{"id", n.id},
                 {"cpus", n.cpulist},
                 {"cpu_count", n.cpu_count},
                 {"mem_total", n.mem_total},
                 {"distance", n.distance}};
      jn["read_bandwidth_mbps"] = n.read_bandwidth_mbps ? json(*n.read_bandwidth_mbps) : json();
      jn["read_latency_ns"] = n.read_latency_ns ? json(*n.read_latency_ns) : json();
      j["numa_nodes"].push_back(jn);
    }
    j["cpuless_nodes"] = cpuless;
    j["cxl_devices"] = cxl;
    j["dax_devices"] = json::array();
    for (const auto& d : dax) {
      j["dax_devices"].push_back({{"name", d.name},
                                  {"path", d.path},
                                  {"size", d.size},
                                  {"align", d.align},
                                  {"target_node", d.target_node}});
    }
    j["huge_pages"] = {{"thp_enabled", huge.thp_enabled}, {"thp_shmem", huge.thp_shmem},
                       {"2m_total", huge.total_2m},       {"2m_free", huge.free_2m},
                       {"1g_total", huge.total_1g},       {"1g_free", huge.free_1g}};
    j["cuda"] = {{"toolkit", cuda.toolkit},
                 {"driver", cuda.driver},
                 {"devices", cuda.devices},
                 {"note", cuda.note},
                 {"gpu_data_path", gpu}};
    j["emulation_node"] = choice.ok() ? json(choice->node) : json();
    j["clocksource"] = clocksource;
    j["cxl_present"] = have_cxl;
    j["verdict"] = verdict;
    json config = json::object();
    json knobs = json::array();
    for (const runtime::KnobBase* k : runtime::Knobs()) {
      config[k->name()] = k->ValueText();
      knobs.push_back({{"name", k->name()},
                       {"value", k->ValueText()},
                       {"default", k->info().default_text},
                       {"source", runtime::KnobSourceName(k->source())},
                       {"error", k->status().ok() ? "" : std::string(k->status().message())},
                       {"help", k->info().help}});
    }
    j["config"] = config;  // name: value in effect
    j["knobs"] = knobs;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("cpu          write back with %s, invalidate with %s; has %s\n",
              runtime::FlushInstructionName(cpu.writeback),
              runtime::FlushInstructionName(cpu.invalidate), absl::StrJoin(flags, " ").c_str());
  std::printf("cpu level    %s\n", level_line.c_str());
  std::printf("numa         %zu node%s%s\n", nodes.size(), nodes.size() == 1 ? "" : "s",
              numa ? "" : " (libnuma: NUMA not available, pages will not be bound)");
  for (const auto& n : nodes) {
    std::string attrs = n.read_bandwidth_mbps || n.read_latency_ns
                            ? absl::StrCat("read ", n.read_bandwidth_mbps.value_or(0), " MB/s, ",
                                           n.read_latency_ns.value_or(0), " ns")
                            : "bandwidth/latency unknown (no HMAT)";
    std::printf("  node %-3d   cpus %-10s memory %-10s distances %-12s %s\n", n.id,
                n.cpulist.empty() ? "none" : n.cpulist.c_str(),
                runtime::FormatBytes(n.mem_total).c_str(), absl::StrJoin(n.distance, " ").c_str(),
                attrs.c_str());
  }
  std::printf("cpu-less     %s\n", cpuless.empty() ? "none" : absl::StrJoin(cpuless, ", ").c_str());
  std::printf("cxl          %s\n", cxl.empty() ? "no CXL devices (/sys/bus/cxl has none)"
                                               : absl::StrJoin(cxl, " ").c_str());
  if (dax.empty()) {
    std::printf("dax          no device-DAX devices\n");
  } else {
    for (const auto& d : dax) {
      std::printf("dax          %s: %s, align %s, node %d\n", d.path.c_str(),
                  runtime::FormatBytes(d.size).c_str(), runtime::FormatBytes(d.align).c_str(),
                  d.target_node);
    }
  }
  std::printf(
      "huge pages   THP anon '%s', shmem '%s'; 2 MiB pages %llu/%llu free; 1 GiB %llu/%llu\n",
      huge.thp_enabled.c_str(), huge.thp_shmem.c_str(),
      static_cast<unsigned long long>(huge.free_2m), static_cast<unsigned long long>(huge.total_2m),
      static_cast<unsigned long long>(huge.free_1g),
      static_cast<unsigned long long>(huge.total_1g));
  std::printf("cuda         toolkit %s; %s\n",
              cuda.toolkit.empty() ? "not found" : cuda.toolkit.c_str(), cuda.note.c_str());
  std::printf("gpu path     %s%s", gpu.c_str(), gpu.empty() || gpu.back() != '\n' ? "\n" : "");
  std::printf("clock        %s\n", clock_line.c_str());
  std::printf("pool         %s\n", verdict.c_str());
  // Every knob: the value in effect and whether the environment set it.
  const char* label = "knobs";
  for (const runtime::KnobBase* k : runtime::Knobs()) {
    const std::string value = k->ValueText();
    std::printf("%-12s %s=%s (%s%s)\n", label, k->name(), value.empty() ? "\"\"" : value.c_str(),
                runtime::KnobSourceName(k->source()),
                k->status().ok() ? "" : ", refused: the default holds");
    label = "";
  }
  return 0;
}

}  // namespace cxlrt::tools
