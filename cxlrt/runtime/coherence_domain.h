// The coherence domains of DESIGN.md, as stored in the pool header.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace cxlrt::runtime {

enum class CoherenceDomain : uint32_t {
  kHardware = 1,   // coherent memory: plain store + release, load + acquire
  kSoftware = 2,   // non-coherent CXL: write back (clwb) and invalidate (clflushopt)
  kSimulated = 3,  // emulation: private per-host caches make missing flushes visible
};

absl::string_view CoherenceDomainName(CoherenceDomain d);
std::optional<CoherenceDomain> ParseCoherenceDomain(absl::string_view name);

}  // namespace cxlrt::runtime
