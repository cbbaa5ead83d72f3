#include "cxlrt/runtime/dax_backend.h"

#include <fcntl.h>
#include <libpmem2.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/memory_backend.h"
#include "cxlrt/runtime/pool_layout.h"
#include "cxlrt/runtime/units.h"

namespace cxlrt::runtime {
namespace {

std::string Pmem2Error() {
  const char* m = pmem2_errormsg();
  return m && *m ? m : "unknown libpmem2 error";
}

const char* GranularityName(pmem2_granularity g) {
  switch (g) {
    case PMEM2_GRANULARITY_BYTE:
      return "byte";
    case PMEM2_GRANULARITY_CACHE_LINE:
      return "cache line";
    case PMEM2_GRANULARITY_PAGE:
      return "page";
  }
  return "unknown";
}

class DaxBackend : public MappedFileBackend {
 public:
  DaxBackend(int fd, pmem2_map* map, BackendInfo info)
      : MappedFileBackend(fd, static_cast<uint8_t*>(pmem2_map_get_address(map)),
                          pmem2_map_get_size(map), std::move(info), /*owns_mapping=*/false),
        map_(map) {}
  ~DaxBackend() override { pmem2_map_delete(&map_); }

 private:
  pmem2_map* map_;
};

// Maps the device. `size`: nullopt maps the whole device (or what its header
// says, for Open the pool layer checks the rest).
absl::StatusOr<std::unique_ptr<MemoryBackend>> MapDax(const PoolUri& uri,
                                                      std::optional<uint64_t> size) {
  if (auto s = CheckDaxDevice(uri.name); !s.ok()) return s;
  int fd = open(uri.name.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", uri.name, " for read/write"));
  pmem2_source* src = nullptr;
  if (pmem2_source_from_fd(&src, fd) != 0) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("libpmem2 refuses ", uri.name, ": ", Pmem2Error()));
  }
  size_t device_size = 0, alignment = 0;
  pmem2_source_size(src, &device_size);
  pmem2_source_alignment(src, &alignment);
  auto mapped = ValidateDaxSize(size, device_size, alignment, uri.name);
  if (!mapped.ok()) {
    pmem2_source_delete(&src);
    close(fd);
    return mapped.status();
  }
  pmem2_config* cfg = nullptr;
  pmem2_map* map = nullptr;
  int rc = pmem2_config_new(&cfg);
  if (rc == 0) rc = pmem2_config_set_required_store_granularity(cfg, PMEM2_GRANULARITY_PAGE);
  if (rc == 0) rc = pmem2_config_set_length(cfg, *mapped);
  if (rc == 0) rc = pmem2_map_new(&map, cfg, src);
  std::string err = rc == 0 ? "" : Pmem2Error();
  if (cfg) pmem2_config_delete(&cfg);
  pmem2_source_delete(&src);
  if (rc != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("cannot map ", uri.name, ": ", err));
  }
  BackendInfo info;
  info.kind = "device-DAX";
  info.path = uri.name;
  info.alignment = alignment;
  info.huge_pages = alignment >= (2u << 20);
  info.granularity = GranularityName(pmem2_map_get_store_granularity(map));
  info.placement = "the device's own memory";
  return std::unique_ptr<MemoryBackend>(new DaxBackend(fd, map, std::move(info)));
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateDax(const PoolUri& uri, uint64_t size) {
  return MapDax(uri, size);
}

// A pool smaller than its device (dax:///dev/dax0.0?size=32M) records its size
// in the header; Open maps just that much, as Create did, since the pool layer
// requires header size == backing size. Device-DAX has no read(), so the
// header is read through a first mapping of the whole device.
absl::StatusOr<std::unique_ptr<MemoryBackend>> OpenDax(const PoolUri& uri) {
  auto whole = MapDax(uri, std::nullopt);
  if (!whole.ok()) return whole;
  const auto* h = reinterpret_cast<const volatile PoolHeaderLayout*>((*whole)->base());
  const uint64_t size = DaxOpenSize(h->pool_size, (*whole)->size(), (*whole)->info().alignment);
  if (size == (*whole)->size()) return whole;
  whole->reset();
  return MapDax(uri, size);
}

absl::Status DestroyDax(const PoolUri& uri) {
  auto backend = MapDax(uri, std::nullopt);
  if (!backend.ok()) return backend.status();
  // Wiping the header page is enough: Open then reports "no pool here".
  uint8_t* base = (*backend)->base();
  std::memset(base, 0, 4096);
  for (size_t off = 0; off < 4096; off += 64) __builtin_ia32_clflush(base + off);
  __builtin_ia32_sfence();
  return absl::OkStatus();
}

const BackendProvider kDaxProvider = {&CreateDax, &OpenDax, &DestroyDax, 2u << 20};

}  // namespace

absl::StatusOr<uint64_t> ValidateDaxSize(std::optional<uint64_t> requested, uint64_t device_size,
                                         uint64_t alignment, const std::string& path) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " reports alignment ", alignment, ", not a power of two"));
  }
  if (device_size == 0 || device_size % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has size ", FormatBytes(device_size),
                                                   ", not a multiple of its alignment ",
                                                   FormatBytes(alignment)));
  }
  uint64_t size = requested.value_or(device_size);
  if (size % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("size ", FormatBytes(size),
                                                   " is not a multiple of the alignment of ", path,
                                                   " (", FormatBytes(alignment), ")"));
  }
  if (size > device_size) {
    return absl::InvalidArgumentError(absl::StrCat("size ", FormatBytes(size), " exceeds ", path,
                                                   " (", FormatBytes(device_size), ")"));
  }
  return size;
}

uint64_t DaxOpenSize(uint64_t header_pool_size, uint64_t device_size, uint64_t alignment) {
  if (header_pool_size == 0 || header_pool_size > device_size || alignment == 0 ||
      header_pool_size % alignment != 0) {
    return device_size;  // not a pool header: the pool layer says what is wrong
  }
  return header_pool_size;
}

absl::Status CheckDaxDevice(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("no device-DAX device at ", path));
  }
  if (!S_ISCHR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a character device (device-DAX devices are /dev/daxX.Y)"));
  }
  std::string link =
      absl::StrCat("/sys/dev/char/", major(st.st_rdev), ":", minor(st.st_rdev), "/subsystem");
  char buf[PATH_MAX];
  ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  std::string subsystem = "unknown";
  if (n > 0) {
    buf[n] = '\0';
    const char* slash = std::strrchr(buf, '/');
    subsystem = slash ? slash + 1 : buf;
  }
  if (subsystem != "dax") {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a character device of subsystem '",
                                                   subsystem, "', not device-DAX"));
  }
  return absl::OkStatus();
}

const BackendProvider* DaxBackendProvider() { return &kDaxProvider; }

}  // namespace cxlrt::runtime
