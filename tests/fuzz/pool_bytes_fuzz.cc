// libFuzzer harness for everything that parses pool bytes: the pool header,
// host table and region directory (Pool::Open and Check), the allocator's
// header, segment table, segment headers and arenas (allocator::Audit), and
// the KV store's header, namespaces, partitions and entries (kv::Audit).
//
// A valid pool image (allocator, KV store with entries, a named block) is
// made once, and with it a table of its records: each checksummed record
// (with the function that seals it) and the unsealed areas parsers read.
// Each input is applied to a fresh copy of the image:
//   u8 flags (bit 0: re-seal every record a patch touched, so the readers
//   see bytes that are corrupt yet pass their checksum, as a buggy or
//   hostile host would write them);
//   then repeated { u16 record (modulo records + 1; the extra one is the
//   raw image, offset x 64); u16 offset in the record; u8 length; bytes }.
// The readers must answer every image with OK or an error: a crash, an
// abort ("unvalidated offset reached the coherence layer" included), a
// hang or a sanitizer report is a finding. Run by ctest for a bounded time
// with the seeds of tests/fuzz/corpus/pool_bytes (tests/CMakeLists.txt);
// see docs/testing.md.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/allocator/internal/arena.h"
#include "cxlrt/kv/internal/store_view.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/pool_layout.h"

namespace {

using namespace cxlrt;  // NOLINT: a harness

constexpr uint64_t kPoolBytes = 32ull << 20;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pool_bytes_fuzz setup: %s\n", what.c_str());
  std::abort();
}

// A span of the image that readers parse; `seal` recomputes its checksum
// (null: the record has none).
struct Record {
  uint64_t at;
  uint64_t size;
  std::function<void(uint8_t*)> seal;
};

struct Image {
  std::string uri;
  std::string path;
  std::vector<uint8_t> bytes;  // the valid image's first `span` bytes
  uint64_t span = 0;           // every record lies below it
  std::vector<Record> records;
  uint8_t* map = nullptr;
};

// Sealed by `sum` over the record as its layout type L, into L::checksum.
template <typename L>
Record Sealed(uint64_t at, uint32_t (*sum)(const L&)) {
  return {at, sizeof(L), [sum](uint8_t* p) {
            L l;
            std::memcpy(&l, p, sizeof l);
            l.checksum = sum(l);
            std::memcpy(p, &l, sizeof l);
          }};
}

template <typename L>
L At(const uint8_t* base, uint64_t at) {
  L l;
  std::memcpy(&l, base + at, sizeof l);
  return l;
}

// Every record of a valid image.
std::vector<Record> Records(const uint8_t* img, const runtime::Pool& pool) {
  namespace ai = allocator_internal;
  namespace ki = kv_internal;
  std::vector<Record> r;
  const auto ph = At<runtime::PoolHeaderLayout>(img, 0);
  r.push_back(Sealed<runtime::PoolHeaderLayout>(0, runtime::HeaderChecksum));
  for (uint32_t i = 0; i < ph.host_slot_count; ++i) {
    const uint64_t slot = ph.host_table_offset + i * sizeof(runtime::HostSlotLayout);
    r.push_back(Sealed<runtime::HostOwnerLineLayout>(slot, runtime::OwnerLineChecksum));
    r.push_back(Sealed<runtime::HostControlLineLayout>(
        slot + offsetof(runtime::HostSlotLayout, control), runtime::ControlLineChecksum));
    r.push_back({slot + offsetof(runtime::HostSlotLayout, bakery), 64, nullptr});
  }
  for (uint32_t i = 0; i < ph.directory_entry_count; ++i) {
    r.push_back(Sealed<runtime::RegionEntryLayout>(
        ph.directory_offset + i * sizeof(runtime::RegionEntryLayout),
        runtime::RegionEntryChecksum));
  }
  auto region = pool.FindRegion(allocator::kAllocatorRegionName);
  if (!region.ok()) Die(region.status().ToString());
  const auto ah = At<allocator::AllocatorHeaderLayout>(img, region->offset);
  r.push_back(
      Sealed<allocator::AllocatorHeaderLayout>(region->offset, ai::AllocatorHeaderChecksum));
  for (uint32_t i = 0; i < ah.segment_count; ++i) {
    const uint64_t e = ah.segment_table + i * sizeof(allocator::SegmentEntryLayout);
    r.push_back(Sealed<allocator::SegmentEntryLayout>(e, ai::EntryChecksum));
    const auto entry = At<allocator::SegmentEntryLayout>(img, e);
    const auto state = static_cast<allocator::SegmentState>(entry.state);
    if (state == allocator::SegmentState::kSlab || state == allocator::SegmentState::kPages) {
      const uint64_t seg = ah.first_segment + i * allocator::kSegmentSize;
      r.push_back(Sealed<allocator::SegmentHeaderLayout>(seg, ai::SegmentHeaderChecksum));
      r.push_back({seg + allocator::kAllocBitmapOffset, 64, nullptr});
      r.push_back({seg + allocator::kDurableBitmapOffset, 64, nullptr});
      r.push_back({seg + allocator::kRunLengthOffset, 64, nullptr});
    }
  }
  for (uint32_t i = 0; i < ah.host_slots; ++i) {
    r.push_back({ah.arenas + i * allocator::kArenaSize, allocator::kArenaSize, nullptr});
    r.push_back({ah.ring_heads + i * ah.row_stride, 64, nullptr});
    r.push_back({ah.ring_tails + i * ah.row_stride, 64, nullptr});
  }
  auto store = pool.FindRegion(kv::kStoreRegionName);
  if (!store.ok()) Die(store.status().ToString());
  const uint64_t base = store->offset;
  const auto sh = At<kv::StoreHeaderLayout>(img, base);
  r.push_back(Sealed<kv::StoreHeaderLayout>(base, ki::HeaderChecksum));
  for (uint32_t n = 0; n < sh.max_namespaces; ++n) {
    r.push_back(Sealed<kv::NamespaceLayout>(
        base + sh.namespaces_offset + n * sizeof(kv::NamespaceLayout), ki::NamespaceChecksum));
  }
  for (uint32_t p = 0; p < sh.hosts; ++p) {
    const uint64_t part = base + sh.partitions_offset + p * sh.partition_stride;
    r.push_back({part, sizeof(kv::PartitionHeaderLayout), nullptr});
    r.push_back({part + sh.counters_offset, sizeof(kv::NsCountersLayout), nullptr});
    r.push_back({part + sh.pins_offset, sh.pins_per_host * sizeof(kv::PinLayout), nullptr});
    for (uint32_t e = 0; e < sh.entries_per_host; ++e) {
      const uint64_t at = part + sh.entries_offset + e * sizeof(kv::EntryLayout);
      // Empty slots too: a reader must refuse a sealed entry it never wrote.
      r.push_back(Sealed<kv::EntryLayout>(at, ki::EntryChecksum));
    }
  }
  return r;
}

Image MakeImage() {
  Image im;
  const std::string dir = "/dev/shm";
  const std::string name = absl::StrCat("fuzz", getpid());
  im.uri = absl::StrCat("emu://", name, "?dir=", dir);
  im.path = absl::StrCat(dir, "/cxlrt-", name, ".pool");
  {
    auto pool = runtime::Pool::Create(absl::StrCat(im.uri, "&size=32M&hosts=4"));
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
      const absl::Status put = (*st)->Put("ns", absl::StrCat("key", i), v.data(), v.size());
      if (!put.ok()) Die(put.ToString());
    }
    if (auto named = (*a)->AllocateNamed("named", 5000); !named.ok()) {
      Die(named.status().ToString());
    }
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
  auto pool = runtime::Pool::Open(im.uri);
  if (!pool.ok()) Die(pool.status().ToString());
  im.records = Records(im.map, **pool);
  for (const Record& r : im.records) im.span = std::max(im.span, r.at + r.size);
  if (im.span > kPoolBytes) Die("a record past the pool's end");
  im.bytes.assign(im.map, im.map + im.span);
  return im;
}

Image& TheImage() {
  static Image im = MakeImage();
  return im;
}

void RemoveImage() { unlink(TheImage().path.c_str()); }

// Every reader of pool bytes over the image at `uri`: the first error.
absl::Status ReadEverything(const std::string& uri) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) return pool.status();
  std::vector<std::string> problems;
  absl::Status first = (*pool)->Check(&problems);
  auto keep = [&first](absl::Status s) {
    if (first.ok()) first = std::move(s);
  };
  keep((*pool)->ListRegions().status());
  if (!allocator::HasAllocator(**pool)) keep(absl::NotFoundError("no allocator"));
  keep(allocator::Audit(**pool, &problems));
  keep(allocator::ReadStats(**pool).status());
  if (!kv::HasStore(**pool)) keep(absl::NotFoundError("no KV store"));
  keep(kv::Audit(**pool, &problems));
  keep(kv::ReadStats(**pool).status());
  return first;
}

// The harness must exercise what it claims to: the unpatched image reads
// clean everywhere, and re-sealing any written record leaves its bytes as
// they are (so each record sits where the table says and seals as its
// writer does).
void CheckTheImage(const Image& im) {
  if (absl::Status s = ReadEverything(im.uri); !s.ok()) {
    Die("the unpatched image does not read clean: " + s.ToString());
  }
  for (const Record& r : im.records) {
    const uint8_t* at = im.bytes.data() + r.at;
    if (!r.seal || std::all_of(at, at + r.size, [](uint8_t b) { return b == 0; })) continue;
    std::vector<uint8_t> resealed(at, at + r.size);
    r.seal(resealed.data());
    if (std::memcmp(resealed.data(), at, r.size) != 0) {
      Die(absl::StrCat("re-sealing the record at 0x", absl::Hex(r.at), " changed it"));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const Image& im = TheImage();
  std::atexit(RemoveImage);
  CheckTheImage(im);
  if (std::getenv("CXLRT_FUZZ_LIST_RECORDS") != nullptr) {  // to write seeds by hand
    for (size_t i = 0; i < im.records.size(); ++i) {
      const Record& r = im.records[i];
      std::printf("%zu at 0x%llx size %llu%s\n", i, static_cast<unsigned long long>(r.at),
                  static_cast<unsigned long long>(r.size), r.seal ? " sealed" : "");
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Image& im = TheImage();
  std::memcpy(im.map, im.bytes.data(), im.bytes.size());
  if (size == 0) return 0;
  const bool reseal = data[0] & 1;
  std::vector<const Record*> touched;
  for (size_t i = 1; i + 5 <= size;) {
    uint16_t which, off;
    std::memcpy(&which, data + i, 2);
    std::memcpy(&off, data + i + 2, 2);
    const size_t len = data[i + 4];
    i += 5;
    const size_t n = std::min(len, size - i);
    const size_t which_n = which % (im.records.size() + 1);
    uint64_t at, end;
    if (which_n == im.records.size()) {  // raw
      at = (uint64_t{off} * 64) % im.span;
      end = im.span;
    } else {
      const Record& r = im.records[which_n];
      at = r.at + off % r.size;
      end = r.at + r.size;
      touched.push_back(&r);
    }
    std::memcpy(im.map + at, data + i, std::min<uint64_t>(n, end - at));
    i += n;
  }
  if (reseal) {
    for (const Record* r : touched) {
      if (r->seal) r->seal(im.map + r->at);
    }
  }
  (void)ReadEverything(im.uri);  // any status will do; a crash or hang will not
  return 0;
}
