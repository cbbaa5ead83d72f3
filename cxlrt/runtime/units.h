// Byte sizes as people write them: "256M", "4G", "4096", "1.5G" is refused.
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlrt::runtime {

// Parses an integer with an optional binary suffix K, M, G or T (also KiB,
// MiB, GiB, TiB, and lowercase). Returns kInvalidArgument on anything else or
// on overflow; `what` names the value in the message.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text, absl::string_view what = "size");

// "256 MiB", "4 GiB", "1000 B": exact when a unit divides the value.
std::string FormatBytes(uint64_t bytes);

}  // namespace cxlrt::runtime
