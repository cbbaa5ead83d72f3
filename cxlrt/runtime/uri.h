// Pool URIs: which pool, on which memory, with which coherence domain.
//
//   emu://NAME?size=4G&node=N&coherence=hardware|software|simulated
//             &dir=PATH&mode=0600&hosts=64&devices=D
//             &model=switch|direct&latency_ns=N&bw_gbps=X&prefault=0|1
//             &reserve=all|lazy
//   dax:///dev/dax0.0?size=...&coherence=...&hosts=...
//
// Thread-safe (pure functions over values).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/runtime/coherence_domain.h"

namespace cxlrt::runtime {

enum class PoolScheme { kEmu, kDax };

struct PoolUri {
  PoolScheme scheme = PoolScheme::kEmu;
  // emu: the pool's name ([A-Za-z0-9._-], 1-64 chars, not starting with '.').
  // dax: the absolute path of the device.
  std::string name;
  std::optional<uint64_t> size;              // bytes; create only (dax: at most the device)
  std::optional<int> node;                   // emu: NUMA node of the pages
  std::optional<CoherenceDomain> coherence;  // create only; open reads the header
  std::optional<std::string> dir;            // emu: directory of the pool file
  std::optional<uint32_t> mode;              // emu: file mode at creation (octal)
  std::optional<uint32_t> hosts;             // create only: host slots, 1-1024
  std::optional<uint32_t> devices;           // emu, create only: emulated devices, 1-16
  // emu, per open: the latency / bandwidth model (cxlrt/emulation/access_model.h).
  std::optional<std::string> model;  // preset: "switch" or "direct"
  std::optional<uint32_t> latency_ns;
  std::optional<double> bw_gbps;  // per device
  // emu, per open: map the whole pool's page tables up front (1, the
  // default: no access later pays a fault) or on first touch (0: opening a
  // large pool costs nothing; the pages are still allocated at creation).
  std::optional<bool> prefault;
  // emu, create only: reserve the whole file at creation (all, the
  // default) or as the allocator claims its segments (lazy: creating a
  // large pool costs milliseconds, as a CXL dynamic capacity device adds
  // extents on demand; a full filesystem is then kResourceExhausted at the
  // claim, never a SIGBUS). Lazy implies prefault=0.
  std::optional<bool> reserve_lazy;

  // True when the URI asks for the latency / bandwidth model.
  bool HasModel() const { return model || latency_ns || bw_gbps; }

  // Canonical text, parameters in a fixed order ("emu://demo?size=256M").
  std::string ToString() const;
  // The scheme and name only: what identifies the pool ("emu://demo").
  std::string Identity() const;
  // The URI another opener of the same pool uses: this one without the
  // parameters only creation takes (size, hosts, devices, mode, node,
  // coherence, reserve); placement (dir) and the model stay.
  std::string ForOpeners() const;
  // Domain in force at creation when the URI names none.
  CoherenceDomain CoherenceOrDefault() const;
};

// Parses `text`. Returns kInvalidArgument naming the bad part: an unknown
// scheme, a bad name, an unknown or repeated parameter, a bad value.
absl::StatusOr<PoolUri> ParsePoolUri(absl::string_view text);

}  // namespace cxlrt::runtime
