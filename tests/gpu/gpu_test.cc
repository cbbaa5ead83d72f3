// The GPU data path (cxlrt/gpu/, cxlrt/collectives/gpu_engine.h, docs/gpu.md) across emulated
// hosts (forked processes, each with its own CUDA context on the one GPU):
// every collective x type x op on device buffers against the host path
// (bit-exact), mixed kinds across ranks, stream ordering with no host sync,
// KV blocks put from and got into device memory across processes, and a
// rank killed mid-transfer. Skips, saying why, when no GPU is usable.
//
// The parent never touches CUDA: a child forked after the parent started
// the CUDA runtime could not use it. Even the skip check runs in a child.
#include "cxlrt/gpu/gpu.h"

#include <sys/mman.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu_timing.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/gpu_engine.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/mem_buffer.h"
#include "tests/testing/test_util.h"

namespace cxlrt {
namespace {

using collectives::CollKind;
using collectives::Communicator;
using collectives::DataType;
using collectives::RedOp;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::WaitExit;
using runtime::CoherenceDomain;

// Asks a child whether this machine has a usable GPU; "" when it has.
std::string NoGpuReason() {
  static std::string* reason = nullptr;
  if (reason) return *reason;
  char* shared = static_cast<char*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(shared, 0, 4096);
  pid_t pid = Spawn([&]() -> int {
    if (gpu::GpuAvailable()) return 0;
    std::snprintf(shared, 4095, "%s", gpu::GpuUnavailableReason().c_str());
    return 1;
  });
  const int rc = WaitExit(pid, absl::Seconds(60));
  reason = new std::string(rc == 0 ? "" : (shared[0] ? shared : "the probe failed"));
  munmap(shared, 4096);
  return *reason;
}

#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    if (std::string why = NoGpuReason(); !why.empty()) {                          \
      GTEST_SKIP() << "no usable GPU, the CUDA path is not tested here: " << why; \
    }                                                                             \
  } while (0)

// Values every type holds exactly and every op keeps finite: small
// integers, as the type stores them.
void FillValues(DataType t, void* buf, size_t count, uint32_t seed) {
  auto* b = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>(::cxlrt::testing::PatternWord(seed, i) % 7) - 3;
    const float f = static_cast<float>(v == 0 ? 1 : v);
    switch (t) {
      case DataType::kInt8:
      case DataType::kUint8:
        b[i] = static_cast<uint8_t>(v);
        break;
      case DataType::kInt32:
      case DataType::kUint32: {
        const int32_t x = v;
        std::memcpy(b + 4 * i, &x, 4);
        break;
      }
      case DataType::kInt64:
      case DataType::kUint64: {
        const int64_t x = v;
        std::memcpy(b + 8 * i, &x, 8);
        break;
      }
      case DataType::kFloat16: {
        const collectives::Half h(f);
        std::memcpy(b + 2 * i, &h, 2);
        break;
      }
      case DataType::kBfloat16: {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);  // exact for small integers
        std::memcpy(b + 2 * i, &h, 2);
        break;
      }
      case DataType::kFloat32:
        std::memcpy(b + 4 * i, &f, 4);
        break;
      case DataType::kFloat64: {
        const double d = f;
        std::memcpy(b + 8 * i, &d, 8);
        break;
      }
    }
  }
}

struct Case {
  CollKind kind;
  DataType type;
  RedOp op;
  size_t count;
};

bool Reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduceScatter || k == CollKind::kReduce;
}

// Elements of (send, recv) for a call of `count` on n ranks.
std::pair<size_t, size_t> Sizes(CollKind k, size_t count, int n) {
  switch (k) {
    case CollKind::kReduceScatter:
    case CollKind::kScatter:
      return {n * count, count};
    case CollKind::kAllGather:
    case CollKind::kGather:
      return {count, n * count};
    case CollKind::kAllToAll:
      return {n * count, n * count};
    default:
      return {count, count};
  }
}

absl::Status Call(Communicator& c, const Case& k, const void* s, void* r, void* stream = nullptr) {
  switch (k.kind) {
    case CollKind::kAllReduce:
      return c.AllReduce(s, r, k.count, k.type, k.op, stream);
    case CollKind::kReduceScatter:
      return c.ReduceScatter(s, r, k.count, k.type, k.op, stream);
    case CollKind::kAllGather:
      return c.AllGather(s, r, k.count, k.type, stream);
    case CollKind::kBroadcast:
      return c.Broadcast(s, r, k.count, k.type, 1 % c.size(), stream);
    case CollKind::kReduce:
      return c.Reduce(s, r, k.count, k.type, k.op, 0, stream);
    case CollKind::kGather:
      return c.Gather(s, r, k.count, k.type, 0, stream);
    case CollKind::kScatter:
      return c.Scatter(s, r, k.count, k.type, 0, stream);
    case CollKind::kAllToAll:
      return c.AllToAll(s, r, k.count, k.type, stream);
    default:
      return absl::InvalidArgumentError("kind");
  }
}

std::string Describe(const Case& k) {
  return absl::StrCat(collectives::CollKindName(k.kind), " ", collectives::DataTypeName(k.type),
                      " ", collectives::RedOpName(k.op), " count ", k.count);
}

class GpuTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    create_ = ::cxlrt::testing::PoolUri(
        dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam())), "1G");
    auto p = runtime::Pool::Create(create_);
    ASSERT_TRUE(p.ok()) << p.status();
    uri_ = ::cxlrt::testing::OpenUri(create_);
    errors_ = static_cast<char*>(
        mmap(nullptr, kErrBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  }
  void TearDown() override {
    if (errors_) munmap(errors_, kErrBytes);
  }

  using Body = std::function<std::string(int rank, Communicator&, allocator::Allocator&)>;
  void RunRanks(int n, const Body& body, const std::function<int(int)>& expect_rc = nullptr,
                const collectives::CommOptions& options = {}) {
    std::memset(errors_, 0, kErrBytes);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      pids.push_back(Spawn([&, r]() -> int {
        ::cxlrt::testing::TestHostOptions ho;
        ho.lease = absl::Seconds(1);
        auto h = ::cxlrt::testing::AttachTestHost(uri_, ho);
        std::string err;
        if (!h.ok()) {
          err = h.status().ToString();
        } else {
          auto comm = Communicator::Create(*h->alloc, "gpu", n, r, options);
          if (!comm.ok()) {
            err = comm.status().ToString();
          } else {
            err = body(r, **comm, *h->alloc);
            if (err.empty() && !(*comm)->destroyed()) {
              if (absl::Status d = (*comm)->Destroy(); !d.ok()) err = "Destroy: " + d.ToString();
            }
          }
        }
        if (err.empty()) return 0;
        std::snprintf(errors_ + r * kErrPerRank, kErrPerRank - 1, "rank %d: %s", r, err.c_str());
        return 1;
      }));
    }
    for (int r = 0; r < n; ++r) {
      const int rc = WaitExit(pids[r], absl::Seconds(300));
      EXPECT_EQ(rc, expect_rc ? expect_rc(r) : 0)
          << "rank " << r << " exit " << rc << ": " << errors_ + r * kErrPerRank;
    }
  }

  static constexpr size_t kErrPerRank = 2048;
  static constexpr size_t kErrBytes = 8 * kErrPerRank;
  ::cxlrt::testing::TempDir dir_;
  std::string create_, uri_;
  char* errors_ = nullptr;
};

// Runs every case on host buffers, then on device buffers (host buffers on
// ranks in `host_ranks`), and compares the bytes of every receive buffer.
std::string RunCases(int r, Communicator& comm, const std::vector<Case>& cases,
                     uint32_t host_ranks_mask) {
  const int n = comm.size();
  const bool on_device = !(host_ranks_mask >> r & 1);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    const size_t es = collectives::SizeOf(k.type);
    const auto [sc, rc] = Sizes(k.kind, k.count, n);
    std::vector<uint8_t> send(sc * es), want(rc * es, 0xEE), got(rc * es, 0xEE);
    FillValues(k.type, send.data(), sc, static_cast<uint32_t>(ci * 131 + r));
    if (absl::Status s = Call(comm, k, send.data(), want.data()); !s.ok()) {
      return absl::StrCat(Describe(k), " on host buffers: ", s.ToString());
    }
    void* ds = send.data();
    void* dr = got.data();
    if (on_device) {
      auto a = gpu::GpuAlloc(send.size());
      auto b = gpu::GpuAlloc(got.size());
      if (!a.ok() || !b.ok()) return "DeviceAlloc failed";
      ds = *a;
      dr = *b;
      if (!gpu::CopySync(ds, send.data(), send.size()).ok() ||
          !gpu::CopySync(dr, got.data(), got.size()).ok()) {
        return "DeviceCopy in failed";
      }
    }
    absl::Status s = Call(comm, k, ds, dr);
    if (on_device) {
      absl::Status back = gpu::CopySync(got.data(), dr, got.size());
      gpu::GpuFree(ds);
      gpu::GpuFree(dr);
      if (!back.ok()) return back.ToString();
    }
    if (!s.ok()) return absl::StrCat(Describe(k), " on device buffers: ", s.ToString());
    if (got != want) {
      size_t at = 0;
      while (got[at] == want[at]) ++at;
      return absl::StrCat(Describe(k), ": device result differs from the host path at byte ", at,
                          " (", int{got[at]}, " vs ", int{want[at]}, ")");
    }
  }
  return "";
}

std::vector<Case> AllCases(size_t count) {
  std::vector<Case> cases;
  for (CollKind k :
       {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather, CollKind::kBroadcast,
        CollKind::kReduce, CollKind::kGather, CollKind::kScatter, CollKind::kAllToAll}) {
    for (int t = 0; t < collectives::kNumDataTypes; ++t) {
      if (Reduces(k)) {
        for (int op = 0; op < collectives::kNumRedOps; ++op) {
          cases.push_back({k, static_cast<DataType>(t), static_cast<RedOp>(op), count});
        }
      } else {
        cases.push_back({k, static_cast<DataType>(t), RedOp::kSum, count});
      }
    }
  }
  return cases;
}

TEST_P(GpuTest, EveryCollectiveTypeAndOpOnDeviceBuffersMatchesTheHostPathBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 4}) {
    // 1001 elements: one-shot, odd sizes; plus large two-shot, many-chunk calls.
    std::vector<Case> cases = AllCases(1001);
    cases.push_back({CollKind::kAllReduce, DataType::kFloat32, RedOp::kSum, 3 << 20});
    cases.push_back({CollKind::kAllReduce, DataType::kBfloat16, RedOp::kAvg, 1 << 20});
    cases.push_back({CollKind::kAllGather, DataType::kFloat16, RedOp::kSum, 1 << 20});
    cases.push_back({CollKind::kReduceScatter, DataType::kFloat32, RedOp::kMax, 1 << 19});
    RunRanks(n, [&](int r, Communicator& comm, allocator::Allocator&) {
      return RunCases(r, comm, cases, 0);
    });
    if (HasFailure()) return;
  }
}

TEST_P(GpuTest, RanksMayMixDeviceAndHostBuffers) {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  for (CollKind k : {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter,
                     CollKind::kBroadcast, CollKind::kAllToAll}) {
    cases.push_back({k, DataType::kFloat32, RedOp::kSum, 100000});
    cases.push_back({k, DataType::kInt32, RedOp::kSum, 7});
  }
  RunRanks(3, [&](int r, Communicator& comm, allocator::Allocator&) {
    return RunCases(r, comm, cases, /*host ranks: 1*/ 0b010);
  });
}

// Send/Recv of device buffers around a ring of three ranks (rank 1 on host
// buffers), from empty to many chunks of the channel ring: every element
// arrives.
TEST_P(GpuTest, SendAndRecvMoveDeviceBuffersAroundARing) {
  SKIP_WITHOUT_GPU();
  RunRanks(3, [&](int r, Communicator& comm, allocator::Allocator&) -> std::string {
    const int n = comm.size(), to = (r + 1) % n, from = (r + n - 1) % n;
    const bool on_device = r != 1;
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{3} << 20}) {
      std::vector<uint32_t> out(count), in(count, 0xEEEEEEEE);
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<uint32_t>(r * 1000003 + i);
      void* send = out.data();
      void* recv = in.data();
      const size_t bytes = count * 4;
      if (on_device) {
        auto a = gpu::GpuAlloc(bytes);
        auto b = gpu::GpuAlloc(bytes);
        if (!a.ok() || !b.ok()) return "DeviceAlloc failed";
        send = *a;
        recv = *b;
        if (!gpu::CopySync(send, out.data(), bytes).ok() ||
            !gpu::CopySync(recv, in.data(), bytes).ok()) {
          return "DeviceCopy in failed";
        }
      }
      absl::Status s;
      for (int step = 0; step < 2 && s.ok(); ++step) {  // rank 0 receives first
        s = (r == 0) == (step == 1) ? comm.Send(send, count, DataType::kUint32, to)
                                    : comm.Recv(recv, count, DataType::kUint32, from);
      }
      if (on_device) {
        absl::Status back = gpu::CopySync(in.data(), recv, bytes);
        gpu::GpuFree(send);
        gpu::GpuFree(recv);
        if (!back.ok()) return back.ToString();
      }
      if (!s.ok()) return absl::StrCat("count ", count, ": ", s.ToString());
      for (size_t i = 0; i < count; ++i) {
        if (in[i] != static_cast<uint32_t>(from * 1000003 + i)) {
          return absl::StrCat("count ", count, ": element ", i, " from rank ", from, " is ", in[i]);
        }
      }
    }
    return "";
  });
}

// A kernel writes the input `delay_us` late on the stream; the all-reduce
// on that stream must wait for it, and a copy enqueued after it must see
// the result. The host never synchronises in between. In asynchronous mode
// the call must also return before the input is ready.
std::string StreamRounds(int r, Communicator& comm, uint32_t delay_us, bool asynchronous) {
  const size_t n = 1 << 20;  // words
  auto stream = gpu::StreamCreate();
  auto in = gpu::GpuAlloc(n * 4);
  auto out = gpu::GpuAlloc(n * 4);
  auto host = gpu::PageLockedAlloc(n * 4);
  if (!stream.ok() || !in.ok() || !out.ok() || !host.ok()) return "allocations failed";
  std::vector<uint8_t> zero(n * 4, 0);
  if (!gpu::CopySync(*in, zero.data(), n * 4).ok()) return "zeroing failed";
  // The first device call registers the pool (tenths of a second): not timed.
  if (absl::Status s = comm.AllReduce(*out, *out, 1, DataType::kUint32, RedOp::kSum, *stream);
      !s.ok() || !comm.Synchronize().ok() || !gpu::StreamSynchronize(*stream).ok()) {
    return "warm-up call: " + s.ToString();
  }
  for (int round = 0; round < 3; ++round) {
    const uint32_t seed = 100 * round + r + 1;
    if (absl::Status s = ::cxlrt::testing::FillPatternAsync(*in, n, seed, delay_us, *stream);
        !s.ok()) {
      return s.ToString();
    }
    const absl::Time t0 = absl::Now();
    if (absl::Status s = comm.AllReduce(*in, *out, n, DataType::kUint32, RedOp::kSum, *stream);
        !s.ok()) {
      return s.ToString();
    }
    if (asynchronous && absl::Now() - t0 > absl::Microseconds(delay_us) / 2) {
      return absl::StrCat("an asynchronous call took ", absl::FormatDuration(absl::Now() - t0),
                          " to return: it waited for its input");
    }
    if (absl::Status s = gpu::CopyAsync(*host, *out, n * 4, *stream); !s.ok()) {
      return s.ToString();
    }
    if (absl::Status s = gpu::StreamSynchronize(*stream); !s.ok()) return s.ToString();
    const auto* got = static_cast<const uint32_t*>(*host);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t want = ::cxlrt::testing::PatternWord(100 * round + 1, i) +
                            ::cxlrt::testing::PatternWord(100 * round + 2, i);
      if (got[i] != want) {
        return absl::StrCat("round ", round, " word ", i, ": ", got[i], ", want ", want,
                            " (the call did not wait for the stream, or the copy for it)");
      }
    }
  }
  if (absl::Status s = comm.Synchronize(); !s.ok()) return "Synchronize: " + s.ToString();
  gpu::GpuFree(*in);
  gpu::GpuFree(*out);
  gpu::PageLockedFree(*host);
  gpu::StreamDestroy(*stream);
  return "";
}

TEST_P(GpuTest, AsynchronousStreamCallsReturnAtOnceAndStillOrderTheStream) {
  SKIP_WITHOUT_GPU();
  collectives::CommOptions o;
  o.asynchronous = true;
  RunRanks(
      2,
      [](int r, Communicator& comm, allocator::Allocator&) {
        return StreamRounds(r, comm, 200000, true);
      },
      nullptr, o);
}

TEST_P(GpuTest, StreamOrderedCallsNeedNoHostSync) {
  SKIP_WITHOUT_GPU();
  RunRanks(2, [](int r, Communicator& comm, allocator::Allocator&) {
    return StreamRounds(r, comm, 20000, false);
  });
}

// Issue 25 (suspected): a device batch ordered its copies after the legacy
// default stream only, which does not wait for a non-blocking stream: a
// producer there still writing the pages had its stale bytes put and
// sealed. BatchOptions::stream orders the batch after the producer's
// stream, with no host synchronisation between.
TEST_P(GpuTest, AKvBatchPutStartsAfterItsProducersNonBlockingStream) {
  SKIP_WITHOUT_GPU();
  RunRanks(2, [](int r, Communicator& comm, allocator::Allocator& alloc) -> std::string {
    auto store = kv::Store::Open(alloc, {.create = true});
    if (!store.ok()) return store.status().ToString();
    if (r == 0) {
      constexpr size_t kBytes = 1 << 20;
      auto stream = gpu::StreamCreate();  // non-blocking
      if (!stream.ok()) return stream.status().ToString();
      auto dev = gpu::GpuAlloc(kBytes);
      if (!dev.ok()) return dev.status().ToString();
      std::vector<uint8_t> zero(kBytes, 0), back(kBytes);
      if (!gpu::CopySync(*dev, zero.data(), kBytes).ok()) return "zero";
      // The producer writes the page 200 ms late on its stream.
      absl::Status filled =
          ::cxlrt::testing::FillPatternAsync(*dev, kBytes / 4, 9, 200000, *stream);
      if (!filled.ok()) return filled.ToString();
      kv::BatchOptions o;
      o.stream = *stream;
      std::vector<kv::PutItem> items = {{"late", *dev, kBytes, {}}};
      for (const absl::Status& s : (*store)->BatchPut("gpu-stream", items, o)) {
        if (!s.ok()) return "BatchPut: " + s.ToString();
      }
      auto got = (*store)->Get("gpu-stream", "late", back.data(), kBytes);
      if (!got.ok()) return "Get: " + got.status().ToString();
      for (size_t i = 0; i < kBytes / 4; ++i) {
        uint32_t w;
        std::memcpy(&w, back.data() + 4 * i, 4);
        if (w != ::cxlrt::testing::PatternWord(9, i)) {
          return absl::StrCat("word ", i, " of the put page is ", w,
                              ": the put copied it before its producer's stream wrote it");
        }
      }
      (void)gpu::StreamSynchronize(*stream);
      gpu::StreamDestroy(*stream);
      gpu::GpuFree(*dev);
    }
    return comm.Barrier().ToString() == "OK" ? "" : "final barrier";
  });
}

TEST_P(GpuTest, KvBlocksPutFromDeviceMemoryAreGotIntoDeviceMemoryByAnotherHost) {
  SKIP_WITHOUT_GPU();
  RunRanks(2, [](int r, Communicator& comm, allocator::Allocator& alloc) -> std::string {
    auto store = kv::Store::Open(alloc, {.create = true});
    if (!store.ok()) return store.status().ToString();
    const std::vector<size_t> sizes = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20};
    std::vector<std::string> keys;
    size_t total = 0;
    for (size_t i = 0; i < 3 * sizes.size(); ++i) {
      keys.push_back(absl::StrCat("page-", i));
      total += sizes[i % sizes.size()];
    }
    std::vector<uint8_t> image(total);
    for (size_t i = 0; i < total / 4; ++i) {
      const uint32_t w = ::cxlrt::testing::PatternWord(7, i);
      std::memcpy(image.data() + 4 * i, &w, 4);
    }
    auto dev = gpu::GpuAlloc(total);
    if (!dev.ok()) return dev.status().ToString();
    auto* d = static_cast<uint8_t*>(*dev);
    if (r == 0) {
      if (!gpu::CopySync(d, image.data(), total).ok()) return "copy in";
      std::vector<kv::PutItem> items;
      for (size_t i = 0, at = 0; i < keys.size(); at += sizes[i % sizes.size()], ++i) {
        items.push_back({keys[i], d + at, sizes[i % sizes.size()], {}});
      }
      for (const absl::Status& s : (*store)->BatchPut("gpu", items)) {
        if (!s.ok()) return "BatchPut: " + s.ToString();
      }
      // Write-once: a second put of a key from device memory is refused.
      absl::Status again = (*store)->Put("gpu", keys[0], d, sizes[0]);
      if (again.code() != absl::StatusCode::kAlreadyExists) return "re-put: " + again.ToString();
    }
    if (absl::Status s = comm.Barrier(); !s.ok()) return s.ToString();
    if (r == 1) {
      std::vector<uint8_t> zero(total, 0);
      if (!gpu::CopySync(d, zero.data(), total).ok()) return "zero";
      std::vector<kv::GetItem> items;
      for (size_t i = 0, at = 0; i < keys.size(); at += sizes[i % sizes.size()], ++i) {
        items.push_back({keys[i], d + at, sizes[i % sizes.size()], {}});
      }
      items.push_back({"missing", d, sizes[0], {}});
      auto got = (*store)->BatchGet("gpu", items);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!got[i].ok())
          return absl::StrCat("BatchGet ", keys[i], ": ", got[i].status().ToString());
        if (*got[i] != sizes[i % sizes.size()]) return "wrong size";
      }
      if (got.back().status().code() != absl::StatusCode::kNotFound) {
        return "missing key: " + got.back().status().ToString();
      }
      std::vector<uint8_t> back(total);
      if (!gpu::CopySync(back.data(), d, total).ok()) return "copy out";
      if (back != image) return "the blocks got into device memory differ from those put";
      // Too small a destination: an error naming the size, nothing copied.
      auto small = (*store)->Get("gpu", keys[4], d, 100);
      if (small.status().code() != absl::StatusCode::kInvalidArgument) {
        return "small destination: " + small.status().ToString();
      }
    }
    gpu::GpuFree(d);
    return comm.Barrier().ToString() == "OK" ? "" : "final barrier";
  });
}

// A paged KV cache in GPU memory (vLLM's layout: per layer, K pages then V
// pages): each block is one value of every layer's pages, gathered by the
// copy engine straight into the pool and scattered into another rank's
// cache at other block ids. Parts in both kinds of memory are refused.
TEST_P(GpuTest, PagedKvBlocksInDeviceMemoryAreGatheredAndScattered) {
  SKIP_WITHOUT_GPU();
  RunRanks(2, [](int r, Communicator& comm, allocator::Allocator& alloc) -> std::string {
    auto store = kv::Store::Open(alloc, {.create = true});
    if (!store.ok()) return store.status().ToString();
    constexpr size_t kLayers = 3, kBlocks = 24, kPage = 32 << 10, kStored = 10;
    const size_t total = kLayers * 2 * kBlocks * kPage;  // [layer][k/v][block][page]
    std::vector<uint8_t> image(total);
    for (size_t i = 0; i < total / 4; ++i) {
      const uint32_t w = ::cxlrt::testing::PatternWord(11, i);
      std::memcpy(image.data() + 4 * i, &w, 4);
    }
    auto dev = gpu::GpuAlloc(total);
    if (!dev.ok()) return dev.status().ToString();
    auto* d = static_cast<uint8_t*>(*dev);
    auto page = [&](uint8_t* base, size_t layer, size_t kv, size_t block) {
      return base + ((layer * 2 + kv) * kBlocks + block) * kPage;
    };
    std::vector<std::string> keys;
    for (size_t b = 0; b < kStored; ++b) keys.push_back(absl::StrCat("block-", b));
    if (r == 0) {
      if (!gpu::CopySync(d, image.data(), total).ok()) return "copy in";
      std::vector<std::vector<kv::PutPart>> parts(kStored);
      std::vector<kv::PutItem> items;
      for (size_t b = 0; b < kStored; ++b) {
        for (size_t l = 0; l < kLayers; ++l) {
          for (size_t kv = 0; kv < 2; ++kv) parts[b].push_back({page(d, l, kv, b), kPage});
        }
        items.push_back({keys[b], nullptr, 0, parts[b]});
      }
      for (const absl::Status& s : (*store)->BatchPut("paged", items)) {
        if (!s.ok()) return "BatchPut: " + s.ToString();
      }
      std::vector<uint8_t> host(kPage);
      std::vector<kv::PutPart> mixed = {{d, kPage}, {host.data(), kPage}};
      std::vector<kv::PutItem> bad = {{"mixed", nullptr, 0, mixed}};
      absl::Status st = (*store)->BatchPut("paged", bad)[0];
      if (st.code() != absl::StatusCode::kInvalidArgument ||
          !absl::StrContains(st.message(), "both GPU and host memory")) {
        return "mixed parts: " + st.ToString();
      }
    }
    if (absl::Status s = comm.Barrier(); !s.ok()) return s.ToString();
    if (r == 1) {
      std::vector<uint8_t> zero(total, 0);
      if (!gpu::CopySync(d, zero.data(), total).ok()) return "zero";
      // Block b goes to block b + 7 here (another server's allocation).
      std::vector<std::vector<kv::GetPart>> parts(kStored);
      std::vector<kv::GetItem> items;
      for (size_t b = 0; b < kStored; ++b) {
        for (size_t l = 0; l < kLayers; ++l) {
          for (size_t kv = 0; kv < 2; ++kv) parts[b].push_back({page(d, l, kv, b + 7), kPage});
        }
        items.push_back({keys[b], nullptr, 0, parts[b]});
      }
      // Told that the pages are GPU memory: no query per page.
      auto got = (*store)->BatchGet("paged", items, {.memory = runtime::MemoryKind::kGpu});
      for (size_t b = 0; b < kStored; ++b) {
        if (!got[b].ok())
          return absl::StrCat("BatchGet ", keys[b], ": ", got[b].status().ToString());
      }
      // Told wrong: refused before anything is copied.
      auto lie = (*store)->BatchGet("paged", absl::MakeConstSpan(items.data(), 1),
                                    {.memory = runtime::MemoryKind::kHost});
      if (lie[0].status().code() != absl::StatusCode::kInvalidArgument) {
        return "pages said to be host memory: " + lie[0].status().ToString();
      }
      std::vector<uint8_t> back(total);
      if (!gpu::CopySync(back.data(), d, total).ok()) return "copy out";
      for (size_t l = 0; l < kLayers; ++l) {
        for (size_t kv = 0; kv < 2; ++kv) {
          for (size_t b = 0; b < kBlocks; ++b) {
            const bool loaded = b >= 7 && b < 7 + kStored;
            const uint8_t* want = loaded ? page(image.data(), l, kv, b - 7) : zero.data();
            if (std::memcmp(page(back.data(), l, kv, b), want, kPage) != 0) {
              return absl::StrCat("layer ", l, " ", kv ? "V" : "K", " block ", b, " differs");
            }
          }
        }
      }
    }
    gpu::GpuFree(d);
    return comm.Barrier().ToString() == "OK" ? "" : "final barrier";
  });
}

TEST_P(GpuTest, ARankKilledMidTransferAbortsTheOthersNamingIt) {
  SKIP_WITHOUT_GPU();
  collectives::CommOptions o;
  o.timeout = absl::Seconds(30);
  RunRanks(
      3,
      [](int r, Communicator& comm, allocator::Allocator&) -> std::string {
        const size_t n = 16 << 20;
        auto a = gpu::GpuAlloc(n * 4);
        auto b = gpu::GpuAlloc(n * 4);
        if (!a.ok() || !b.ok()) return "DeviceAlloc";
        if (r == 2) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:40");
          if (!armed.ok()) return armed.ToString();
        }
        const absl::Time start = absl::Now();
        absl::Status s;
        for (int i = 0; i < 20 && s.ok(); ++i) {
          s = comm.AllReduce(*a, *b, n, DataType::kFloat32, RedOp::kSum);
        }
        if (r == 2) return "rank 2 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 2") == std::string::npos) {
          return "does not name rank 2: " + s.ToString();
        }
        if (absl::Now() - start > absl::Seconds(20)) return "took too long to notice";
        comm.Abort();
        return "";
      },
      [](int r) { return r == 2 ? runtime::kFaultExitCode : 0; }, o);
}

// Runs `body` in a child attached to a fresh pool, with a device engine
// over it; the child's error, or "".
std::string InChildWithEngine(
    const std::function<std::string(allocator::Allocator&, collectives::GpuCopyEngine&)>& body) {
  ::cxlrt::testing::TempDir dir;
  const std::string create = ::cxlrt::testing::PoolUri(dir, "", "256M");
  if (auto p = runtime::Pool::Create(create); !p.ok()) return p.status().ToString();
  char* err = static_cast<char*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(err, 0, 4096);
  pid_t pid = Spawn([&]() -> int {
    auto h = ::cxlrt::testing::AttachTestHost(::cxlrt::testing::OpenUri(create), {});
    std::string e;
    if (!h.ok()) {
      e = h.status().ToString();
    } else {
      runtime::Pool& pool = h->alloc->pool();
      auto engine =
          collectives::MakeGpuCopyEngine(pool.coherence(), pool.backend().base(), pool.size());
      e = engine.ok() ? body(*h->alloc, **engine) : engine.status().ToString();
    }
    std::snprintf(err, 4095, "%s", e.c_str());
    return e.empty() ? 0 : 1;
  });
  const int rc = WaitExit(pid, absl::Seconds(120));
  std::string out = rc == 0 ? "" : absl::StrCat("exit ", rc, ": ", err);
  munmap(err, 4096);
  return out;
}

// A device reduction of more sources than the small launch holds (32)
// passes all 1024 pointers (8 KiB of kernel parameters): 33 and 100
// sources, half of them in the pool (staged), match the CPU kernels bit for
// bit, as 3 sources do.
TEST(GpuReduceTest, ReductionsOfManySourcesMatchTheCpuKernels) {
  SKIP_WITHOUT_GPU();
  const std::string err = InChildWithEngine([](allocator::Allocator& alloc,
                                               collectives::GpuCopyEngine& e) -> std::string {
    constexpr size_t kCount = 4099;  // not a multiple of the vector width
    uint8_t* base = alloc.pool().backend().base();
    for (int n : {3, 33, 100}) {
      for (auto [type, op] :
           {std::pair{DataType::kFloat32, RedOp::kSum}, std::pair{DataType::kBfloat16, RedOp::kAvg},
            std::pair{DataType::kInt32, RedOp::kMax}}) {
        const size_t bytes = kCount * collectives::SizeOf(type);
        std::vector<std::vector<uint8_t>> host(n, std::vector<uint8_t>(bytes));
        std::vector<const void*> host_srcs, dev_srcs;
        std::vector<void*> owned;
        for (int i = 0; i < n; ++i) {
          FillValues(type, host[i].data(), kCount, 1000 * n + i);
          host_srcs.push_back(host[i].data());
          void* at = nullptr;
          if (i % 2 == 1) {  // in the pool
            auto off = alloc.Allocate(bytes, {.alignment = 64});
            if (!off.ok()) return off.status().ToString();
            at = base + *off;
            std::memcpy(at, host[i].data(), bytes);
          } else {
            auto d = gpu::GpuAlloc(bytes);
            if (!d.ok()) return d.status().ToString();
            owned.push_back(*d);
            at = *d;
            if (!gpu::CopySync(at, host[i].data(), bytes).ok()) return "copy in";
          }
          dev_srcs.push_back(at);
        }
        std::vector<uint8_t> want(bytes), got(bytes);
        collectives::Reduce(type, op, want.data(), host_srcs.data(), n, kCount, n);
        auto out = gpu::GpuAlloc(bytes);
        if (!out.ok()) return out.status().ToString();
        owned.push_back(*out);
        absl::Status st = e.Wait(e.Reduce(type, op, *out, dev_srcs.data(), n, kCount, n),
                                 absl::Now() + absl::Seconds(30));
        if (st.ok()) st = gpu::CopySync(got.data(), *out, bytes);
        for (void* p : owned) gpu::GpuFree(p);
        if (!st.ok()) return absl::StrCat(n, " sources: ", st.ToString());
        if (got != want) {
          return absl::StrCat(n, " sources of ", collectives::DataTypeName(type),
                              ": the device result differs from the CPU kernels'");
        }
      }
    }
    return "";
  });
  EXPECT_EQ(err, "");
}

// Every way of ringing a doorbell (bench::Doorbell) carries the
// bytes: a ping-pong through the pool gets the last round's bytes back
// exactly, at one word and at a page. Only the stream memory operations may
// be missing from a driver, and then say so.
TEST(GpuDoorbellTest, EveryDoorbellDeliversTheBytesBehindIt) {
  SKIP_WITHOUT_GPU();
  const std::string err = InChildWithEngine(
      [](allocator::Allocator& alloc, collectives::GpuCopyEngine&) -> std::string {
        uint8_t* base = alloc.pool().backend().base();
        auto a = alloc.Allocate(1 << 20, {.alignment = 4096});
        auto b = alloc.Allocate(1 << 20, {.alignment = 4096});
        auto f = alloc.Allocate(4096, {.alignment = 4096});
        if (!a.ok() || !b.ok() || !f.ok()) return "pool buffers";
        auto* flag_a = reinterpret_cast<uint64_t*>(base + *f);
        for (bench::Doorbell d : bench::kDoorbells) {
          for (size_t n : {size_t{8}, size_t{4096}, size_t{1} << 20}) {
            auto t = bench::TimePingPong(d, base + *a, base + *b, flag_a, flag_a + 32, n, 7, 2);
            const std::string what = absl::StrCat(bench::DoorbellName(d), " at ", n, ": ");
            if (!t.ok() && !(d == bench::Doorbell::kMemop &&
                             t.status().code() == absl::StatusCode::kUnavailable)) {
              return what + t.status().ToString();
            }
            if (t.ok() && t->wrong_bytes != 0) {
              return absl::StrCat(what, t->wrong_bytes, " bytes came back wrong");
            }
          }
        }
        return "";
      });
  EXPECT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(Domains, GpuTest,
                         ::testing::Values(CoherenceDomain::kHardware, CoherenceDomain::kSimulated),
                         [](const auto& info) {
                           return std::string(runtime::CoherenceDomainName(info.param));
                         });

}  // namespace
}  // namespace cxlrt
