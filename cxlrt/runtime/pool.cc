#include "cxlrt/runtime/pool.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/torn_read.h"
#include "cxlrt/runtime/units.h"

namespace cxlrt::runtime {
namespace {

const Knob<std::string> kPool({"CXLRT_POOL", "emu://cxlrt?size=1G",
                               "Pool URI used by `cxlrt` commands when none is given."},
                              "emu://cxlrt?size=1G", AnyText());
const Knob<std::string> kTestBootId(
    {"CXLRT_TEST_BOOT_ID", "",
     "For tests: stands in for this machine's boot id, so that a test can reboot a host "
     "(docs/membership.md, \"Reboots\")."},
    "", AnyText());

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bool AllZero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i]) return false;
  }
  return true;
}

uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof(id), 0) != sizeof(id)) {
      id = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
           (static_cast<uint64_t>(getpid()) << 32);
    }
  }
  return id;
}

// Reads a checksummed record, retrying while a concurrent writer may be
// midway (torn_read.h). Returns false when the checksum never matched.
// These records are one or two lines, written with one copy, and every
// heartbeat reads each host's: a corrupt one may cost a beat 1 ms, no more,
// or a pool with many of them would make live hosts miss their leases.
template <typename T, typename Sum>
bool ReadRecord(Coherence& c, PoolOffset off, T* out, Sum sum, bool* all_zero) {
  static_assert(sizeof(T) <= 128);
  return RetryTornRead(
      [&] {
        c.Fetch(out, off, sizeof(T));
        *all_zero = AllZero(out, sizeof(T));
        return *all_zero || sum(*out) == out->checksum;
      },
      absl::Milliseconds(1));
}

std::string SafeString(const char* chars, size_t max) {
  size_t n = strnlen(chars, max);
  std::string s(chars, n);
  for (char& ch : s) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  return s;
}

struct Layout {
  uint64_t host_table_offset, directory_offset, heap_offset;
};

Layout ComputeLayout(uint32_t hosts, uint32_t entries) {
  Layout l;
  l.host_table_offset = kHeaderRegionSize;
  l.directory_offset =
      AlignUp(l.host_table_offset + uint64_t{hosts} * sizeof(HostSlotLayout), 4096);
  l.heap_offset =
      AlignUp(l.directory_offset + uint64_t{entries} * sizeof(RegionEntryLayout), kHeapAlignment);
  return l;
}

absl::Status Corrupt(absl::string_view where, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("pool ", where, " is corrupt: ", what));
}

}  // namespace

const std::string& DefaultPoolUri() { return kPool.Get(); }
std::optional<std::string> PoolUriFromEnvironment() { return kPool.CurrentText(); }

uint32_t HeaderChecksum(const PoolHeaderLayout& h) {
  return Crc32c(&h, offsetof(PoolHeaderLayout, checksum));
}
uint32_t OwnerLineChecksum(const HostOwnerLineLayout& l) {
  return Crc32c(reinterpret_cast<const uint8_t*>(&l) + 8,
                offsetof(HostOwnerLineLayout, checksum) - 8);
}
uint32_t ControlLineChecksum(const HostControlLineLayout& l) {
  return Crc32c(&l, offsetof(HostControlLineLayout, checksum));
}
uint32_t RegionEntryChecksum(const RegionEntryLayout& e) {
  return Crc32c(&e, offsetof(RegionEntryLayout, checksum));
}

absl::Status Pool::ValidateHeader(const PoolHeaderLayout& h, uint64_t backing_size,
                                  absl::string_view where) {
  if (h.magic != kPoolMagic) {
    if (AllZero(&h, sizeof(h))) {
      return Corrupt(where,
                     "the header is all zero: its creation did not finish, or this is "
                     "not a cxlrt pool");
    }
    if (h.magic == 0) {
      return Corrupt(where, "header magic is 0x0: its creation did not finish (creator crashed?)");
    }
    return Corrupt(where, absl::StrCat("header magic is 0x", absl::Hex(h.magic), " (expected 0x",
                                       absl::Hex(kPoolMagic), ", \"CXLRTPL1\"): not a cxlrt pool"));
  }
  if (h.format_version != kPoolFormatVersion) {
    return Corrupt(where, absl::StrCat("format version is ", h.format_version,
                                       " but this build reads version ", kPoolFormatVersion));
  }
  if (h.header_size != sizeof(PoolHeaderLayout)) {
    return Corrupt(where, absl::StrCat("header_size is ", h.header_size, " (expected ",
                                       sizeof(PoolHeaderLayout), ")"));
  }
  if (uint32_t sum = HeaderChecksum(h); sum != h.checksum) {
    return Corrupt(where, absl::StrCat("header checksum is 0x", absl::Hex(h.checksum),
                                       " but the header's bytes sum to 0x", absl::Hex(sum)));
  }
  if (h.pool_size != backing_size) {
    const bool devices = (h.flags & kHeaderFlagDevices) && h.device_count > 1;
    return Corrupt(where,
                   absl::StrCat("header says the pool is ", FormatBytes(h.pool_size),
                                devices ? absl::StrCat(" in ", h.device_count, " devices") : "",
                                " but its backing holds ", FormatBytes(backing_size),
                                h.pool_size <= backing_size ? ""
                                : devices ? " (truncated, or a device's backing is missing?)"
                                          : " (truncated?)"));
  }
  if (h.pool_size < kMinPoolSize) {
    return Corrupt(where, absl::StrCat("pool_size ", h.pool_size, " is below the minimum ",
                                       FormatBytes(kMinPoolSize)));
  }
  if (!ParseCoherenceDomain(
          CoherenceDomainName(static_cast<CoherenceDomain>(h.coherence_domain)))) {
    return Corrupt(where, absl::StrCat("coherence domain is ", h.coherence_domain,
                                       " (expected 1 hardware, 2 software or 3 simulated)"));
  }
  if ((h.flags & ~kKnownHeaderFlags) != 0) {
    return Corrupt(where, absl::StrCat("flags are 0x", absl::Hex(h.flags), " (known: 0x",
                                       absl::Hex(kKnownHeaderFlags), ")"));
  }
  if (h.flags & kHeaderFlagDevices) {
    if (h.device_count < 2 || h.device_count > kMaxDevices) {
      return Corrupt(where, absl::StrCat("device_count is ", h.device_count, " (expected 2..",
                                         kMaxDevices, ")"));
    }
    if (h.device_size == 0 || h.device_size % kHeapAlignment != 0 ||
        h.device_size != h.pool_size / h.device_count || h.pool_size % h.device_count != 0) {
      return Corrupt(where, absl::StrCat("device_size is ", h.device_size, " but ", h.device_count,
                                         " devices of 2 MiB multiples must make "
                                         "up the pool of ",
                                         h.pool_size, " bytes"));
    }
  } else if (h.device_count != 0 || h.device_size != 0) {
    return Corrupt(where, absl::StrCat("device_count ", h.device_count, " and device_size ",
                                       h.device_size, " are set without the devices flag"));
  }
  if (h.host_slot_count < 1 || h.host_slot_count > kMaxHostSlots) {
    return Corrupt(where, absl::StrCat("host_slot_count is ", h.host_slot_count, " (expected 1..",
                                       kMaxHostSlots, ")"));
  }
  if (h.host_slot_size != sizeof(HostSlotLayout)) {
    return Corrupt(where, absl::StrCat("host_slot_size is ", h.host_slot_size, " (expected ",
                                       sizeof(HostSlotLayout), ")"));
  }
  if (h.directory_entry_count < 1 || h.directory_entry_count > kMaxDirectoryEntries) {
    return Corrupt(where, absl::StrCat("directory_entry_count is ", h.directory_entry_count,
                                       " (expected 1..", kMaxDirectoryEntries, ")"));
  }
  if (h.directory_entry_size != sizeof(RegionEntryLayout)) {
    return Corrupt(where, absl::StrCat("directory_entry_size is ", h.directory_entry_size,
                                       " (expected ", sizeof(RegionEntryLayout), ")"));
  }
  // Tables in order, each inside the pool: counts are bounded above, so
  // these products cannot overflow.
  const uint64_t host_end = h.host_table_offset + uint64_t{h.host_slot_count} * h.host_slot_size;
  const uint64_t dir_end =
      h.directory_offset + uint64_t{h.directory_entry_count} * h.directory_entry_size;
  if (h.host_table_offset < kHeaderRegionSize || h.host_table_offset % 4096 != 0 ||
      h.host_table_offset > h.pool_size || host_end > h.pool_size) {
    return Corrupt(where,
                   absl::StrCat("host table [", h.host_table_offset, ", ", host_end,
                                ") is not 4 KiB aligned after the header inside the pool of ",
                                h.pool_size, " bytes"));
  }
  if (h.directory_offset < host_end || h.directory_offset % 4096 != 0 ||
      h.directory_offset > h.pool_size || dir_end > h.pool_size) {
    return Corrupt(where, absl::StrCat("region directory [", h.directory_offset, ", ", dir_end,
                                       ") is not 4 KiB aligned after the host table (ends at ",
                                       host_end, ") inside the pool of ", h.pool_size, " bytes"));
  }
  if (h.heap_offset < dir_end || h.heap_offset % kHeapAlignment != 0 ||
      h.heap_offset > h.pool_size || h.heap_size != h.pool_size - h.heap_offset ||
      h.heap_size == 0) {
    return Corrupt(
        where, absl::StrCat("heap at ", h.heap_offset, " of ", h.heap_size,
                            " bytes is not 2 MiB aligned after the directory (ends at ", dir_end,
                            ") and running to the end of the pool (", h.pool_size, ")"));
  }
  if (strnlen(h.name, sizeof(h.name)) == sizeof(h.name)) {
    return Corrupt(where, "pool name is not NUL-terminated");
  }
  if (!AllZero(h.reserved, sizeof(h.reserved))) {
    return Corrupt(where, "reserved header bytes are not zero");
  }
  return absl::OkStatus();
}

Pool::Pool(PoolUri uri, std::unique_ptr<MemoryBackend> backend,
           std::unique_ptr<Coherence> coherence, const PoolHeaderLayout& header)
    : uri_(std::move(uri)),
      identity_(uri_.Identity()),
      backend_(std::move(backend)),
      coherence_(std::move(coherence)),
      header_(header),
      devices_(header.pool_size, (header.flags & kHeaderFlagDevices) ? header.device_count : 1) {}

Pool::~Pool() = default;

namespace {
std::mutex g_model_mu;
AccessModelFactory g_model_factory = nullptr;  // guarded by g_model_mu
}  // namespace

void RegisterAccessModelFactory(AccessModelFactory factory) {
  std::lock_guard<std::mutex> lock(g_model_mu);
  g_model_factory = factory;
}

absl::Status Pool::ApplyModel() {
  if (!uri_.HasModel()) return absl::OkStatus();
  AccessModelFactory factory;
  {
    std::lock_guard<std::mutex> lock(g_model_mu);
    factory = g_model_factory;
  }
  if (factory == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        uri_.ToString(), " asks for a latency/bandwidth model, but no emulation layer is linked"));
  }
  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<AccessModel> model, factory(uri_, devices_));
  coherence_->SetModel(std::move(model));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Pool>> Pool::Create(absl::string_view uri_text) {
  CXLRT_RETURN_IF_ERROR(ConfigStatus());
  CXLRT_ASSIGN_OR_RETURN(PoolUri uri, ParsePoolUri(uri_text));
  CXLRT_ASSIGN_OR_RETURN(const BackendProvider* provider, FindBackendProvider(uri.scheme));
  if (!uri.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "creating ", uri.Identity(), " needs a size (e.g. ", uri.Identity(), "?size=1G)"));
  }
  const uint64_t size = *uri.size;
  if (size < kMinPoolSize || size % provider->size_alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool size ", FormatBytes(size), " must be at least ", FormatBytes(kMinPoolSize),
        " and a multiple of ", FormatBytes(provider->size_alignment)));
  }
  const CoherenceDomain domain = uri.CoherenceOrDefault();
  // Fail before making anything when the domain is not available.
  if (auto probe = MakeCoherence(domain, nullptr, 0); !probe.ok()) return probe.status();

  const uint32_t hosts = uri.hosts.value_or(kDefaultHostSlots);
  const Layout layout = ComputeLayout(hosts, kDefaultDirectoryEntries);
  // The largest tables end below 2 MiB, so a pool of kMinPoolSize always
  // has a heap.
  static_assert(kHeaderRegionSize + kMaxHostSlots * sizeof(HostSlotLayout) + 4096 +
                    kDefaultDirectoryEntries * sizeof(RegionEntryLayout) <=
                kHeapAlignment);
  static_assert(kMinPoolSize >= 2 * kHeapAlignment);

  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBackend> backend, provider->create(uri, size));
  const uint64_t backing = backend->size();
  auto coherence = MakeCoherence(domain, backend->base(), backing);
  if (!coherence.ok()) return coherence.status();
  Coherence& c = **coherence;

  // A dax device keeps whatever it held: never format over a pool.
  PoolHeaderLayout existing;
  c.Fetch(&existing, 0, sizeof(existing));
  if (existing.magic == kPoolMagic) {
    return absl::AlreadyExistsError(absl::StrCat(uri.Identity(),
                                                 " already holds a pool; destroy "
                                                 "it first"));
  }

  // The tables before the heap get their memory now; the heap's segments
  // as the allocator claims them (MemoryBackend::Reserve).
  CXLRT_RETURN_IF_ERROR(backend->Reserve(0, layout.heap_offset));
  // Metadata must read as zero (empty slots, empty directory); a fresh file
  // is, a device may not be.
  static const uint8_t kZeros[64 * 1024] = {};
  for (uint64_t off = 0; off < layout.heap_offset; off += sizeof(kZeros)) {
    c.CopyToPool(off, kZeros, std::min<uint64_t>(sizeof(kZeros), layout.heap_offset - off));
  }

  PoolHeaderLayout h = {};
  h.magic = kPoolMagic;
  h.format_version = kPoolFormatVersion;
  h.header_size = sizeof(PoolHeaderLayout);
  h.pool_size = size;
  h.creation_id = RandomId();
  h.created_unix_ns = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  h.coherence_domain = static_cast<uint32_t>(domain);
  h.host_table_offset = layout.host_table_offset;
  h.host_slot_count = hosts;
  h.host_slot_size = sizeof(HostSlotLayout);
  h.directory_offset = layout.directory_offset;
  h.directory_entry_count = kDefaultDirectoryEntries;
  h.directory_entry_size = sizeof(RegionEntryLayout);
  h.heap_offset = layout.heap_offset;
  h.heap_size = size - layout.heap_offset;
  if (const auto& devs = backend->info().devices; devs.size() > 1) {
    h.flags |= kHeaderFlagDevices;
    h.device_count = static_cast<uint32_t>(devs.size());
    h.device_size = devs[0].size;
  }
  std::string pool_name = uri.scheme == PoolScheme::kEmu ? uri.name : uri.Identity();
  std::memcpy(h.name, pool_name.data(), std::min(pool_name.size(), sizeof(h.name) - 1));
  h.checksum = HeaderChecksum(h);
  // Body first, magic last: a crash in between leaves magic 0, which Open
  // reports as an unfinished creation.
  PoolHeaderLayout body = h;
  body.magic = 0;
  c.Publish(0, &body, sizeof(body));
  CXLRT_FAULT_POINT_AFTER_WRITE("pool.create.before_magic", &c, 0, sizeof(body));
  c.Publish(0, &h.magic, sizeof(h.magic));
  CXLRT_LOG(kInfo) << "created " << uri.Identity() << " (" << FormatBytes(size) << ", "
                   << CoherenceDomainName(domain) << ", " << hosts << " host slots)";
  std::unique_ptr<Pool> pool(
      new Pool(std::move(uri), std::move(backend), std::move(*coherence), h));
  CXLRT_RETURN_IF_ERROR(pool->ApplyModel());
  return pool;
}

absl::StatusOr<std::unique_ptr<Pool>> Pool::Open(absl::string_view uri_text) {
  CXLRT_RETURN_IF_ERROR(ConfigStatus());
  CXLRT_ASSIGN_OR_RETURN(PoolUri uri, ParsePoolUri(uri_text));
  CXLRT_ASSIGN_OR_RETURN(const BackendProvider* provider, FindBackendProvider(uri.scheme));
  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBackend> backend, provider->open(uri));
  const std::string where = uri.Identity();
  const uint64_t backing = backend->size();
  if (backing < sizeof(PoolHeaderLayout)) {
    return Corrupt(where, absl::StrCat("its backing ", backend->info().path, " holds ", backing,
                                       " bytes, too few for a pool header (truncated?)"));
  }
  // The domain is in the header, so read the header the safe way: drop any
  // cached copy first (correct in every domain).
  InvalidateLines(backend->base(), sizeof(PoolHeaderLayout));
  __builtin_ia32_mfence();
  PoolHeaderLayout h;
  std::memcpy(&h, backend->base(), sizeof(h));
  CXLRT_RETURN_IF_ERROR(ValidateHeader(h, backing, where));

  const CoherenceDomain domain = static_cast<CoherenceDomain>(h.coherence_domain);
  if (uri.size && *uri.size != h.pool_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", FormatBytes(h.pool_size),
                     " but the URI says size=", FormatBytes(*uri.size)));
  }
  if (uri.coherence && *uri.coherence != domain) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " was created with coherence=", CoherenceDomainName(domain),
                     " but the URI says coherence=", CoherenceDomainName(*uri.coherence)));
  }
  if (uri.hosts && *uri.hosts != h.host_slot_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has ", h.host_slot_count, " host slots but the URI says hosts=", *uri.hosts));
  }
  const uint32_t header_devices = (h.flags & kHeaderFlagDevices) ? h.device_count : 1;
  const size_t backing_devices = std::max<size_t>(1, backend->info().devices.size());
  if (backing_devices != header_devices) {
    return Corrupt(where,
                   absl::StrCat("the header says ", header_devices, " devices but the backing has ",
                                backing_devices, " (a device's backing is missing or extra)"));
  }
  for (const BackendDevice& d : backend->info().devices) {
    if (d.size != h.device_size) {
      return Corrupt(where, absl::StrCat("device backing ", d.path, " holds ", d.size,
                                         " bytes but the header says ", h.device_size));
    }
  }
  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<Coherence> coherence,
                         MakeCoherence(domain, backend->base(), backing));
  std::unique_ptr<Pool> pool(new Pool(std::move(uri), std::move(backend), std::move(coherence), h));
  CXLRT_RETURN_IF_ERROR(pool->Check());
  CXLRT_RETURN_IF_ERROR(pool->ApplyModel());
  return pool;
}

uint64_t MachineId() {
  static const uint64_t id = [] {
    // Every read has a fallback: an identity is never missing, only less
    // specific.
    auto first_line = [](const char* path, const char* fallback) {
      std::string out = fallback;
      if (FILE* f = std::fopen(path, "r")) {
        char buf[128] = {};
        if (std::fgets(buf, sizeof(buf), f)) out = buf;
        std::fclose(f);
      }
      return out;
    };
    std::string boot = first_line("/proc/sys/kernel/random/boot_id", "no-boot-id");
    // Tests stand in for a reboot (docs/membership.md, "Reboots").
    if (kTestBootId.IsSet()) boot = kTestBootId.Get();
    const std::string machine = first_line("/etc/machine-id", "no-machine-id");
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
    // High half: the machine (its installation's id and full host name),
    // the same across reboots. Low half: this boot of it. Two CRC-32Cs of
    // different seeds, so that two kernels of one pool collide with
    // probability 2^-64 per pair, not by name.
    const std::string who = absl::StrCat(machine, "/", host);
    const std::string when = absl::StrCat(boot, "/", host);
    const uint64_t id = uint64_t{Crc32c(who.data(), who.size())} << 32 |
                        Crc32c(when.data(), when.size(), 0x9e3779b9u);
    return id == 0 ? 1 : id;
  }();
  return id;
}

absl::Status Pool::Destroy(absl::string_view uri_text, const DestroyOptions& options) {
  CXLRT_ASSIGN_OR_RETURN(PoolUri uri, ParsePoolUri(uri_text));
  CXLRT_ASSIGN_OR_RETURN(const BackendProvider* provider, FindBackendProvider(uri.scheme));
  if (!options.force) {
    PoolUri plain = uri;  // creation parameters would only be checked against the pool
    plain.size.reset();
    plain.coherence.reset();
    plain.hosts.reset();
    auto pool = Open(plain.ToString());
    if (pool.ok()) {
      // A host is alive when its heartbeat moves within two of its periods.
      std::map<uint32_t, HostRecord> attached;
      uint32_t longest_ms = 0;
      for (uint32_t i = 0; i < (*pool)->host_slots(); ++i) {
        auto r = (*pool)->ReadHost(i);
        if (r.ok() && r->state == SlotState::kAttached && r->owner_current) {
          attached[i] = *r;
          longest_ms = std::max(longest_ms, r->heartbeat_ms);
        }
      }
      if (!attached.empty()) {
        // heartbeat_ms comes from the pool: clamped, so that a corrupt line
        // cannot make destroy sleep for days (issue 13, defect 10).
        absl::SleepFor(
            absl::Milliseconds(std::max(3 * std::min(longest_ms, kMaxSampledHeartbeatMs), 250u)));
        std::vector<std::string> live;
        for (const auto& [i, before] : attached) {
          auto r = (*pool)->ReadHost(i);
          if (r.ok() && r->owner_current && r->heartbeat != before.heartbeat) {
            live.push_back(absl::StrCat("slot ", i, " pid ", r->pid, " on ", r->hostname));
          }
        }
        if (!live.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(uri.Identity(), " has live hosts (",
                                                            absl::StrJoin(live, ", "),
                                                            "); detach them first, or force"));
        }
      }
    } else if (pool.status().code() == absl::StatusCode::kNotFound ||
               pool.status().code() == absl::StatusCode::kPermissionDenied) {
      return pool.status();
    }
    // A corrupt pool may always be destroyed.
  }
  return provider->destroy(uri);
}

PoolOffset Pool::OwnerLineOffset(uint32_t i) const {
  return header_.host_table_offset + uint64_t{i} * sizeof(HostSlotLayout) +
         offsetof(HostSlotLayout, owner);
}
PoolOffset Pool::ControlLineOffset(uint32_t i) const {
  return header_.host_table_offset + uint64_t{i} * sizeof(HostSlotLayout) +
         offsetof(HostSlotLayout, control);
}
PoolOffset Pool::BakeryLineOffset(uint32_t i) const {
  return header_.host_table_offset + uint64_t{i} * sizeof(HostSlotLayout) +
         offsetof(HostSlotLayout, bakery);
}
PoolOffset Pool::DirectoryEntryOffset(uint32_t i) const {
  return header_.directory_offset + uint64_t{i} * sizeof(RegionEntryLayout);
}

absl::StatusOr<HostRecord> Pool::ReadHost(uint32_t i) const {
  if (i >= host_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host slot ", i, " is out of range (", name(), " has ", host_slots(), ")"));
  }
  HostRecord r;
  r.slot = i;
  HostControlLineLayout control;
  bool zero = false;
  if (!ReadRecord(*coherence_, ControlLineOffset(i), &control, ControlLineChecksum, &zero)) {
    return Corrupt(name(), absl::StrCat("host slot ", i, " control line checksum is 0x",
                                        absl::Hex(control.checksum), ", its bytes sum to 0x",
                                        absl::Hex(ControlLineChecksum(control))));
  }
  if (zero) return r;  // never used
  if (control.state > static_cast<uint32_t>(SlotState::kFenced)) {
    return Corrupt(name(), absl::StrCat("host slot ", i, " has state ", control.state,
                                        " (expected 0 free, 1 attached, 2 fenced)"));
  }
  r.state = static_cast<SlotState>(control.state);
  r.epoch = control.epoch;
  r.changed_by = control.changed_by;
  r.owner_pid = control.owner_pid;

  HostOwnerLineLayout owner;
  bool owner_zero = false;
  if (ReadRecord(*coherence_, OwnerLineOffset(i), &owner, OwnerLineChecksum, &owner_zero) &&
      !owner_zero && owner.epoch == control.epoch) {
    r.owner_current = true;
    r.heartbeat = owner.heartbeat;
    r.pid = owner.pid;
    r.lease_ms = owner.lease_ms;
    r.heartbeat_ms = owner.heartbeat_ms;
    r.attach_unix_ns = owner.attach_unix_ns;
    r.machine = owner.machine;
    r.hostname = SafeString(owner.hostname, sizeof(owner.hostname));
  }
  return r;
}

absl::StatusOr<std::vector<RegionInfo>> Pool::ListRegions() const {
  std::vector<RegionInfo> out;
  for (uint32_t i = 0; i < header_.directory_entry_count; ++i) {
    RegionEntryLayout e;
    bool zero = false;
    if (!ReadRecord(*coherence_, DirectoryEntryOffset(i), &e, RegionEntryChecksum, &zero)) {
      return Corrupt(name(), absl::StrCat("region directory entry ", i, " checksum mismatch"));
    }
    if (zero || e.state != static_cast<uint32_t>(RegionState::kLive)) continue;
    out.push_back(RegionInfo{i, SafeString(e.name, sizeof(e.name)), e.offset, e.size, e.owner_host,
                             e.generation});
  }
  return out;
}

absl::StatusOr<uint32_t> Pool::CreateRegion(absl::string_view name, PoolOffset offset,
                                            uint64_t size, uint32_t owner_host) {
  RegionEntryLayout e = {};
  if (name.empty() || name.size() >= sizeof(e.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("region name '", name, "' must be 1-", sizeof(e.name) - 1, " bytes"));
  }
  // Names are read back as printable ASCII (SafeString): a name with other
  // bytes would never be found again, and each try to make it would add an
  // entry of the same name.
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("region name '", SafeString(name.data(), name.size()), "' holds byte 0x",
                       absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2),
                       ": names are printable ASCII (0x20-0x7e)"));
    }
  }
  if (size == 0 || offset < header_.heap_offset || offset > header_.pool_size ||
      size > header_.pool_size - offset || offset % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("region '", name, "' [", offset, ", +", size,
                                                   ") is not a 64 B aligned range of the heap"));
  }
  std::optional<uint32_t> slot;
  uint64_t generation = 0;
  for (uint32_t i = 0; i < header_.directory_entry_count; ++i) {
    RegionEntryLayout cur;
    bool zero = false;
    if (!ReadRecord(*coherence_, DirectoryEntryOffset(i), &cur, RegionEntryChecksum, &zero)) {
      return Corrupt(identity_, absl::StrCat("region directory entry ", i, " checksum mismatch"));
    }
    const bool live = !zero && cur.state == static_cast<uint32_t>(RegionState::kLive);
    if (live && SafeString(cur.name, sizeof(cur.name)) == name) {
      return absl::AlreadyExistsError(
          absl::StrCat("a region named '", name, "' already exists in ", identity_));
    }
    if (!live && !slot) {
      slot = i;
      generation = zero ? 0 : cur.generation;
    }
  }
  if (!slot) {
    return absl::ResourceExhaustedError(absl::StrCat("the region directory of ", identity_,
                                                     " is full (", header_.directory_entry_count,
                                                     " entries)"));
  }
  e.generation = generation + 1;
  e.state = static_cast<uint32_t>(RegionState::kLive);
  e.owner_host = owner_host;
  e.offset = offset;
  e.size = size;
  std::memcpy(e.name, name.data(), name.size());
  e.checksum = RegionEntryChecksum(e);
  coherence_->PublishObject(DirectoryEntryOffset(*slot), e);
  return *slot;
}

absl::Status Pool::DeleteRegion(uint32_t index) {
  if (index >= header_.directory_entry_count) {
    return absl::InvalidArgumentError(absl::StrCat("region index ", index, " out of range"));
  }
  RegionEntryLayout e;
  bool zero = false;
  if (!ReadRecord(*coherence_, DirectoryEntryOffset(index), &e, RegionEntryChecksum, &zero)) {
    return Corrupt(identity_, absl::StrCat("region directory entry ", index, " checksum mismatch"));
  }
  if (zero || e.state != static_cast<uint32_t>(RegionState::kLive)) {
    return absl::NotFoundError(absl::StrCat("region directory entry ", index, " is not live"));
  }
  e.generation += 1;
  e.state = static_cast<uint32_t>(RegionState::kEmpty);
  e.checksum = RegionEntryChecksum(e);
  coherence_->PublishObject(DirectoryEntryOffset(index), e);
  return absl::OkStatus();
}

absl::StatusOr<RegionInfo> Pool::FindRegion(absl::string_view name) const {
  CXLRT_ASSIGN_OR_RETURN(std::vector<RegionInfo> regions, ListRegions());
  for (const RegionInfo& r : regions) {
    if (r.name != name) continue;
    if (r.offset < header_.heap_offset || r.offset > header_.pool_size ||
        r.size > header_.pool_size - r.offset || r.size == 0) {
      return Corrupt(identity_, absl::StrCat("region '", name, "' [", r.offset, ", +", r.size,
                                             ") lies outside the heap"));
    }
    return r;
  }
  return absl::NotFoundError(absl::StrCat("no region named '", name, "' in ", identity_));
}

absl::Status Pool::Check(std::vector<std::string>* problems_out) const {
  std::vector<std::string> problems;
  // The header again: it must not have changed since Open.
  PoolHeaderLayout h;
  coherence_->Fetch(&h, 0, sizeof(h));
  if (auto s = ValidateHeader(h, backend_->size(), name()); !s.ok()) {
    problems.emplace_back(s.message());
  } else if (std::memcmp(&h, &header_, sizeof(h)) != 0) {
    problems.push_back("the header changed after the pool was opened");
  }

  for (uint32_t i = 0; i < host_slots(); ++i) {
    // The owner line first: an attach writes the control line's epoch
    // before the owner line's, so on a live pool an owner line read earlier
    // never names a later epoch than the control line read after it.
    HostOwnerLineLayout owner;
    bool zero = false;
    const bool owner_ok =
        ReadRecord(*coherence_, OwnerLineOffset(i), &owner, OwnerLineChecksum, &zero);
    CXLRT_FAULT_POINT("pool.check.between_lines");
    auto r = ReadHost(i);
    if (!r.ok()) {
      problems.emplace_back(r.status().message());
      continue;
    }
    if (r->state != SlotState::kFree && r->epoch == 0) {
      problems.push_back(absl::StrCat("host slot ", i, " is in use at epoch 0"));
    }
    if (r->changed_by >= host_slots()) {
      problems.push_back(absl::StrCat("host slot ", i, " was last changed by slot ", r->changed_by,
                                      ", which does not exist"));
    }
    if (!owner_ok) {
      if (r->state == SlotState::kAttached) {
        problems.push_back(absl::StrCat("host slot ", i,
                                        " is attached but its owner line "
                                        "checksum does not match"));
      }
    } else if (!zero && owner.epoch > r->epoch) {
      problems.push_back(absl::StrCat("host slot ", i, " owner line claims epoch ", owner.epoch,
                                      " beyond the slot's epoch ", r->epoch));
    } else if (!zero &&
               (owner.lease_ms < kMinLeaseMs || owner.lease_ms > kMaxLeaseMs ||
                owner.heartbeat_ms < kMinHeartbeatMs || owner.heartbeat_ms > kMaxHeartbeatMs)) {
      problems.push_back(absl::StrCat("host slot ", i, " owner line has lease_ms ", owner.lease_ms,
                                      " and heartbeat_ms ", owner.heartbeat_ms, " (allowed: [",
                                      kMinLeaseMs, ", ", kMaxLeaseMs, "] and [", kMinHeartbeatMs,
                                      ", ", kMaxHeartbeatMs, "])"));
    }
  }

  struct Span {
    uint64_t offset, size;
    uint32_t index;
  };
  std::vector<Span> spans;
  std::map<std::string, uint32_t> names;
  for (uint32_t i = 0; i < header_.directory_entry_count; ++i) {
    RegionEntryLayout e;
    bool zero = false;
    if (!ReadRecord(*coherence_, DirectoryEntryOffset(i), &e, RegionEntryChecksum, &zero)) {
      problems.push_back(absl::StrCat("region directory entry ", i, " checksum is 0x",
                                      absl::Hex(e.checksum), ", its bytes sum to 0x",
                                      absl::Hex(RegionEntryChecksum(e))));
      continue;
    }
    if (zero) continue;
    if (e.state > static_cast<uint32_t>(RegionState::kLive)) {
      problems.push_back(absl::StrCat("region directory entry ", i, " has state ", e.state));
      continue;
    }
    if (e.state != static_cast<uint32_t>(RegionState::kLive)) continue;
    std::string label = absl::StrCat("region directory entry ", i);
    size_t name_len = strnlen(e.name, sizeof(e.name));
    if (name_len == 0 || name_len == sizeof(e.name)) {
      problems.push_back(absl::StrCat(label, " has an empty or unterminated name"));
      continue;
    }
    std::string region = SafeString(e.name, sizeof(e.name));
    label = absl::StrCat(label, " ('", region, "')");
    if (e.size == 0 || e.offset < header_.heap_offset || e.offset % kCacheLine != 0 ||
        e.offset > size() || e.size > size() - e.offset) {
      problems.push_back(absl::StrCat(label, " spans [", e.offset, ", +", e.size,
                                      ") which is not a 64 B aligned non-empty range of the heap [",
                                      header_.heap_offset, ", ", size(), ")"));
      continue;
    }
    if (e.owner_host >= host_slots()) {
      problems.push_back(
          absl::StrCat(label, " is owned by host slot ", e.owner_host, ", which does not exist"));
    }
    if (auto [it, fresh] = names.emplace(region, i); !fresh) {
      problems.push_back(absl::StrCat(label, " repeats the name of entry ", it->second));
    }
    spans.push_back({e.offset, e.size, i});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.offset < b.offset; });
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].offset < spans[k - 1].offset + spans[k - 1].size) {
      problems.push_back(absl::StrCat("region directory entries ", spans[k - 1].index, " and ",
                                      spans[k].index, " overlap"));
    }
  }

  if (problems_out != nullptr) {
    problems_out->insert(problems_out->end(), problems.begin(), problems.end());
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "pool ", name(), " is corrupt (", problems.size(),
      problems.size() == 1 ? " problem): " : " problems): ", absl::StrJoin(problems, "; ")));
}

}  // namespace cxlrt::runtime
