#include "cxlrt/runtime/memory_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cxlrt::runtime {
namespace {

// OFD locks on bytes past any real file size: they never interact with IO.
constexpr off_t kLocalIndexLockBase = off_t{1} << 40;

std::mutex g_registry_mu;
std::array<const BackendProvider*, 2> g_registry{};

}  // namespace

void RegisterBackendProvider(PoolScheme scheme, const BackendProvider* provider) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_registry[static_cast<int>(scheme)] = provider;
}

absl::StatusOr<const BackendProvider*> FindBackendProvider(PoolScheme scheme) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  const BackendProvider* p = g_registry[static_cast<int>(scheme)];
  if (p == nullptr && scheme == PoolScheme::kDax) p = DaxBackendProvider();
  if (p == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no memory backend for ", scheme == PoolScheme::kEmu ? "emu" : "dax",
                     ":// is linked into this program (link cxlrt::cxlrt)"));
  }
  return p;
}

MappedFileBackend::MappedFileBackend(int fd, uint8_t* base, uint64_t size, BackendInfo info,
                                     bool owns_mapping)
    : fd_(fd), base_(base), owns_mapping_(owns_mapping), size_(size), info_(std::move(info)) {}

MappedFileBackend::~MappedFileBackend() {
  if (owns_mapping_ && base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);  // drops every OFD lock this open holds
}

absl::StatusOr<bool> MappedFileBackend::TryLockLocalIndex(uint32_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (locked_.count(i)) return false;
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kLocalIndexLockBase + i;
  fl.l_len = 1;
  if (fcntl(fd_, F_OFD_SETLK, &fl) != 0) {
    if (errno == EAGAIN || errno == EACCES) return false;
    return ErrnoStatus(errno, absl::StrCat("locking host index ", i, " on ", info_.path));
  }
  locked_.insert(i);
  return true;
}

void MappedFileBackend::UnlockLocalIndex(uint32_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!locked_.erase(i)) return;
  struct flock fl = {};
  fl.l_type = F_UNLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kLocalIndexLockBase + i;
  fl.l_len = 1;
  fcntl(fd_, F_OFD_SETLK, &fl);
}

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", absl::string_view(std::strerror(err)));
  switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cxlrt::runtime
