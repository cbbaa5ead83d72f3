#include "cxlrt/runtime/config.h"

#include <cctype>
#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/fault.h"

namespace cxlrt::runtime {
namespace {

constexpr ConfigVar kTable[] = {
    {"CXLRT_POOL", "emu://cxlrt?size=1G", "Pool URI used by `cxlrt` commands when none is given."},
    {"CXLRT_HOST_ID", "-1",
     "Id of this (emulated) host; its processes attach in host slots [id*k, id*k+k) with k = "
     "CXLRT_SLOTS_PER_HOST. -1: any free slot. Give each machine its own id when several "
     "machines share a dax pool; `cxlrt run` sets it."},
    {"CXLRT_SLOTS_PER_HOST", "8", "Host slots reserved for each CXLRT_HOST_ID."},
    {"CXLRT_LEASE_MS", "2000",
     "Lease of this host: others declare it dead when its heartbeat stops for this long."},
    {"CXLRT_HEARTBEAT_MS", "100", "Period of this host's heartbeat (must be < lease / 2)."},
    {"CXLRT_LOCK_TIMEOUT_MS", "10000", "Deadline for taking the pool's metadata (bakery) lock."},
    {"CXLRT_WAIT_SPINS", "2000", "Spin iterations of a wait before it yields and then sleeps."},
    {"CXLRT_SHM_DIR", "/dev/shm", "Directory of emulated pool files when the URI has no dir=."},
    {"CXLRT_LOG_LEVEL", "warning", "error, warning, info or debug."},
    {"CXLRT_FAULT", "", "Fault points to fire: point:action[:count],... (docs/faults.md)."},
    {"CXLRT_COMM_TIMEOUT_MS", "60000", "Deadline of every wait of a collective call."},
    {"CXLRT_COMM_SLOT_BYTES", "1048576",
     "Bytes of each of a rank's data slots in a communicator (the largest chunk it posts); "
     "unset on a machine with a GPU: 4194304 (docs/gpu.md)."},
    {"CXLRT_COMM_P2P_BYTES", "0",
     "Bytes of each Send/Recv channel (one per ordered rank pair, a ring of 4 chunks); 0: the "
     "largest power of two in [64 KiB, 1 MiB] whose n x n channels take at most 1/16 of the pool."},
    {"CXLRT_ALLREDUCE_ONESHOT_MAX", "65536",
     "All-reduces up to this many bytes run one-shot; larger ones two-shot."},
    {"CXLRT_COMM_DEPTH", "4",
     "Data slots per rank in a communicator (2-8): a rank posts up to this many chunks minus one "
     "ahead of its slowest peer."},
    {"CXLRT_COMM_CHUNK_BYTES", "0",
     "Bytes of a collective's chunks (capped by the slot); 0: the measured table of "
     "docs/collectives.md."},
    {"CXLRT_PIN", "auto",
     "Core pinning of the ranks `cxlrt run` and `cxlrt bench` start: auto (round-robin over the "
     "allowed cores when ranks do not outnumber them), off, or a comma-separated core list."},
    {"CXLRT_CPU_LEVEL", "auto",
     "Vector level of the CPU kernels (copies, checksums, reductions): auto (the highest this CPU "
     "and OS support), baseline, avx2 or avx512. Can only lower the level: a request above the "
     "CPU's is clamped with a warning (`cxlrt doctor` prints both)."},
    {"CXLRT_CUDA_REDUCE", "staged",
     "How GPU reductions read peers' chunks: staged (the copy engine moves them into device "
     "memory first) or mapped (the kernel reads the registered pool); docs/gpu.md."},
    {"CXLRT_CUDA_KV_COPY", "engine",
     "How KV batches in GPU memory are copied: engine (cudaMemcpyBatchAsync on the copy engine) or "
     "kernel (SMs through the mapped pool); docs/gpu.md."},
    {"CXLRT_CUDA_DOORBELL", "host",
     "Who writes a GPU rank's post lines and flags: host (the CPU, once the copies behind them "
     "completed) or copy (the copy engine, queued behind the copies); docs/gpu.md."},
};

absl::Status ParseUint(const char* name, const char* value, uint32_t lo, uint32_t hi,
                       uint32_t* out) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not an integer in [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

// A variable that names one of two words (unset or empty: unchanged).
absl::Status ParseChoice(const char* name, const char* value, const char* a, const char* b,
                         std::string* out) {
  if (value == nullptr || *value == 0) return absl::OkStatus();
  if (std::string(value) != a && std::string(value) != b) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", value, "' is not ", a, " or ", b));
  }
  *out = value;
  return absl::OkStatus();
}

struct Loaded {
  Config config;
  absl::Status status;
};

const Loaded& Load() {
  static const Loaded* loaded = [] {
    auto* l = new Loaded;
    auto parsed = ParseConfig([](const char* n) { return std::getenv(n); });
    if (parsed.ok()) {
      l->config = *parsed;
    } else {
      l->status = parsed.status();
    }
    return l;
  }();
  return *loaded;
}

}  // namespace

std::span<const ConfigVar> ConfigTable() { return kTable; }

absl::StatusOr<Config> ParseConfig(const std::function<const char*(const char*)>& getenv) {
  Config c;
  if (const char* v = getenv("CXLRT_POOL"); v && *v) c.pool = v;
  if (const char* v = getenv("CXLRT_HOST_ID"); v && *v) {
    int id = 0;
    if (!absl::SimpleAtoi(v, &id) || id < -1 || id > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("CXLRT_HOST_ID='", v, "' is not -1 or a host id in [0, 1023]"));
    }
    c.host_id = id;
  }
  if (const char* v = getenv("CXLRT_SLOTS_PER_HOST"); v && *v) {
    if (auto s = ParseUint("CXLRT_SLOTS_PER_HOST", v, 1, 1024, &c.slots_per_host); !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_LEASE_MS"); v && *v) {
    if (auto s = ParseUint("CXLRT_LEASE_MS", v, 10, 3600000, &c.lease_ms); !s.ok()) return s;
  }
  if (const char* v = getenv("CXLRT_HEARTBEAT_MS"); v && *v) {
    if (auto s = ParseUint("CXLRT_HEARTBEAT_MS", v, 1, 600000, &c.heartbeat_ms); !s.ok()) {
      return s;
    }
  }
  if (c.heartbeat_ms * 2 > c.lease_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CXLRT_HEARTBEAT_MS=", c.heartbeat_ms, " must be below half of CXLRT_LEASE_MS=", c.lease_ms,
        ", or live hosts would be declared dead"));
  }
  if (const char* v = getenv("CXLRT_LOCK_TIMEOUT_MS"); v && *v) {
    if (auto s = ParseUint("CXLRT_LOCK_TIMEOUT_MS", v, 1, 3600000, &c.lock_timeout_ms); !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_WAIT_SPINS"); v && *v) {
    if (auto s = ParseUint("CXLRT_WAIT_SPINS", v, 0, 100000000, &c.wait_spins); !s.ok()) return s;
  }
  if (const char* v = getenv("CXLRT_SHM_DIR"); v && *v) c.shm_dir = v;
  if (const char* v = getenv("CXLRT_LOG_LEVEL"); v && *v) {
    std::string s = v;
    if (s != "error" && s != "warning" && s != "info" && s != "debug") {
      return absl::InvalidArgumentError(
          absl::StrCat("CXLRT_LOG_LEVEL='", s, "' is not one of error, warning, info, debug"));
    }
    c.log_level = s;
  }
  if (const char* v = getenv("CXLRT_FAULT"); v && *v) {
    if (auto rules = ParseFaultSpec(v); !rules.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("CXLRT_FAULT: ", rules.status().message()));
    }
    c.fault = v;
  }
  if (const char* v = getenv("CXLRT_COMM_TIMEOUT_MS"); v && *v) {
    if (auto s = ParseUint("CXLRT_COMM_TIMEOUT_MS", v, 1, 86400000, &c.comm_timeout_ms); !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_COMM_SLOT_BYTES"); v && *v) {
    if (auto s = ParseUint("CXLRT_COMM_SLOT_BYTES", v, 4096, 1u << 30, &c.comm_slot_bytes);
        !s.ok()) {
      return s;
    }
    c.comm_slot_bytes_set = true;
  }
  if (const char* v = getenv("CXLRT_COMM_P2P_BYTES"); v && *v) {
    if (auto s = ParseUint("CXLRT_COMM_P2P_BYTES", v, 4096, 1u << 30, &c.comm_p2p_bytes); !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_ALLREDUCE_ONESHOT_MAX"); v && *v) {
    if (auto s = ParseUint("CXLRT_ALLREDUCE_ONESHOT_MAX", v, 0, 1u << 30, &c.allreduce_oneshot_max);
        !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_COMM_DEPTH"); v && *v) {
    if (auto s = ParseUint("CXLRT_COMM_DEPTH", v, 2, 8, &c.comm_depth); !s.ok()) return s;
  }
  if (const char* v = getenv("CXLRT_COMM_CHUNK_BYTES"); v && *v) {
    if (auto s = ParseUint("CXLRT_COMM_CHUNK_BYTES", v, 0, 1u << 30, &c.comm_chunk_bytes);
        !s.ok()) {
      return s;
    }
  }
  if (const char* v = getenv("CXLRT_PIN"); v && *v) {
    const std::string p = v;
    bool list = !p.empty();
    for (char ch : p) list = list && (std::isdigit(static_cast<unsigned char>(ch)) || ch == ',');
    if (p != "auto" && p != "off" && !list) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CXLRT_PIN='", p, "' is not auto, off or a comma-separated list of core numbers"));
    }
    c.pin = p == "auto" ? "" : p;
  }
  if (auto s = ParseChoice("CXLRT_CUDA_REDUCE", getenv("CXLRT_CUDA_REDUCE"), "staged", "mapped",
                           &c.cuda_reduce);
      !s.ok()) {
    return s;
  }
  if (auto s = ParseChoice("CXLRT_CUDA_KV_COPY", getenv("CXLRT_CUDA_KV_COPY"), "engine", "kernel",
                           &c.cuda_kv_copy);
      !s.ok()) {
    return s;
  }
  if (auto s = ParseChoice("CXLRT_CUDA_DOORBELL", getenv("CXLRT_CUDA_DOORBELL"), "host", "copy",
                           &c.cuda_doorbell);
      !s.ok()) {
    return s;
  }
  if (const char* v = getenv("CXLRT_CPU_LEVEL"); v && *v && std::string_view(v) != "auto") {
    c.cpu_level = ParseCpuLevel(v);
    if (!c.cpu_level) {
      return absl::InvalidArgumentError(
          absl::StrCat("CXLRT_CPU_LEVEL='", v, "' is not auto, baseline, avx2 or avx512"));
    }
  }
  return c;
}

const Config& GetConfig() { return Load().config; }

absl::Status ConfigStatus() { return Load().status; }

}  // namespace cxlrt::runtime
