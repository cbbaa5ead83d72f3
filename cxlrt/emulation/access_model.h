// The latency / bandwidth model of an emulated CXL pool: delay injected on
// every access made through the coherence layer, so developers see roughly
// how a protocol would perform on CXL hardware (docs/emulation.md).
//
// URI: latency_ns=N, bw_gbps=X (per device), or a preset model=switch|direct
// whose figures come from published CXL measurements (explicit values
// override the preset's). Off unless the URI asks.
//
// Costs (runtime::Coherence decides which accesses wait a round trip):
//   load (Read, LoadFlag, CopyFromPool)   latency + bytes / bandwidth
//   store (Write)                          bytes / bandwidth (posted)
//   Flush, StoreFlag, CopyToPool           + latency (wait for write-back)
// Bandwidth is a budget per device shared by every emulated host of the
// machine: each device has a clock (the time its link is busy until) in a
// small shared file beside the pool, and an access of n bytes reserves
// n / bandwidth of it, in chunks of 64 KiB so concurrent streams interleave
// and two hosts streaming at once each get about half. An access finishes
// no earlier than its real copy: the model only adds delay.
//
// Thread-safety: thread-safe, and safe across processes (the clocks are
// lock-free atomics in shared memory; they are emulation state, not pool
// memory, so their atomic read-modify-write models a device's arbiter).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/placement.h"
#include "cxlrt/runtime/uri.h"

namespace cxlrt::emulation {

struct ModelParams {
  uint32_t latency_ns = 0;  // 0: no latency
  double bw_gbps = 0;       // per device, 10^9 B/s; 0: unlimited
  std::string preset;       // "switch", "direct" or ""
};

struct ModelPreset {
  const char* name;
  uint32_t latency_ns;
  double bw_gbps;
  const char* what;
};

// The presets, with what they stand for (docs/emulation.md cites sources).
const ModelPreset* FindModelPreset(const std::string& name);

// The model a URI asks for (preset, then explicit values).
ModelParams ModelFromUri(const runtime::PoolUri& uri);

// A model over `devices`, its device clocks in the shared file `clock_path`
// (created when missing). kPermissionDenied / kResourceExhausted when the
// file cannot be made.
absl::StatusOr<std::unique_ptr<runtime::AccessModel>> MakeAccessModel(
    const ModelParams& params, const runtime::DeviceMap& devices, const std::string& clock_path);

// Spins (then sleeps, for long waits) until NowNs() >= deadline_ns.
void WaitUntilNs(int64_t deadline_ns);

// Makes sure the emu:// model factory is registered (static registration
// does it too).
void RegisterAccessModel();

}  // namespace cxlrt::emulation
