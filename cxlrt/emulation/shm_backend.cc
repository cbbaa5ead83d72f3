#include "cxlrt/emulation/shm_backend.h"

#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/memory_backend.h"
#include "cxlrt/runtime/pool_layout.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/topology.h"
#include "cxlrt/runtime/units.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlrt::emulation {
namespace {

const runtime::Knob<std::string> kShmDir(
    {"CXLRT_SHM_DIR", "/dev/shm", "Directory of emulated pool files when the URI has no dir=."},
    "/dev/shm", runtime::AnyText());

using runtime::BackendInfo;
using runtime::ErrnoStatus;
using runtime::FormatBytes;
using runtime::MemoryBackend;
using runtime::PoolUri;

// Maps page tables for the whole range now, so that no access later pays a
// page fault. Falls back to touching each page on kernels before 5.14.
void Prefault(uint8_t* base, uint64_t size) {
  if (madvise(base, size, MADV_POPULATE_WRITE) == 0) return;
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < size; off += page) {
    volatile uint8_t* p = base + off;
    *p = *p;
  }
}

int NodeOfPage(void* addr) {
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, addr, MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
}

// Binds (when creating), reserves and (`prefault`) pre-faults one device's
// pages, mapped at `addr` (MAP_FIXED inside the pool's reservation). Returns
// the node the pages are on (-1 unknown) and appends to `placement` when
// binding failed.
absl::StatusOr<int> MapDevice(int fd, uint8_t* addr, uint64_t size, const std::string& path,
                              bool creating, bool lazy, bool prefault, int bind_node, bool* huge,
                              std::string* placement) {
  void* p = mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("cannot map ", FormatBytes(size), " of ", path));
  }
  int node = bind_node;
  if (creating) {
    // Policy first, pages second: mbind on a shared mapping sets the file's
    // shared policy, which fallocate below allocates under.
    if (bind_node >= 0) {
      unsigned long mask[16] = {};
      mask[bind_node / 64] |= 1ul << (bind_node % 64);
      if (mbind(addr, size, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
        CXLRT_LOG(kWarning) << "mbind to node " << bind_node << " failed (" << strerror(errno)
                            << "); pages of " << path << " are not bound";
        *placement += " (binding failed; pages unbound)";
        node = -1;
      }
    }
    // Huge pages where the kernel allows them for shmem (often "never").
    *huge = madvise(addr, size, MADV_HUGEPAGE) == 0;
    if (int rc = lazy ? 0 : posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
      return ErrnoStatus(rc, absl::StrCat("cannot reserve ", FormatBytes(size), " for ", path,
                                          " (is the filesystem full?)"));
    }
  }
  // Without prefault the pages (allocated above at creation, or as the heap
  // grows when lazy) are mapped at first touch: a minor fault each, paid
  // only for the pages used.
  if (prefault) Prefault(addr, size);
  if (!creating || node >= 0) {
    if (int actual = NodeOfPage(addr); actual >= 0) node = actual;
  }
  return node;
}

// True when every byte of the file has memory behind it (a sparse file is
// a pool made with reserve=lazy whose heap has not grown over it yet).
bool FullyReserved(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 &&
         static_cast<uint64_t>(st.st_blocks) * 512 >= static_cast<uint64_t>(st.st_size);
}

// The mapping of a pool's device files, reserving their memory on demand
// (reserve=lazy): Reserve() allocates the files' pages for a range with
// fallocate, which on tmpfs and every disk filesystem is idempotent and
// safe against other processes doing the same.
class ShmBackend : public runtime::MappedFileBackend {
 public:
  // `device_fds`: one descriptor per device file (device 0's is also the
  // base class's); ShmBackend closes the others.
  ShmBackend(std::vector<int> device_fds, uint8_t* base, uint64_t device_size, BackendInfo info,
             std::vector<std::string> paths, bool reserved)
      : MappedFileBackend(device_fds[0], base, device_size * device_fds.size(), std::move(info)),
        fds_(std::move(device_fds)),
        paths_(std::move(paths)),
        device_size_(device_size),
        reserved_(reserved) {}
  ~ShmBackend() override {
    for (size_t d = 1; d < fds_.size(); ++d) close(fds_[d]);
  }

  absl::Status Reserve(uint64_t offset, uint64_t length) override {
    if (reserved_.load(std::memory_order_relaxed)) return absl::OkStatus();
    while (length > 0) {
      const size_t d = offset / device_size_;
      const uint64_t at = offset % device_size_;
      const uint64_t n = std::min(length, device_size_ - at);
      if (int rc = posix_fallocate(fds_[d], static_cast<off_t>(at), static_cast<off_t>(n));
          rc != 0) {
        return ErrnoStatus(
            rc, absl::StrCat("cannot reserve ", FormatBytes(n), " at offset 0x", absl::Hex(at),
                             " of ", paths_[d], " (is the filesystem full?)"));
      }
      offset += n;
      length -= n;
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<int> fds_;
  const std::vector<std::string> paths_;
  const uint64_t device_size_;
  std::atomic<bool> reserved_;  // every file fully reserved: Reserve has nothing to do
};

// The files of a pool's devices, device 0 first.
std::vector<std::string> DevicePaths(const PoolUri& uri, uint32_t count) {
  std::vector<std::string> paths;
  for (uint32_t d = 0; d < count; ++d) paths.push_back(ShmDevicePath(uri, d));
  return paths;
}

// Closes descriptors and unmaps the reservation on every error path.
struct Building {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  std::vector<int> fds;
  std::vector<std::string> created;  // files to remove when creation fails
  bool done = false;
  ~Building() {
    if (done) return;
    if (base) munmap(base, size);
    for (int fd : fds) close(fd);
    for (const std::string& p : created) unlink(p.c_str());
  }
};

BackendInfo BaseInfo(const PoolUri& uri) {
  BackendInfo info;
  info.kind = "emulated (shared file)";
  info.path = ShmPoolPath(uri);
  info.alignment = 4096;
  info.granularity = "cache line (coherence layer)";
  return info;
}

// Maps `paths` (opened in `b.fds`) one after another into one reservation of
// `device_size` * paths.size() bytes and makes the backend.
absl::StatusOr<std::unique_ptr<MemoryBackend>> MapAll(
    Building& b, BackendInfo info, const std::vector<std::string>& paths, uint64_t device_size,
    bool creating, bool lazy, bool prefault, const std::vector<runtime::NodeChoice>& nodes) {
  b.size = device_size * paths.size();
  void* r = mmap(nullptr, b.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("cannot reserve ", FormatBytes(b.size),
                                           " of address space for ", info.path));
  }
  b.base = static_cast<uint8_t*>(r);
  bool all_huge = true;
  for (size_t d = 0; d < paths.size(); ++d) {
    bool huge = false;
    std::string placement;
    CXLRT_ASSIGN_OR_RETURN(
        int node, MapDevice(b.fds[d], b.base + d * device_size, device_size, paths[d], creating,
                            lazy, prefault, creating ? nodes[d].node : -1, &huge, &placement));
    all_huge = all_huge && huge;
    if (d == 0) {
      info.numa_node = node;
      info.placement += placement;
    }
    if (paths.size() > 1) {
      info.devices.push_back({paths[d], node, d * device_size, device_size});
    }
  }
  info.huge_pages = all_huge;
  // Device 0's descriptor also carries the local index locks.
  b.done = true;
  return std::unique_ptr<MemoryBackend>(
      new ShmBackend(b.fds, b.base, device_size, std::move(info), paths, !lazy));
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateShm(const PoolUri& uri, uint64_t size) {
  const uint32_t count = uri.devices.value_or(1);
  if (size % (uint64_t{count} * runtime::kHeapAlignment) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("pool size ", FormatBytes(size),
                                                   " does not split into ", count,
                                                   " devices of a multiple of 2 MiB each"));
  }
  const uint64_t device_size = size / count;
  BackendInfo info = BaseInfo(uri);
  const bool numa = numa_available() >= 0;
  CXLRT_ASSIGN_OR_RETURN(
      std::vector<runtime::NodeChoice> nodes,
      runtime::ChooseDeviceNodes(numa ? runtime::ReadNumaNodes() : std::vector<runtime::NumaNode>{},
                                 uri.node, runtime::CurrentNode(), count));
  info.placement = nodes[0].reason;
  if (count > 1 && nodes[0].node != nodes[count - 1].node) {
    info.placement = absl::StrCat(count, " devices round-robin over the CPU-less nodes");
  }

  const bool lazy = uri.reserve_lazy.value_or(false);
  const mode_t mode = uri.mode.value_or(0600);
  const std::vector<std::string> paths = DevicePaths(uri, count);
  if (lazy) {
    // Memory comes later, but a pool larger than its filesystem could never
    // be filled: refuse it now, as reserve=all does.
    const std::string dir = paths[0].substr(0, paths[0].rfind('/'));
    struct statvfs fs;  // f_blocks 0: a tmpfs without a size limit
    if (statvfs(dir.c_str(), &fs) == 0 && fs.f_blocks != 0 &&
        size > static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", FormatBytes(size), " for ", paths[0], ": the filesystem of ", dir,
          " holds ", FormatBytes(static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize)));
    }
  }
  Building b;
  for (const std::string& path : paths) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
      if (errno == EEXIST) {
        return absl::AlreadyExistsError(
            absl::StrCat("pool ", uri.Identity(), " already exists (", path, ")"));
      }
      return ErrnoStatus(errno, absl::StrCat("cannot create ", path));
    }
    b.fds.push_back(fd);
    b.created.push_back(path);
    fchmod(fd, mode);  // exactly the mode asked for, whatever the umask
    if (ftruncate(fd, static_cast<off_t>(device_size)) != 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("cannot size ", path, " to ", FormatBytes(device_size)));
    }
  }
  // A lazy pool's tables (the first 2 MiB: pool_layout.h) are reserved
  // here, before anything reads or writes them (a touch of a hole on a full
  // filesystem is a SIGBUS) and while a failure still removes the files.
  if (lazy) {
    const uint64_t tables = std::min<uint64_t>(runtime::kHeapAlignment, device_size);
    if (int rc = posix_fallocate(b.fds[0], 0, static_cast<off_t>(tables)); rc != 0) {
      return ErrnoStatus(rc, absl::StrCat("cannot reserve ", FormatBytes(tables), " for ", paths[0],
                                          " (is the filesystem full?)"));
    }
  }
  return MapAll(b, std::move(info), paths, device_size, /*creating=*/true, lazy,
                uri.prefault.value_or(!lazy), nodes);
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> OpenShm(const PoolUri& uri) {
  BackendInfo info = BaseInfo(uri);
  info.placement = "as bound at creation";
  Building b;
  std::vector<std::string> paths;
  uint64_t device_size = 0;
  // Device files are found by name: device 0 is the pool file, the others
  // follow until one is missing. The header says how many there must be.
  for (uint32_t d = 0; d < runtime::kMaxDevices; ++d) {
    const std::string path = ShmDevicePath(uri, d);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT && d > 0) break;
      if (errno == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat("no pool ", uri.Identity(), " (no file ", path, ")"));
      }
      return ErrnoStatus(errno, absl::StrCat("cannot open pool ", uri.Identity(), " (", path,
                                             ") for read and write"));
    }
    b.fds.push_back(fd);
    struct stat st;
    if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat ", path));
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
    }
    const uint64_t bytes = static_cast<uint64_t>(st.st_size);
    if (d == 0 && bytes < 4096) {
      return absl::DataLossError(absl::StrCat("pool ", uri.Identity(), " is corrupt: its file ",
                                              path, " holds ", bytes,
                                              " bytes, too few for a pool header (truncated?)"));
    }
    if (d == 0) device_size = bytes;
    if (bytes != device_size || bytes % 4096 != 0) {
      return absl::DataLossError(absl::StrCat("pool ", uri.Identity(), " is corrupt: device file ",
                                              path, " holds ", bytes, " bytes but device 0 holds ",
                                              device_size));
    }
    paths.push_back(path);
  }
  // A pool made with reserve=lazy is not pre-faulted: that would reserve
  // every page at once.
  bool lazy = false;
  for (int fd : b.fds) lazy = lazy || !FullyReserved(fd);
  return MapAll(b, std::move(info), paths, device_size, /*creating=*/false, lazy,
                uri.prefault.value_or(true) && !lazy, {});
}

absl::Status DestroyShm(const PoolUri& uri) {
  const std::string path = ShmPoolPath(uri);
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no pool ", uri.Identity(), " (no file ", path, ")"));
    }
    return ErrnoStatus(errno, absl::StrCat("cannot remove ", path));
  }
  for (uint32_t d = 1; d < runtime::kMaxDevices; ++d) {
    if (unlink(ShmDevicePath(uri, d).c_str()) != 0 && errno == ENOENT) break;
  }
  unlink(ShmModelPath(uri).c_str());
  return absl::OkStatus();
}

const runtime::BackendProvider kShmProvider = {&CreateShm, &OpenShm, &DestroyShm, 2u << 20};

[[maybe_unused]] const bool kRegistered = [] {
  RegisterShmBackend();
  return true;
}();

}  // namespace

std::string ShmPoolPath(const PoolUri& uri) { return ShmDevicePath(uri, 0); }

std::string ShmDevicePath(const PoolUri& uri, uint32_t device) {
  const std::string dir = uri.dir.value_or(kShmDir.Get());
  if (device == 0) return absl::StrCat(dir, "/cxlrt-", uri.name, ".pool");
  return absl::StrCat(dir, "/cxlrt-", uri.name, ".dev", device, ".pool");
}

std::string ShmModelPath(const PoolUri& uri) {
  const std::string dir = uri.dir.value_or(kShmDir.Get());
  return absl::StrCat(dir, "/cxlrt-", uri.name, ".model");
}

void RegisterShmBackend() {
  runtime::RegisterBackendProvider(runtime::PoolScheme::kEmu, &kShmProvider);
}

}  // namespace cxlrt::emulation
