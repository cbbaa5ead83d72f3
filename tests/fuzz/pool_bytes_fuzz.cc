// libFuzzer harness for everything that parses pool bytes: the pool header,
// host table and region directory (Pool::Open and Check), the allocator's
// header, segment table and arenas (allocator::Audit), and the KV store's
// header, partitions and entries (kv::Audit).
//
// A valid pool image (allocator, KV store with entries, a named block) is
// made once; each input is a list of patches applied to a fresh copy of it:
//   repeated { u32 offset (little-endian, taken modulo the patched span);
//              u8 length; length bytes }
// The readers must answer every image with OK or an error: a crash, an
// abort ("unvalidated offset reached the coherence layer" included), a
// hang or a sanitizer report is a finding. Run by ctest for a bounded time
// (tests/CMakeLists.txt); see docs/testing.md.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/allocator.h"
#include "kv/store.h"
#include "runtime/membership.h"
#include "runtime/pool.h"

namespace {

using namespace cxlrt;  // NOLINT: a harness

constexpr uint64_t kPoolBytes = 16ull << 20;
// Patches land in the first kSpan bytes: header, host table, directory and
// the heap's metadata segment (allocator tables, KV store), where parsers
// read; data blocks beyond hold only values.
constexpr uint64_t kSpan = 4ull << 20;

struct Image {
  std::string uri;
  std::string path;
  std::vector<uint8_t> bytes;
  uint8_t* map = nullptr;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pool_bytes_fuzz setup: %s\n", what.c_str());
  std::abort();
}

Image MakeImage() {
  Image im;
  const std::string dir = "/dev/shm";
  const std::string name = absl::StrCat("fuzz", getpid());
  im.uri = absl::StrCat("emu://", name, "?dir=", dir);
  im.path = absl::StrCat(dir, "/cxlrt-", name, ".pool");
  {
    auto pool = runtime::Pool::Create(absl::StrCat(im.uri, "&size=16M&hosts=4"));
    if (!pool.ok()) Die(pool.status().ToString());
    runtime::AttachOptions ao;
    ao.host_id = -1;
    auto m = runtime::Membership::Attach(**pool, ao);
    if (!m.ok()) Die(m.status().ToString());
    auto a = allocator::Allocator::Open(**pool, **m);
    if (!a.ok()) Die(a.status().ToString());
    kv::StoreOptions so;
    so.create = true;
    so.entries_per_host = 64;
    so.pins_per_host = 16;
    so.max_namespaces = 4;
    auto st = kv::Store::Open(**a, so);
    if (!st.ok()) Die(st.status().ToString());
    for (int i = 0; i < 8; ++i) {
      std::string v(100 + 700 * i, static_cast<char>('a' + i));
      if (!(*st)->Put("ns", absl::StrCat("key", i), v.data(), v.size()).ok()) Die("put");
    }
    if (!(*a)->AllocateNamed("named", 5000).ok()) Die("named");
    st->reset();
    if (!(*a)->Close().ok()) Die("close");
    if (!(*m)->Detach().ok()) Die("detach");
  }
  const int fd = open(im.path.c_str(), O_RDWR);
  if (fd < 0) Die("open " + im.path);
  im.map =
      static_cast<uint8_t*>(mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  if (im.map == MAP_FAILED) Die("mmap");
  im.bytes.assign(im.map, im.map + kSpan);
  return im;
}

Image& TheImage() {
  static Image im = MakeImage();
  return im;
}

void RemoveImage() { unlink(TheImage().path.c_str()); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  TheImage();
  std::atexit(RemoveImage);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Image& im = TheImage();
  std::memcpy(im.map, im.bytes.data(), im.bytes.size());
  for (size_t i = 0; i + 5 <= size;) {
    uint32_t off;
    std::memcpy(&off, data + i, 4);
    const size_t len = data[i + 4];
    i += 5;
    const size_t n = std::min(len, size - i);
    const uint64_t at = off % kSpan;
    const size_t fit = std::min<uint64_t>(n, kSpan - at);
    std::memcpy(im.map + at, data + i, fit);
    i += n;
  }
  auto pool = runtime::Pool::Open(im.uri);
  if (!pool.ok()) return 0;  // refused: fine, if it said why
  std::vector<std::string> problems;
  (void)(*pool)->Check(&problems);
  (void)(*pool)->ListRegions();
  if (allocator::HasAllocator(**pool)) {
    (void)allocator::Audit(**pool, &problems);
    (void)allocator::ReadStats(**pool);
  }
  if (kv::HasStore(**pool)) {
    (void)kv::Audit(**pool, &problems);
    (void)kv::ReadStats(**pool);
  }
  return 0;
}
