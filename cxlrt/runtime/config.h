// Process configuration: every CXLRT_* environment variable is read here,
// once, from one table (kConfigTable). README.md documents the same table;
// tests/runtime/config_test.cc fails when the two drift apart.
// Thread-safe: the configuration is parsed on first use and then immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlrt/runtime/cpu_features.h"

namespace cxlrt::runtime {

struct Config {
  std::string pool = "emu://cxlrt?size=1G";   // CXLRT_POOL
  int host_id = -1;                           // CXLRT_HOST_ID, -1: none
  uint32_t slots_per_host = 8;                // CXLRT_SLOTS_PER_HOST
  uint32_t lease_ms = 2000;                   // CXLRT_LEASE_MS
  uint32_t heartbeat_ms = 100;                // CXLRT_HEARTBEAT_MS
  uint32_t lock_timeout_ms = 10000;           // CXLRT_LOCK_TIMEOUT_MS
  uint32_t wait_spins = 2000;                 // CXLRT_WAIT_SPINS
  std::string shm_dir = "/dev/shm";           // CXLRT_SHM_DIR
  std::string log_level = "warning";          // CXLRT_LOG_LEVEL
  std::string fault;                          // CXLRT_FAULT, "" none
  uint32_t comm_timeout_ms = 60000;           // CXLRT_COMM_TIMEOUT_MS
  uint32_t comm_slot_bytes = 1 << 20;         // CXLRT_COMM_SLOT_BYTES
  bool comm_slot_bytes_set = false;           // CXLRT_COMM_SLOT_BYTES was given
  uint32_t comm_p2p_bytes = 0;                // CXLRT_COMM_P2P_BYTES; 0: by the pool's size
  uint32_t allreduce_oneshot_max = 64 << 10;  // CXLRT_ALLREDUCE_ONESHOT_MAX
  uint32_t comm_depth = 4;                    // CXLRT_COMM_DEPTH
  uint32_t comm_chunk_bytes = 0;              // CXLRT_COMM_CHUNK_BYTES, 0: the table
  std::string pin;                            // CXLRT_PIN, "": auto
  std::string cuda_reduce = "staged";         // CXLRT_CUDA_REDUCE: staged or mapped
  std::string cuda_kv_copy = "engine";        // CXLRT_CUDA_KV_COPY: engine or kernel
  std::string cuda_doorbell = "host";         // CXLRT_CUDA_DOORBELL: host or copy
  std::optional<CpuLevel> cpu_level;          // CXLRT_CPU_LEVEL; nullopt: auto
};

struct ConfigVar {
  const char* name;
  const char* default_value;
  const char* description;
};

// The documented table, in the order README.md lists it.
std::span<const ConfigVar> ConfigTable();

// Parses the variables through `getenv` (nullptr result: unset).
// Returns kInvalidArgument naming the variable and its bad value.
absl::StatusOr<Config> ParseConfig(const std::function<const char*(const char*)>& getenv);

// The process configuration. When the environment holds a bad value the
// defaults are used and ConfigStatus() reports the error.
const Config& GetConfig();

// OK, or the error that made GetConfig() fall back to defaults. Pool::Open
// and Pool::Create return it, so a typo in CXLRT_LEASE_MS is never silent.
absl::Status ConfigStatus();

}  // namespace cxlrt::runtime
