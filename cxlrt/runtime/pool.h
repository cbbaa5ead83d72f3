// A pool: one shared mapping of CXL (or emulated) memory in format v1
// (cxlrt/runtime/pool_layout.h, docs/pool-format.md), opened by URI.
//
// Open validates the header and the tables and bounds-checks every offset
// and size it reads: a corrupt or hostile pool yields kDataLoss saying what
// is wrong and where, never a crash or an access outside the mapping.
//
// Thread-safety: a Pool may be used from many threads; its accessors are
// const or go through the Coherence, which is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/memory_backend.h"
#include "cxlrt/runtime/placement.h"
#include "cxlrt/runtime/pool_layout.h"
#include "cxlrt/runtime/uri.h"

namespace cxlrt::runtime {

// The pool that `cxlrt` commands and benchmarks use when none is named:
// CXLRT_POOL, else emu://cxlrt?size=1G.
const std::string& DefaultPoolUri();
// CXLRT_POOL as the environment holds it now (nullopt: unset or empty),
// for callers that have no default (cxlrt::Host::Open).
std::optional<std::string> PoolUriFromEnvironment();

// What a reader can learn about one host slot, from its two lines.
struct HostRecord {
  uint32_t slot = 0;
  SlotState state = SlotState::kFree;
  uint64_t epoch = 0;       // control epoch
  uint32_t changed_by = 0;  // slot that made the last control change
  uint32_t owner_pid = 0;
  // The owner line is valid: checksum good and stamped with the current
  // epoch. When false, the fields below are not to be trusted (a fenced or
  // departed incarnation wrote them, or the owner has not written yet).
  bool owner_current = false;
  uint64_t heartbeat = 0;
  uint32_t pid = 0;
  uint32_t lease_ms = 0;
  uint32_t heartbeat_ms = 0;
  uint64_t attach_unix_ns = 0;
  uint64_t machine = 0;  // MachineId() of the owner's machine
  std::string hostname;
};

// This running machine's identity, never 0: the high 32 bits hash the
// machine (/etc/machine-id and the full host name), the low 32 bits this
// boot of it (/proc/sys/kernel/random/boot_id, or CXLRT_TEST_BOOT_ID, and
// the host name). Processes with equal ids share one kernel, so its local
// locks (fcntl) are meaningful between them.
uint64_t MachineId();
// Whether two MachineId()s are of one machine, maybe of different boots.
inline bool SameMachine(uint64_t a, uint64_t b) { return a >> 32 == b >> 32; }

struct RegionInfo {
  uint32_t index = 0;
  std::string name;
  PoolOffset offset = 0;
  uint64_t size = 0;
  uint32_t owner_host = 0;
  uint64_t generation = 0;
};

struct DestroyOptions {
  // Destroy even when hosts look attached and alive.
  bool force = false;
};

class Pool {
 public:
  // Creates the pool `uri` names. REQUIRES in the URI: size= (at least
  // 4 MiB, a multiple of 2 MiB). Returns kAlreadyExists when a pool is
  // there, kInvalidArgument for a bad URI or size, kResourceExhausted when
  // the memory is not there, kPermissionDenied.
  static absl::StatusOr<std::unique_ptr<Pool>> Create(absl::string_view uri);

  // Opens an existing pool. Returns kNotFound when there is none,
  // kPermissionDenied when it may not be read and written, kDataLoss when it
  // is corrupt (message says what and where), kInvalidArgument when the URI
  // contradicts the pool (size=, coherence= or hosts= differ).
  static absl::StatusOr<std::unique_ptr<Pool>> Open(absl::string_view uri);

  // Removes the pool. Refuses with kFailedPrecondition while a host is
  // attached and its heartbeat advances, unless `options.force`. Works on a
  // corrupt pool (that is what it is for). kNotFound when there is none.
  static absl::Status Destroy(absl::string_view uri, const DestroyOptions& options = {});

  // Checks a header against the backing's size; kDataLoss naming the first
  // bad field. Pure; exposed for tests and the fuzz loop.
  static absl::Status ValidateHeader(const PoolHeaderLayout& header, uint64_t backing_size,
                                     absl::string_view where);

  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const PoolUri& uri() const { return uri_; }
  // "emu://demo": for messages.
  const std::string& name() const { return identity_; }
  // The validated header as read at Open (it never changes afterwards).
  const PoolHeaderLayout& header() const { return header_; }
  uint64_t size() const { return header_.pool_size; }
  CoherenceDomain domain() const { return static_cast<CoherenceDomain>(header_.coherence_domain); }
  uint32_t host_slots() const { return header_.host_slot_count; }
  Coherence& coherence() const { return *coherence_; }
  // The pool's devices (one unless created with devices=D).
  const DeviceMap& devices() const { return devices_; }
  // The part of the heap on device `d` as [begin, end); may be empty.
  // REQUIRES: d < devices().count().
  std::pair<PoolOffset, PoolOffset> HeapOnDevice(uint32_t d) const {
    return devices_.Clip(d, header_.heap_offset, header_.pool_size);
  }
  MemoryBackend& backend() const { return *backend_; }

  // Offsets of slot `i`'s lines. REQUIRES: i < host_slots().
  PoolOffset OwnerLineOffset(uint32_t i) const;
  PoolOffset ControlLineOffset(uint32_t i) const;
  PoolOffset BakeryLineOffset(uint32_t i) const;
  PoolOffset DirectoryEntryOffset(uint32_t i) const;

  // Reads slot `i` (retrying torn reads). kDataLoss when its control line
  // stays corrupt; kInvalidArgument when `i` is out of range.
  absl::StatusOr<HostRecord> ReadHost(uint32_t i) const;

  // The live entries of the region directory. kDataLoss on a corrupt entry.
  absl::StatusOr<std::vector<RegionInfo>> ListRegions() const;

  // Publishes a live directory entry `name` -> [offset, offset+size) made by
  // host `owner_host`. Returns its index; kAlreadyExists when a live entry
  // has the name, kResourceExhausted when the directory is full,
  // kInvalidArgument for a bad name or a range outside the heap.
  // REQUIRES: the caller holds the pool lock (Membership::WithPoolLock).
  absl::StatusOr<uint32_t> CreateRegion(absl::string_view name, PoolOffset offset, uint64_t size,
                                        uint32_t owner_host);
  // Marks entry `index` empty. kNotFound when it is not live.
  // REQUIRES: the caller holds the pool lock.
  absl::Status DeleteRegion(uint32_t index);
  // The live entry named `name`, bounds-checked. kNotFound when none.
  absl::StatusOr<RegionInfo> FindRegion(absl::string_view name) const;

  // Full audit of header, host table and region directory. Returns OK, or
  // kDataLoss summarising every problem; each problem is also appended to
  // `problems` when given.
  absl::Status Check(std::vector<std::string>* problems = nullptr) const;

 private:
  Pool(PoolUri uri, std::unique_ptr<MemoryBackend> backend, std::unique_ptr<Coherence> coherence,
       const PoolHeaderLayout& header);
  // Puts the coherence layer under the URI's access model, if it asks for one.
  absl::Status ApplyModel();

  PoolUri uri_;
  std::string identity_;
  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<Coherence> coherence_;
  PoolHeaderLayout header_;
  DeviceMap devices_;
};

// Makes the access model a URI asks for (latency_ns=, bw_gbps=, model=);
// cxlrt/emulation/ registers it. Without one, such a URI is kFailedPrecondition.
using AccessModelFactory =
    absl::StatusOr<std::unique_ptr<AccessModel>> (*)(const PoolUri& uri, const DeviceMap& devices);
void RegisterAccessModelFactory(AccessModelFactory factory);

// Checksum helpers for the records of pool_layout.h (shared with tests).
uint32_t HeaderChecksum(const PoolHeaderLayout& h);
uint32_t OwnerLineChecksum(const HostOwnerLineLayout& l);
uint32_t ControlLineChecksum(const HostControlLineLayout& l);
uint32_t RegionEntryChecksum(const RegionEntryLayout& e);

}  // namespace cxlrt::runtime
