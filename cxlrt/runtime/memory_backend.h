// The memory a pool lives in. A MemoryBackend owns one shared mapping of the
// whole pool (an emulated file, a device-DAX device); the Pool on top never
// sees where the bytes come from.
//
// Backends are found by URI scheme in a registry: cxlrt/runtime/ registers dax://,
// cxlrt/emulation/ registers emu:// (see docs/architecture.md for why a registry).
// A MemoryBackend is not thread-safe against its own destruction; its
// accessors are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/runtime/uri.h"

namespace cxlrt::runtime {

// One device of a backend: a contiguous part of the mapping with its own
// backing (an emulated pool of devices=D has D files).
struct BackendDevice {
  std::string path;
  int numa_node = -1;
  uint64_t offset = 0;  // in the mapping
  uint64_t size = 0;
};

struct BackendInfo {
  std::string kind;       // "emulated (shared file)" or "device-DAX"
  std::string path;       // backing file or device
  int numa_node = -1;     // node the pages are bound to, -1 unbound or unknown
  std::string placement;  // why that node, in words
  bool huge_pages = false;
  uint64_t alignment = 4096;  // of the mapping and of its size
  std::string granularity;    // store granularity reported by libpmem2, if used
  // The devices, in mapping order, when there are several; empty: one
  // device, the whole mapping.
  std::vector<BackendDevice> devices;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;

  virtual uint8_t* base() const = 0;
  virtual uint64_t size() const = 0;
  virtual const BackendInfo& info() const = 0;

  // Takes index `i` for this process among all processes of this machine
  // that map the same pool (an OFD byte-range lock on the backing file).
  // Returns false when another open of the pool holds it. The lock dies with
  // the process, so a crashed holder never blocks its successor.
  // Processes on one machine need this because host slot claiming is built
  // from single-writer lines (docs/membership.md).
  virtual absl::StatusOr<bool> TryLockLocalIndex(uint32_t i) = 0;
  virtual void UnlockLocalIndex(uint32_t i) = 0;

  // Makes sure [offset, offset + length) of the mapping has memory behind
  // it: once this returns OK, touching those bytes never faults for want of
  // memory (SIGBUS). Idempotent; safe from any thread or process. Backends
  // whose memory is all there at creation (a DAX device, an emulated pool
  // made with reserve=all) return OK at once. kResourceExhausted when the
  // memory is not there to be had.
  // REQUIRES: the range lies inside the mapping.
  virtual absl::Status Reserve(uint64_t offset, uint64_t length) {
    (void)offset;
    (void)length;
    return absl::OkStatus();
  }
};

// What a scheme's backend can do. All functions report errors as Status:
// kNotFound (no such pool or device), kAlreadyExists, kPermissionDenied,
// kInvalidArgument (bad size or path), kResourceExhausted (no space).
struct BackendProvider {
  // Makes new backing for a pool of `size` bytes. The bytes read as zero.
  absl::StatusOr<std::unique_ptr<MemoryBackend>> (*create)(const PoolUri& uri, uint64_t size);
  // Maps the existing backing of `uri`, whatever its contents.
  absl::StatusOr<std::unique_ptr<MemoryBackend>> (*open)(const PoolUri& uri);
  // Removes the backing (emu) or wipes the pool header (dax).
  absl::Status (*destroy)(const PoolUri& uri);
  // Smallest granule of a pool's size.
  uint64_t size_alignment;
};

// Registers `provider` (static storage) for `scheme`; later calls replace it.
void RegisterBackendProvider(PoolScheme scheme, const BackendProvider* provider);

// The provider for `scheme`, or kFailedPrecondition when none is linked in.
absl::StatusOr<const BackendProvider*> FindBackendProvider(PoolScheme scheme);

// A backend over a file descriptor and one shared mapping of it: the part
// both built-in backends share. Closes and unmaps in its destructor.
class MappedFileBackend : public MemoryBackend {
 public:
  // `owns_mapping`: unmap `base` in the destructor (false when a library,
  // e.g. libpmem2, owns the mapping and the subclass releases it).
  MappedFileBackend(int fd, uint8_t* base, uint64_t size, BackendInfo info,
                    bool owns_mapping = true);
  ~MappedFileBackend() override;

  uint8_t* base() const override { return base_; }
  uint64_t size() const override { return size_; }
  const BackendInfo& info() const override { return info_; }
  absl::StatusOr<bool> TryLockLocalIndex(uint32_t i) override;
  void UnlockLocalIndex(uint32_t i) override;

 protected:
  BackendInfo& mutable_info() { return info_; }

 private:
  const int fd_;
  uint8_t* const base_;
  const bool owns_mapping_;
  const uint64_t size_;
  BackendInfo info_;
  std::mutex mu_;
  std::set<uint32_t> locked_;  // guarded by mu_: the same fd must not lock twice
};

// The built-in dax:// provider (cxlrt/runtime/dax_backend.cc).
const BackendProvider* DaxBackendProvider();

// An errno as a Status with the code callers expect (ENOENT: kNotFound,
// EACCES/EPERM: kPermissionDenied, ENOSPC/ENOMEM: kResourceExhausted, ...).
absl::Status ErrnoStatus(int err, absl::string_view what);

}  // namespace cxlrt::runtime
