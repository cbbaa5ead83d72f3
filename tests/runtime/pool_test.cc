#include "cxlrt/runtime/pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "cxlrt/emulation/shm_backend.h"
#include "cxlrt/runtime/membership.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::WaitExit;

std::string FileOf(const std::string& uri) { return emulation::ShmPoolPath(*ParsePoolUri(uri)); }

// Reads, edits and writes back bytes of a pool file behind the runtime's back.
class PoolFile {
 public:
  explicit PoolFile(const std::string& uri) : fd_(open(FileOf(uri).c_str(), O_RDWR)) {
    EXPECT_GE(fd_, 0);
  }
  ~PoolFile() { close(fd_); }
  template <typename T>
  T Get(uint64_t off) {
    T v;
    EXPECT_EQ(pread(fd_, &v, sizeof(T), off), static_cast<ssize_t>(sizeof(T)));
    return v;
  }
  template <typename T>
  void Put(uint64_t off, const T& v) {
    EXPECT_EQ(pwrite(fd_, &v, sizeof(T), off), static_cast<ssize_t>(sizeof(T)));
  }
  PoolHeaderLayout Header() { return Get<PoolHeaderLayout>(0); }
  // Writes `h` back, with a correct checksum unless told otherwise.
  void PutHeader(PoolHeaderLayout h, bool fix_checksum = true) {
    if (fix_checksum) h.checksum = HeaderChecksum(h);
    Put(0, h);
  }
  void Truncate(uint64_t size) { EXPECT_EQ(ftruncate(fd_, size), 0); }

 private:
  int fd_;
};

class PoolTest : public ::testing::Test {
 protected:
  // Creates a pool and closes it; returns the URI to open it with.
  std::string MakePool(const std::string& extra = "", const std::string& size = "8M") {
    std::string uri = PoolUri(dir_, extra, size);
    auto pool = Pool::Create(uri);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return OpenUri(uri);
  }
  TempDir dir_;
};

TEST_F(PoolTest, CreateOpenDestroyRoundTrip) {
  std::string uri = PoolUri(dir_, "hosts=8");
  {
    auto pool = Pool::Create(uri);
    CXLRT_ASSERT_OK(pool);
    EXPECT_EQ((*pool)->size(), 8u << 20);
    EXPECT_EQ((*pool)->host_slots(), 8u);
    EXPECT_EQ((*pool)->domain(), CoherenceDomain::kHardware);
  }
  auto pool = Pool::Open(OpenUri(uri));
  CXLRT_ASSERT_OK(pool);
  const PoolHeaderLayout& h = (*pool)->header();
  EXPECT_EQ(h.magic, kPoolMagic);
  EXPECT_EQ(std::memcmp(&h.magic, "CXLRTPL1", 8), 0);
  EXPECT_EQ(h.format_version, kPoolFormatVersion);
  EXPECT_EQ(h.heap_offset % kHeapAlignment, 0u);
  EXPECT_EQ(h.heap_offset + h.heap_size, h.pool_size);
  EXPECT_NE(h.creation_id, 0u);
  CXLRT_EXPECT_OK((*pool)->Check());
  auto regions = (*pool)->ListRegions();
  CXLRT_ASSERT_OK(regions);
  EXPECT_TRUE(regions->empty());
  // A name that would not read back as itself (names are printable ASCII)
  // is refused before anything is written.
  for (const char* bad : {"comm/\xC3\xA9", "a\nb", "x\x7f"}) {
    CXLRT_EXPECT_ERROR((*pool)->CreateRegion(bad, h.heap_offset, 64, 0),
                       absl::StatusCode::kInvalidArgument, "printable ASCII");
  }
  EXPECT_TRUE((*pool)->ListRegions()->empty());
  for (uint32_t i = 0; i < 8; ++i) {
    auto r = (*pool)->ReadHost(i);
    CXLRT_ASSERT_OK(r);
    EXPECT_EQ(r->state, SlotState::kFree);
  }
  pool->reset();
  CXLRT_ASSERT_OK(Pool::Destroy(OpenUri(uri)));
  CXLRT_EXPECT_ERROR(Pool::Open(OpenUri(uri)), absl::StatusCode::kNotFound, "no pool emu://t");
  CXLRT_EXPECT_ERROR(Pool::Destroy(OpenUri(uri)), absl::StatusCode::kNotFound, "no pool");
}

TEST_F(PoolTest, EveryCoherenceDomainIsRecordedInTheHeader) {
  std::string uri = MakePool("coherence=software");
  auto pool = Pool::Open(uri);
  CXLRT_ASSERT_OK(pool);
  EXPECT_EQ((*pool)->domain(), CoherenceDomain::kSoftware);
  EXPECT_EQ((*pool)->coherence().domain(), CoherenceDomain::kSoftware);
}

TEST_F(PoolTest, CreatingAnExistingPoolIsAlreadyExists) {
  std::string uri = PoolUri(dir_);
  CXLRT_ASSERT_OK(Pool::Create(uri));
  CXLRT_EXPECT_ERROR(Pool::Create(uri), absl::StatusCode::kAlreadyExists, "already exists");
}

TEST_F(PoolTest, CreateRejectsBadSizes) {
  CXLRT_EXPECT_ERROR(Pool::Create(OpenUri(PoolUri(dir_))), absl::StatusCode::kInvalidArgument,
                     "needs a size");
  CXLRT_EXPECT_ERROR(Pool::Create(PoolUri(dir_, "", "2M")), absl::StatusCode::kInvalidArgument,
                     "at least 4 MiB");
  CXLRT_EXPECT_ERROR(Pool::Create(PoolUri(dir_, "", "5M")), absl::StatusCode::kInvalidArgument,
                     "multiple of 2 MiB");
  CXLRT_EXPECT_OK(Pool::Create(PoolUri(dir_, "hosts=1024", "4M")));  // the most tables fit
}

TEST_F(PoolTest, ASizeBeyondTheFilesystemIsResourceExhaustedAndLeavesNothing) {
  std::string uri = PoolUri(dir_, "", "64T");
  CXLRT_EXPECT_ERROR(Pool::Create(uri), absl::StatusCode::kResourceExhausted, "cannot reserve");
  EXPECT_NE(access(FileOf(uri).c_str(), F_OK), 0) << "a failed create left its file behind";
}

TEST_F(PoolTest, PoolsAreCreatedOwnerOnlyUnlessModeSaysOtherwise) {
  std::string a = PoolUri(dir_);
  std::string b = PoolUri(dir_, "mode=0640");
  CXLRT_ASSERT_OK(Pool::Create(a));
  CXLRT_ASSERT_OK(Pool::Create(b));
  struct stat st;
  ASSERT_EQ(stat(FileOf(a).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(FileOf(b).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST_F(PoolTest, OpenRejectsAUriThatContradictsThePool) {
  std::string uri = MakePool("hosts=4");
  CXLRT_EXPECT_ERROR(Pool::Open(uri + "&size=16M"), absl::StatusCode::kInvalidArgument,
                     "but the URI says size=16 MiB");
  CXLRT_EXPECT_ERROR(Pool::Open(uri + "&coherence=software"), absl::StatusCode::kInvalidArgument,
                     "created with coherence=hardware");
  CXLRT_EXPECT_ERROR(Pool::Open(uri + "&hosts=5"), absl::StatusCode::kInvalidArgument,
                     "has 4 host slots");
  CXLRT_EXPECT_OK(Pool::Open(uri + "&size=8M&hosts=4&coherence=hardware"));
}

TEST_F(PoolTest, OpeningWithoutReadWriteAccessIsPermissionDenied) {
  std::string uri = MakePool();
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);  // the directory is not what stops it
  const bool root = geteuid() == 0;
  if (!root) {
    ASSERT_EQ(chmod(FileOf(uri).c_str(), 0400), 0);
  }
  pid_t child = Spawn([&] {
    // Root may open anything: become nobody, for whom 0600 root's is closed.
    if (root && (setgid(65534) != 0 || setuid(65534) != 0)) return 10;
    auto pool = Pool::Open(uri);
    if (pool.status().code() != absl::StatusCode::kPermissionDenied) return 11;
    if (std::string(pool.status().message()).find("for read and write") == std::string::npos) {
      return 12;
    }
    return 0;
  });
  EXPECT_EQ(WaitExit(child), 0) << "10: cannot drop root, 11: wrong code, 12: unclear message";
}

// --- Corruption: every case is kDataLoss naming the problem. ---

TEST_F(PoolTest, BadMagicIsDataLoss) {
  std::string uri = MakePool();
  PoolFile f(uri);
  auto h = f.Header();
  std::memcpy(&h.magic, "NOTAPOOL", 8);
  f.PutHeader(h, false);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "not a cxlrt pool");
}

TEST_F(PoolTest, ZeroMagicIsAnUnfinishedCreation) {
  std::string uri = MakePool();
  PoolFile f(uri);
  auto h = f.Header();
  h.magic = 0;
  f.PutHeader(h, false);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "creation did not finish");
  f.PutHeader(PoolHeaderLayout{}, false);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "all zero");
}

TEST_F(PoolTest, WrongVersionIsDataLoss) {
  std::string uri = MakePool();
  PoolFile f(uri);
  auto h = f.Header();
  h.format_version = kPoolFormatVersion + 1;
  f.PutHeader(h);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss,
                     absl::StrCat("format version is ", kPoolFormatVersion + 1));
}

TEST_F(PoolTest, BadChecksumIsDataLoss) {
  std::string uri = MakePool();
  PoolFile f(uri);
  auto h = f.Header();
  h.name[0] ^= 1;
  f.PutHeader(h, false);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "header checksum");
}

TEST_F(PoolTest, SizeThatDoesNotMatchTheFileIsDataLoss) {
  std::string uri = MakePool();
  {
    PoolFile f(uri);
    f.Truncate(10u << 20);
  }
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss,
                     "header says the pool is 8 MiB but its backing holds 10 MiB");
}

TEST_F(PoolTest, TruncatedFileIsDataLoss) {
  std::string uri = MakePool();
  PoolFile f(uri);
  f.Truncate(4u << 20);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "(truncated?)");
  f.Truncate(100);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "too few for a pool header");
  f.Truncate(0);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "too few for a pool header");
}

TEST_F(PoolTest, TableOffsetsOutOfRangeAreDataLoss) {
  std::string uri = MakePool();
  PoolFile f(uri);
  const PoolHeaderLayout good = f.Header();
  struct Case {
    std::function<void(PoolHeaderLayout&)> edit;
    const char* message;
  } cases[] = {
      {[](auto& h) { h.host_table_offset = 1ull << 40; }, "host table"},
      {[](auto& h) { h.host_table_offset = 100; }, "host table"},
      {[](auto& h) { h.host_slot_count = 0; }, "host_slot_count is 0"},
      {[](auto& h) { h.host_slot_count = 1u << 30; }, "host_slot_count"},
      {[](auto& h) { h.host_slot_size = 64; }, "host_slot_size is 64"},
      {[](auto& h) { h.directory_offset = h.pool_size; }, "region directory"},
      {[](auto& h) { h.directory_offset = h.host_table_offset; }, "region directory"},
      {[](auto& h) { h.directory_entry_count = 1u << 20; }, "directory_entry_count"},
      {[](auto& h) { h.directory_entry_size = 0; }, "directory_entry_size"},
      {[](auto& h) { h.heap_offset += 4096; }, "heap at"},
      {[](auto& h) { h.heap_offset = UINT64_MAX - 4095; }, "heap at"},
      {[](auto& h) { h.heap_size = 1; }, "heap at"},
      {[](auto& h) { h.pool_size = 1; }, "backing holds"},
      {[](auto& h) { h.coherence_domain = 9; }, "coherence domain is 9"},
      {[](auto& h) { h.flags = 0x80; }, "flags"},
      {[](auto& h) { h.flags = kHeaderFlagDevices; }, "device_count is 0"},
      {[](auto& h) {
         h.flags = kHeaderFlagDevices;
         h.device_count = 2;
         h.device_size = 3ull << 20;
       },
       "device_size"},
      {[](auto& h) { h.device_count = 2; }, "without the devices flag"},
      {[](auto& h) { h.header_size = 512; }, "header_size is 512"},
      {[](auto& h) { std::memset(h.name, 'x', sizeof(h.name)); }, "not NUL-terminated"},
      {[](auto& h) { h.reserved[3] = 1; }, "reserved"},
  };
  for (const Case& c : cases) {
    PoolHeaderLayout h = good;
    c.edit(h);
    f.PutHeader(h);
    CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, c.message);
  }
  f.PutHeader(good);
  CXLRT_EXPECT_OK(Pool::Open(uri));
}

// Random bytes anywhere in the header or the tables: Open either succeeds
// (and then the pool checks clean) or says kDataLoss. Never a crash, never
// another code.
TEST_F(PoolTest, RandomCorruptionIsDataLossNeverACrash) {
  std::string uri = MakePool("hosts=4");
  PoolFile f(uri);
  const PoolHeaderLayout good = f.Header();
  const uint64_t tables_end = good.heap_offset;
  std::mt19937_64 rng(1234);
  int data_loss = 0, ok = 0;
  for (int iter = 0; iter < 400; ++iter) {
    // Half the time hit the header (re-sealed with a valid checksum every
    // other time, so field validation is exercised past the checksum).
    const bool header = iter % 2 == 0;
    PoolHeaderLayout h = good;
    const int bytes = 1 + static_cast<int>(rng() % 8);
    uint64_t base = 0;
    uint64_t saved = 0;
    if (header) {
      auto* raw = reinterpret_cast<uint8_t*>(&h);
      for (int k = 0; k < bytes; ++k) raw[rng() % 252] = static_cast<uint8_t>(rng());
      f.PutHeader(h, iter % 4 == 0);
    } else {
      // Mostly the used part of the tables: slots and the first entries.
      const uint64_t span = (iter % 3 == 0) ? tables_end - good.host_table_offset - 8 : 8192;
      base = good.host_table_offset + rng() % span;
      saved = f.Get<uint64_t>(base);
      for (int k = 0; k < bytes; ++k) f.Put<uint8_t>(base + k, static_cast<uint8_t>(rng()));
    }
    auto pool = Pool::Open(uri);
    if (pool.ok()) {
      ++ok;
      CXLRT_EXPECT_OK((*pool)->Check());
    } else {
      ++data_loss;
      EXPECT_EQ(pool.status().code(), absl::StatusCode::kDataLoss) << pool.status();
    }
    // Restore.
    f.PutHeader(good, false);
    if (!header) f.Put(base, saved);
  }
  EXPECT_GT(data_loss, 100) << "corruption went unnoticed too often (" << ok << " opened)";
  CXLRT_EXPECT_OK(Pool::Open(uri));
}

TEST_F(PoolTest, CorruptHostSlotsAreDataLoss) {
  std::string uri = MakePool("hosts=4");
  PoolFile f(uri);
  const auto h = f.Header();
  const uint64_t control = h.host_table_offset + 2 * sizeof(HostSlotLayout) + 128;
  HostControlLineLayout line = {};
  line.epoch = 3;
  line.state = 7;
  line.checksum = ControlLineChecksum(line);
  f.Put(control, line);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "host slot 2 has state 7");
  line.state = 1;
  line.checksum = ControlLineChecksum(line) ^ 1;
  f.Put(control, line);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss,
                     "host slot 2 control line checksum");
  line.state = 1;
  line.epoch = 0;
  line.checksum = ControlLineChecksum(line);
  f.Put(control, line);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "in use at epoch 0");
  line.epoch = 1;
  line.changed_by = 40;
  line.checksum = ControlLineChecksum(line);
  f.Put(control, line);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, "changed by slot 40");
}

RegionEntryLayout Entry(const char* name, uint64_t offset, uint64_t size) {
  RegionEntryLayout e = {};
  e.generation = 1;
  e.state = static_cast<uint32_t>(RegionState::kLive);
  e.offset = offset;
  e.size = size;
  std::strncpy(e.name, name, sizeof(e.name) - 1);
  e.checksum = RegionEntryChecksum(e);
  return e;
}

TEST_F(PoolTest, DirectoryEntriesAreListedAndBoundsChecked) {
  std::string uri = MakePool();
  PoolFile f(uri);
  const auto h = f.Header();
  auto at = [&](int i) { return h.directory_offset + i * sizeof(RegionEntryLayout); };
  f.Put(at(0), Entry("comm/job7/slots", h.heap_offset, 4096));
  f.Put(at(1), Entry("kv/index", h.heap_offset + 4096, 8192));
  {
    auto pool = Pool::Open(uri);
    CXLRT_ASSERT_OK(pool);
    auto regions = (*pool)->ListRegions();
    CXLRT_ASSERT_OK(regions);
    ASSERT_EQ(regions->size(), 2u);
    EXPECT_EQ((*regions)[0].name, "comm/job7/slots");
    EXPECT_EQ((*regions)[1].offset, h.heap_offset + 4096);
    EXPECT_EQ((*regions)[1].size, 8192u);
  }
  struct Case {
    RegionEntryLayout entry;
    const char* message;
  } cases[] = {
      {Entry("outside", h.pool_size - 64, 128), "not a 64 B aligned non-empty range"},
      {Entry("before-heap", h.directory_offset, 64), "not a 64 B aligned non-empty range"},
      {Entry("wraps", h.heap_offset, UINT64_MAX), "not a 64 B aligned non-empty range"},
      {Entry("empty", h.heap_offset + 8192 * 4, 0), "not a 64 B aligned non-empty range"},
      {Entry("unaligned", h.heap_offset + 8192 * 4 + 8, 64), "not a 64 B aligned"},
      {Entry("overlaps", h.heap_offset + 100 * 64, 8192), "overlap"},
      {Entry("kv/index", h.heap_offset + (1 << 20), 64), "repeats the name of entry 1"},
      {Entry("", h.heap_offset + (1 << 20), 64), "empty or unterminated name"},
  };
  for (const Case& c : cases) {
    f.Put(at(5), c.entry);
    CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss, c.message);
  }
  RegionEntryLayout torn = Entry("torn", h.heap_offset + (1 << 20), 64);
  torn.size = 128;  // checksum no longer matches
  f.Put(at(5), torn);
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kDataLoss,
                     "region directory entry 5 checksum");
  f.Put(at(5), RegionEntryLayout{});
  CXLRT_EXPECT_OK(Pool::Open(uri));
}

TEST_F(PoolTest, DestroyRefusesWhileAHostIsAliveUnlessForced) {
  std::string uri = MakePool();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = Spawn([&] {
    auto pool = Pool::Open(uri);
    if (!pool.ok()) return 1;
    AttachOptions o;
    o.lease = absl::Milliseconds(400);
    o.heartbeat = absl::Milliseconds(20);
    auto m = Membership::Attach(**pool, o);
    if (!m.ok()) return 2;
    char c = 1;
    if (write(ready[1], &c, 1) != 1) return 3;
    absl::SleepFor(absl::Seconds(30));
    return 0;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  CXLRT_EXPECT_ERROR(Pool::Destroy(uri), absl::StatusCode::kFailedPrecondition, "has live hosts");
  CXLRT_EXPECT_OK(Pool::Destroy(uri, {.force = true}));
  kill(child, SIGKILL);
  WaitExit(child);
  close(ready[0]);
  close(ready[1]);
}

TEST_F(PoolTest, ACorruptPoolCanBeDestroyed) {
  std::string uri = MakePool();
  {
    PoolFile f(uri);
    f.PutHeader(PoolHeaderLayout{}, false);
  }
  CXLRT_EXPECT_OK(Pool::Destroy(uri));
  CXLRT_EXPECT_ERROR(Pool::Open(uri), absl::StatusCode::kNotFound, "no pool");
}

}  // namespace
}  // namespace cxlrt::runtime
