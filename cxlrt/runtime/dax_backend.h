// Device-DAX backend: a CXL memory device exposed as /dev/daxX.Y, mapped
// shared with libpmem2 (which also reports the store granularity).
// Device-DAX maps in units of its alignment (2 MiB or 1 GiB), so a pool's
// size must be a multiple of it. Thread-safety as MemoryBackend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace cxlrt::runtime {

// Checks that a pool of `requested` bytes (nullopt: the whole device) fits a
// device of `device_size` bytes with mapping alignment `alignment`; returns
// the size to map or kInvalidArgument saying which rule failed.
absl::StatusOr<uint64_t> ValidateDaxSize(std::optional<uint64_t> requested, uint64_t device_size,
                                         uint64_t alignment, const std::string& path);

// The size Open maps for a device whose first bytes hold a pool header
// saying `header_pool_size`: that size where it fits the device and its
// alignment (a pool created smaller than its device), else `device_size`
// (no pool, or a corrupt header that the pool layer then reports).
uint64_t DaxOpenSize(uint64_t header_pool_size, uint64_t device_size, uint64_t alignment);

// Checks that `path` is a device-DAX character device (sysfs subsystem
// "dax"). Returns kNotFound, kInvalidArgument or kPermissionDenied saying what
// the path is instead.
absl::Status CheckDaxDevice(const std::string& path);

}  // namespace cxlrt::runtime
