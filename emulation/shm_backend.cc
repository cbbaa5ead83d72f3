#include "emulation/shm_backend.h"

#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/log.h"
#include "runtime/memory_backend.h"
#include "runtime/topology.h"
#include "runtime/units.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxlrt::emulation {
namespace {

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

absl::StatusOr<std::unique_ptr<MemoryBackend>> Map(int fd, uint64_t size, BackendInfo info,
                                                   bool creating, int bind_node) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot map ", FormatBytes(size), " of ", info.path));
  }
  auto* base = static_cast<uint8_t*>(p);
  if (creating) {
    // Policy first, pages second: mbind on a shared mapping sets the file's
    // shared policy, which fallocate below allocates under.
    if (bind_node >= 0) {
      unsigned long mask[16] = {};
      mask[bind_node / 64] |= 1ul << (bind_node % 64);
      if (mbind(base, size, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
        CXLRT_LOG(kWarning) << "mbind to node " << bind_node << " failed (" << strerror(errno)
                            << "); pages of " << info.path << " are not bound";
        info.placement += " (binding failed; pages unbound)";
        info.numa_node = -1;
      }
    }
    // Huge pages where the kernel allows them for shmem (often "never").
    info.huge_pages = madvise(base, size, MADV_HUGEPAGE) == 0;
    if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
      munmap(base, size);
      close(fd);
      return ErrnoStatus(rc, absl::StrCat("cannot reserve ", FormatBytes(size), " for ", info.path,
                                          " (is the filesystem full?)"));
    }
  }
  Prefault(base, size);
  if (!creating || info.numa_node >= 0) {
    int actual = NodeOfPage(base);
    if (actual >= 0) info.numa_node = actual;
  }
  return std::unique_ptr<MemoryBackend>(
      new runtime::MappedFileBackend(fd, base, size, std::move(info)));
}

BackendInfo BaseInfo(const PoolUri& uri) {
  BackendInfo info;
  info.kind = "emulated (shared file)";
  info.path = ShmPoolPath(uri);
  info.alignment = 4096;
  info.granularity = "cache line (coherence layer)";
  return info;
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateShm(const PoolUri& uri, uint64_t size) {
  BackendInfo info = BaseInfo(uri);
  const bool numa = numa_available() >= 0;
  auto choice = runtime::ChooseEmulationNode(
      numa ? runtime::ReadNumaNodes() : std::vector<runtime::NumaNode>{}, uri.node,
      runtime::CurrentNode());
  if (!choice.ok()) return choice.status();
  info.numa_node = choice->node;
  info.placement = choice->reason;

  const mode_t mode = uri.mode.value_or(0600);
  int fd = open(info.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("pool ", uri.Identity(), " already exists (", info.path, ")"));
    }
    return ErrnoStatus(errno, absl::StrCat("cannot create ", info.path));
  }
  fchmod(fd, mode);  // exactly the mode asked for, whatever the umask
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    close(fd);
    unlink(info.path.c_str());
    return ErrnoStatus(err, absl::StrCat("cannot size ", info.path, " to ", FormatBytes(size)));
  }
  auto backend = Map(fd, size, std::move(info), /*creating=*/true, choice->node);
  if (!backend.ok()) unlink(ShmPoolPath(uri).c_str());  // nothing was in it yet
  return backend;
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> OpenShm(const PoolUri& uri) {
  BackendInfo info = BaseInfo(uri);
  int fd = open(info.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no pool ", uri.Identity(), " (no file ", info.path, ")"));
    }
    return ErrnoStatus(errno, absl::StrCat("cannot open pool ", uri.Identity(), " (", info.path,
                                           ") for read and write"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", info.path));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(info.path, " is not a regular file"));
  }
  if (st.st_size < 4096) {
    close(fd);
    return absl::DataLossError(absl::StrCat("pool ", uri.Identity(), " is corrupt: its file ",
                                            info.path, " holds ", st.st_size,
                                            " bytes, too few for a pool header (truncated?)"));
  }
  info.placement = "as bound at creation";
  return Map(fd, static_cast<uint64_t>(st.st_size), std::move(info), /*creating=*/false, -1);
}

absl::Status DestroyShm(const PoolUri& uri) {
  const std::string path = ShmPoolPath(uri);
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no pool ", uri.Identity(), " (no file ", path, ")"));
    }
    return ErrnoStatus(errno, absl::StrCat("cannot remove ", path));
  }
  return absl::OkStatus();
}

const runtime::BackendProvider kShmProvider = {&CreateShm, &OpenShm, &DestroyShm, 2u << 20};

[[maybe_unused]] const bool kRegistered = [] {
  RegisterShmBackend();
  return true;
}();

}  // namespace

std::string ShmPoolPath(const PoolUri& uri) {
  const std::string dir = uri.dir.value_or(runtime::GetConfig().shm_dir);
  return absl::StrCat(dir, "/cxlrt-", uri.name, ".pool");
}

void RegisterShmBackend() {
  runtime::RegisterBackendProvider(runtime::PoolScheme::kEmu, &kShmProvider);
}

}  // namespace cxlrt::emulation
