// Collectives across emulated hosts (forked processes): every collective x
// type x op x size x rank count, out of place and in place, checked bit for
// bit against a reference computed here element by element; pool-resident
// (zero-copy) buffers; mismatched calls; a rank killed mid-collective;
// timeouts; many back-to-back calls; two communicators at once; Send/Recv.
// Both the hardware and the simulated coherence domain.
#include "cxlrt/collectives/communicator.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_layout.h"
#include "cxlrt/collectives/copy_engine.h"
#include "gtest/gtest.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/membership.h"
#include "tests/collectives/late_engine.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::WaitExit;
using runtime::CoherenceDomain;

// --- The reference: element by element, written apart from the kernels. ---

uint16_t RefBf16(float f) {
  // Nearest bfloat16, ties to even, by comparing the two candidates.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dlo = std::abs(double(f) - flo), dhi = std::abs(double(fhi) - f);
  if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0)) return lo >> 16;
  return hi >> 16;
}
float FromBf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Input element i of rank r, as a double (small integers and halves, so
// sums stay exact; products of 16-bit floats round only at the end).
double Value(DataType t, int r, size_t i) {
  const long k = static_cast<long>((r * 131 + i * 7 + i / 5) % 9);
  switch (t) {
    case DataType::kUint8:
    case DataType::kUint32:
    case DataType::kUint64:
      return static_cast<double>(k);  // 0..8
    case DataType::kInt8:
    case DataType::kInt32:
    case DataType::kInt64:
      return static_cast<double>(k - 4);
    default:
      return (k - 4) * 0.5;
  }
}

void Store(DataType t, void* buf, size_t i, double v) {
  auto* b = static_cast<uint8_t*>(buf);
  switch (t) {
    case DataType::kInt8:
      reinterpret_cast<int8_t*>(b)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUint8:
      b[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt32:
      reinterpret_cast<int32_t*>(b)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kUint32:
      reinterpret_cast<uint32_t*>(b)[i] = static_cast<uint32_t>(v);
      break;
    case DataType::kInt64:
      reinterpret_cast<int64_t*>(b)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kUint64:
      reinterpret_cast<uint64_t*>(b)[i] = static_cast<uint64_t>(v);
      break;
    case DataType::kFloat16:
      reinterpret_cast<Half*>(b)[i] = static_cast<Half>(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      reinterpret_cast<uint16_t*>(b)[i] = RefBf16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      reinterpret_cast<float*>(b)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      reinterpret_cast<double*>(b)[i] = v;
      break;
  }
}

// Reduction of element i over ranks 0..n-1 in order, stored at out[o].
void RefReduce(DataType t, RedOp op, int n, size_t i, void* out, size_t o) {
  auto fold = [&](auto acc, auto conv) {
    using A = decltype(acc);
    acc = conv(Value(t, 0, i));
    for (int r = 1; r < n; ++r) {
      const A v = conv(Value(t, r, i));
      switch (op) {
        case RedOp::kSum:
        case RedOp::kAvg:
          acc = acc + v;
          break;
        case RedOp::kProd:
          acc = acc * v;
          break;
        case RedOp::kMin:
          acc = v < acc ? v : acc;
          break;
        case RedOp::kMax:
          acc = v > acc ? v : acc;
          break;
      }
    }
    if (op == RedOp::kAvg) acc = acc / static_cast<A>(n);
    return acc;
  };
  auto* b = static_cast<uint8_t*>(out);
  const bool is_signed = t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
  const int bits = t == DataType::kInt8 || t == DataType::kUint8     ? 8
                   : t == DataType::kInt32 || t == DataType::kUint32 ? 32
                                                                     : 64;
  switch (t) {
    case DataType::kFloat16: {
      const float f = fold(0.0f, [&](double v) { return static_cast<float>(v); });
      reinterpret_cast<Half*>(b)[o] = static_cast<Half>(f);
      return;
    }
    case DataType::kBfloat16: {
      const float f =
          fold(0.0f, [&](double v) { return FromBf16(RefBf16(static_cast<float>(v))); });
      reinterpret_cast<uint16_t*>(b)[o] = RefBf16(f);
      return;
    }
    case DataType::kFloat32:
      reinterpret_cast<float*>(b)[o] = fold(0.0f, [](double v) { return static_cast<float>(v); });
      return;
    case DataType::kFloat64:
      reinterpret_cast<double*>(b)[o] = fold(0.0, [](double v) { return v; });
      return;
    default:
      break;
  }
  // Integers: wrap-around arithmetic at the type's width (sum and prod),
  // signed comparison for min and max, division toward zero for avg.
  if (op == RedOp::kMin || op == RedOp::kMax || op == RedOp::kAvg) {
    if (op == RedOp::kAvg) {
      // avg = (wrapped sum) / n: the sum is small here, so no wrap happens.
      long long s = 0;
      for (int r = 0; r < n; ++r) s += static_cast<long long>(Value(t, r, i));
      Store(t, out, o, static_cast<double>(s / n));
      return;
    }
    double m = Value(t, 0, i);
    for (int r = 1; r < n; ++r) {
      const double v = Value(t, r, i);
      m = op == RedOp::kMin ? std::min(m, v) : std::max(m, v);
    }
    Store(t, out, o, m);
    return;
  }
  uint64_t acc = static_cast<uint64_t>(static_cast<int64_t>(Value(t, 0, i)));
  for (int r = 1; r < n; ++r) {
    const uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(Value(t, r, i)));
    acc = op == RedOp::kProd ? acc * v : acc + v;
  }
  if (bits < 64) acc &= (uint64_t{1} << bits) - 1;
  (void)is_signed;  // the low bits are the same for signed and unsigned
  std::memcpy(b + o * SizeOf(t), &acc, SizeOf(t));  // little-endian: the low bytes
}

// --- One rank's run of a case. ---

struct Case {
  CollKind kind;
  DataType type;
  RedOp op;
  size_t count;  // NCCL's count argument of the call
  int root;
  bool in_place;
  bool in_pool;        // buffers from comm.Allocate (zero-copy)
  bool mixed = false;  // in_pool on rank 0 only: ranks disagree on zero-copy
};

std::string Name(const Case& c) {
  return absl::StrCat(CollKindName(c.kind), "(", c.count, " ", DataTypeName(c.type), " ",
                      RedOpName(c.op), " root ", c.root, c.in_place ? " in place" : "",
                      c.in_pool ? " pool-resident" : "", ")");
}

// Elements of the send and receive buffers of `c` at a rank of n.
std::pair<size_t, size_t> Sizes(const Case& c, int n) {
  switch (c.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return {c.count, c.count};
    case CollKind::kReduceScatter:
      return {c.count * n, c.count};
    case CollKind::kAllGather:
    case CollKind::kGather:
      return {c.count, c.count * n};
    case CollKind::kScatter:
      return {c.count * n, c.count};
    case CollKind::kAllToAll:
      return {c.count * n, c.count * n};
    case CollKind::kBarrier:
    case CollKind::kAllToAllV:  // its own tests (AllToAllV*): counts per pair
      return {0, 0};
  }
  return {0, 0};
}

// Runs `c` on `comm` and checks the result. Returns "" or what was wrong.
// `pool`: the rank's pool; inputs in pool-resident buffers that are posted
// in place (out of place) are written through its coherence layer: in the
// simulated domain they then sit in this host's cache until the collective
// writes them back, so a missing write-back shows as wrong bytes at peers.
std::string RunCase(Communicator& comm, const Case& c, runtime::Pool& pool) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = SizeOf(c.type);
  auto [scount, rcount] = Sizes(c, n);
  // In place: one buffer, as big as the larger side.
  const size_t big = std::max(scount, rcount);
  std::vector<uint8_t> own_send, own_recv;
  uint8_t *send = nullptr, *recv = nullptr;
  std::vector<void*> pool_bufs;
  const bool in_pool = c.in_pool && (!c.mixed || r == 0);
  auto buffer = [&](size_t elems, std::vector<uint8_t>& own) -> uint8_t* {
    if (in_pool) {
      auto p = comm.Allocate(std::max<size_t>(elems * es, 1));
      if (!p.ok()) return nullptr;
      pool_bufs.push_back(*p);
      return static_cast<uint8_t*>(*p);
    }
    own.assign(std::max<size_t>(elems * es, 1), 0xEE);
    return own.data();
  };
  if (c.in_place) {
    recv = buffer(big, own_recv);
    if (!recv) return "allocating a pool buffer failed";
    std::memset(recv, 0xEE, big * es);
    // NCCL's in-place conventions.
    size_t at = 0;
    if (c.kind == CollKind::kAllGather || c.kind == CollKind::kGather) at = r * c.count;
    send = recv + at * es;
    if (c.kind == CollKind::kReduceScatter || c.kind == CollKind::kScatter) {
      recv = send + r * c.count * es;
    }
  } else {
    send = buffer(scount, own_send);
    recv = buffer(rcount, own_recv);
    if (!send || !recv) return "allocating a pool buffer failed";
    std::memset(recv, 0xEE, std::max<size_t>(rcount * es, 1));
  }
  // Inputs: element i of rank r's send buffer is Value(r, i) (for Scatter
  // only the root's matters; for rooted collectives the same values).
  if (in_pool && !c.in_place && scount > 0) {  // posted in place: peers read it where it is
    std::vector<uint8_t> input(scount * es);
    for (size_t i = 0; i < scount; ++i) Store(c.type, input.data(), i, Value(c.type, r, i));
    const auto at = static_cast<runtime::PoolOffset>(send - pool.backend().base());
    // Lines this host cached in an earlier case (the block was another
    // buffer then, written since by plain stores) are dropped first: the
    // write-back of the post would otherwise put their stale words back.
    pool.coherence().Invalidate(at, input.size());
    pool.coherence().Write(at, input.data(), input.size());
  } else {
    for (size_t i = 0; i < scount; ++i) Store(c.type, send, i, Value(c.type, r, i));
  }

  absl::Status s;
  switch (c.kind) {
    case CollKind::kAllReduce:
      s = comm.AllReduce(send, recv, c.count, c.type, c.op);
      break;
    case CollKind::kReduceScatter:
      s = comm.ReduceScatter(send, recv, c.count, c.type, c.op);
      break;
    case CollKind::kAllGather:
      s = comm.AllGather(send, recv, c.count, c.type);
      break;
    case CollKind::kBroadcast:
      s = comm.Broadcast(send, recv, c.count, c.type, c.root);
      break;
    case CollKind::kReduce:
      s = comm.Reduce(send, recv, c.count, c.type, c.op, c.root);
      break;
    case CollKind::kGather:
      s = comm.Gather(send, recv, c.count, c.type, c.root);
      break;
    case CollKind::kScatter:
      s = comm.Scatter(send, recv, c.count, c.type, c.root);
      break;
    case CollKind::kAllToAll:
      s = comm.AllToAll(send, recv, c.count, c.type);
      break;
    case CollKind::kBarrier:
    case CollKind::kAllToAllV:  // not in the matrix
      s = comm.Barrier();
      break;
  }
  if (!s.ok()) return absl::StrCat(Name(c), " at rank ", r, ": ", s.ToString());

  // Expected receive buffer.
  std::vector<uint8_t> want(std::max<size_t>(rcount * es, 1), 0xEE);
  bool check = true;
  switch (c.kind) {
    case CollKind::kAllReduce:
      for (size_t i = 0; i < c.count; ++i) RefReduce(c.type, c.op, n, i, want.data(), i);
      break;
    case CollKind::kReduceScatter:
      for (size_t i = 0; i < c.count; ++i) {
        RefReduce(c.type, c.op, n, r * c.count + i, want.data(), i);
      }
      break;
    case CollKind::kAllGather:
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < c.count; ++i) {
          Store(c.type, want.data(), j * c.count + i, Value(c.type, j, i));
        }
      }
      break;
    case CollKind::kBroadcast:
      for (size_t i = 0; i < c.count; ++i) Store(c.type, want.data(), i, Value(c.type, c.root, i));
      break;
    case CollKind::kReduce:
      check = r == c.root;
      for (size_t i = 0; i < c.count; ++i) RefReduce(c.type, c.op, n, i, want.data(), i);
      break;
    case CollKind::kGather:
      check = r == c.root;
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < c.count; ++i) {
          Store(c.type, want.data(), j * c.count + i, Value(c.type, j, i));
        }
      }
      break;
    case CollKind::kScatter:
      for (size_t i = 0; i < c.count; ++i) {
        Store(c.type, want.data(), i, Value(c.type, c.root, r * c.count + i));
      }
      break;
    case CollKind::kAllToAll:
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < c.count; ++i) {
          Store(c.type, want.data(), j * c.count + i, Value(c.type, j, r * c.count + i));
        }
      }
      break;
    case CollKind::kBarrier:
    case CollKind::kAllToAllV:
      check = false;
      break;
  }
  std::string err;
  if (check && rcount > 0 && std::memcmp(want.data(), recv, rcount * es) != 0) {
    size_t bad = 0;
    while (bad < rcount * es && want[bad] == recv[bad]) ++bad;
    err = absl::StrCat(Name(c), " at rank ", r, " of ", n, ": wrong byte ", bad, " (element ",
                       bad / es, "): got 0x", absl::Hex(recv[bad]), ", want 0x",
                       absl::Hex(want[bad]));
  }
  for (void* p : pool_bufs) (void)comm.Free(p);
  return err;
}

// --- Running ranks as processes. ---

struct RankHost {
  std::unique_ptr<runtime::Pool> pool;
  std::unique_ptr<runtime::Membership> membership;
  std::unique_ptr<allocator::Allocator> alloc;
};

absl::StatusOr<RankHost> OpenRankHost(const std::string& uri,
                                      absl::Duration lease = absl::Milliseconds(1000)) {
  RankHost h;
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) return pool.status();
  h.pool = std::move(*pool);
  runtime::AttachOptions ao;
  ao.host_id = -1;
  ao.lease = lease;
  ao.heartbeat = absl::Milliseconds(50);
  auto m = runtime::Membership::Attach(*h.pool, ao);
  if (!m.ok()) return m.status();
  h.membership = std::move(*m);
  auto a = allocator::Allocator::Open(*h.pool, *h.membership);
  if (!a.ok()) return a.status();
  h.alloc = std::move(*a);
  return h;
}

// Waits up to `within` for rank 0 of `name` to publish its header; returns the
// block and header, or nullopt.
std::optional<std::pair<allocator::NamedBlock, CommHeaderLayout>> AwaitHeader(
    RankHost& h, const std::string& name, absl::Duration within) {
  runtime::Coherence& c = h.pool->coherence();
  const absl::Time end = absl::Now() + within;
  while (absl::Now() < end) {
    auto b = h.alloc->Find(name);
    if (b.ok()) {
      auto hdr = c.FetchObject<CommHeaderLayout>(b->offset);
      if (hdr.magic == kCommMagic) return std::make_pair(*b, hdr);
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return std::nullopt;
}

// Body of the lifecycle tests: 30 rounds of Create / AllReduce / Destroy
// of one name, with a canary block in the freed block's place.
std::string CycleCommunicators(Communicator& comm, allocator::Allocator& alloc, bool one_core) {
  if (one_core) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof(one), &one);
  }
  const int r = comm.rank(), n = comm.size();
  runtime::Coherence& c = alloc.pool().coherence();
  runtime::PoolOffset canary = 0;
  uint64_t canary_size = 0;
  auto canary_intact = [&]() -> std::string {
    std::vector<uint8_t> got(canary_size);
    c.Fetch(got.data(), canary, canary_size);
    for (uint64_t i = 0; i < canary_size; ++i) {
      if (got[i] != static_cast<uint8_t>(0xA5 ^ i)) {
        return absl::StrCat("canary byte ", i, " of the block freed by Destroy changed to ", got[i],
                            ": a rank wrote a freed communicator block");
      }
    }
    return "";
  };
  // Small Send/Recv channels: rank 0 fills and checks a canary the size of
  // the block every round, which with the default channels (9 MiB for 3
  // ranks) starves the others' heartbeats on one core under a sanitizer
  // past their lease (docs/allocator.md, "Limits").
  CommOptions small;
  small.p2p_bytes = 64 << 10;
  for (int it = 0; it < 30; ++it) {
    auto cy = Communicator::Create(alloc, "cycle", n, r, small);
    if (!cy.ok()) return absl::StrCat("round ", it, " Create: ", cy.status().ToString());
    uint64_t block_size = 0;
    if (r == 0) {
      auto b = alloc.Find("comm/cycle");
      if (!b.ok()) return b.status().ToString();
      block_size = b->size;
    }
    for (int call = 0; call < 3; ++call) {
      const int64_t x = 1000 * (it + 1) + r + call, want_base = 1000 * (it + 1) + call;
      int64_t y = 0;
      absl::Status s = (*cy)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
      if (!s.ok()) return absl::StrCat("round ", it, " AllReduce: ", s.ToString());
      const int64_t want = want_base * n + n * (n - 1) / 2;
      if (y != want) return absl::StrCat("round ", it, " AllReduce gave ", y, ", want ", want);
    }
    if (absl::Status d = (*cy)->Destroy(); !d.ok()) {
      return absl::StrCat("round ", it, " Destroy: ", d.ToString());
    }
    if (r == 0) {
      if (canary != 0) {
        if (std::string e = canary_intact(); !e.empty()) return e;
        (void)alloc.Free(canary);
      }
      auto got = alloc.Allocate(block_size, {.alignment = 2 << 20});
      if (!got.ok()) return got.status().ToString();
      canary = *got;
      canary_size = block_size;
      std::vector<uint8_t> fill(canary_size);
      for (uint64_t i = 0; i < canary_size; ++i) fill[i] = static_cast<uint8_t>(0xA5 ^ i);
      c.CopyToPool(canary, fill.data(), fill.size());
    }
  }
  // The others' last writes land before they leave the outer barrier.
  if (absl::Status s = comm.Barrier(); !s.ok()) return s.ToString();
  if (r == 0) {
    if (std::string e = canary_intact(); !e.empty()) return e;
    (void)alloc.Free(canary);
  }
  return "";
}

class CollectivesTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  // More URI parameters for the pool (subclasses).
  virtual std::string Extra() const { return ""; }
  void SetUp() override {
    create_ =
        PoolUri(dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam()), Extra()),
                "512M");
    auto p = runtime::Pool::Create(create_);
    ASSERT_TRUE(p.ok()) << p.status();
    uri_ = OpenUri(create_);
    // Children report their first failure here.
    errors_ = static_cast<char*>(
        mmap(nullptr, kErrBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(errors_, MAP_FAILED);
  }
  void TearDown() override { munmap(errors_, kErrBytes); }

  // Runs `body(comm, alloc)` in `n` rank processes over one communicator;
  // fails the test with a rank's error text. `body` returns "" for
  // success; rank r must exit with `expect_rc(r)` (0 by default).
  using Body = std::function<std::string(Communicator&, allocator::Allocator&)>;
  void RunRanks(int n, const Body& body, absl::Duration timeout = absl::Seconds(240),
                const CommOptions& options = {}, const std::string& name = "test",
                const std::function<int(int)>& expect_rc = nullptr) {
    std::memset(errors_, 0, kErrBytes);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      pids.push_back(Spawn([&, r]() -> int {
        auto h = OpenRankHost(uri_, rank_lease_);
        std::string err;
        if (!h.ok()) {
          err = h.status().ToString();
        } else {
          std::unique_ptr<CopyEngine> engine;
          CommOptions o = options;
          if (engine_factory_) {
            engine = engine_factory_(h->pool->coherence(), r);
            o.engine = engine.get();
          }
          auto comm = Communicator::Create(*h->alloc, name, n, r, o);
          if (!comm.ok()) {
            err = comm.status().ToString();
          } else {
            err = body(**comm, *h->alloc);
            if (err.empty() && !(*comm)->destroyed()) {
              absl::Status d = (*comm)->Destroy();
              if (!d.ok()) err = "Destroy: " + d.ToString();
            }
          }
        }
        if (err.empty()) return 0;
        std::snprintf(errors_ + r * kErrPerRank, kErrPerRank - 1, "rank %d: %s", r, err.c_str());
        return 1;
      }));
    }
    for (int r = 0; r < n; ++r) {
      const int rc = WaitExit(pids[r], timeout);
      EXPECT_EQ(rc, expect_rc ? expect_rc(r) : 0)
          << "rank " << r << " exit " << rc << ": " << errors_ + r * kErrPerRank;
    }
  }

  static constexpr size_t kErrPerRank = 1024;
  static constexpr size_t kErrBytes = 8 * kErrPerRank;
  // Set: every rank's communicator moves its bytes through the engine this
  // makes (for rank r, over its pool).
  std::function<std::unique_ptr<CopyEngine>(runtime::Coherence&, int)> engine_factory_;
  // The ranks' membership lease: short, so that tests of dead ranks end
  // quickly; long where many ranks share the cores and a starved heartbeat
  // must not get a live rank fenced.
  absl::Duration rank_lease_ = absl::Milliseconds(1000);
  TempDir dir_;
  std::string create_, uri_;
  char* errors_ = nullptr;
};

std::vector<CollKind> AllKinds() {
  return {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather,
          CollKind::kBroadcast, CollKind::kReduce,        CollKind::kGather,
          CollKind::kScatter,   CollKind::kAllToAll,      CollKind::kBarrier};
}
bool Reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter;
}
bool Rooted(CollKind k) {
  return k == CollKind::kBroadcast || k == CollKind::kReduce || k == CollKind::kGather ||
         k == CollKind::kScatter;
}

// Every collective x type x op at small counts (0, 1, odd, not divisible by
// the rank count), out of place and in place; then large messages (1 MiB
// and 16 MiB) for a few types, which cross the one-shot / two-shot switch
// and the slot-size chunking; then pool-resident buffers.
std::vector<Case> Matrix(int n, bool full) {
  std::vector<Case> cases;
  const size_t small[] = {0, 1, 7, 1001};
  for (CollKind k : AllKinds()) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      const auto type = static_cast<DataType>(t);
      const int ops = Reduces(k) ? kNumRedOps : 1;
      for (int o = 0; o < ops; ++o) {
        for (size_t count : small) {
          if (!full && count != 1001 && !(count == 1 && t == 0)) continue;
          for (bool in_place : {false, true}) {
            const int root = Rooted(k) ? static_cast<int>(count % n) : -1;
            cases.push_back({k, type, static_cast<RedOp>(o), count, root, in_place, false});
          }
        }
        if (k == CollKind::kBarrier) break;
      }
      if (k == CollKind::kBarrier) break;
    }
  }
  struct Big {
    DataType type;
    RedOp op;
  };
  const std::vector<Big> bigs = full ? std::vector<Big>{{DataType::kFloat32, RedOp::kSum},
                                                        {DataType::kBfloat16, RedOp::kAvg},
                                                        {DataType::kInt8, RedOp::kMax}}
                                     : std::vector<Big>{{DataType::kFloat32, RedOp::kSum}};
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
    if (!full && bytes > (1u << 20)) continue;
    for (CollKind k : AllKinds()) {
      if (k == CollKind::kBarrier) continue;
      for (const Big& b : bigs) {
        if (!Reduces(k) && b.op != bigs[0].op) continue;
        // Per-rank counts for the scattering collectives, so every buffer
        // stays near `bytes`.
        size_t count = bytes / SizeOf(b.type);
        if (k == CollKind::kReduceScatter || k == CollKind::kAllGather || k == CollKind::kGather ||
            k == CollKind::kScatter || k == CollKind::kAllToAll) {
          count = count / n + 3;
        }
        cases.push_back({k, b.type, b.op, count + 1, Rooted(k) ? n - 1 : -1, false, false});
        if (k == CollKind::kAllReduce) {
          cases.push_back({k, b.type, b.op, count, -1, true, false});
        }
      }
    }
  }
  // Two-shot all-reduce in one chunk (posts A0 B0: B0 must wait for A0's
  // reduction), private and pool-resident.
  for (bool in_pool : {false, true}) {
    for (bool in_place : {false, true}) {
      cases.push_back(
          {CollKind::kAllReduce, DataType::kFloat32, RedOp::kSum, 100003, -1, in_place, in_pool});
    }
  }
  // Zero-copy: one-shot and two-shot all-reduce, all-gather, broadcast.
  for (bool in_place : {false, true}) {
    cases.push_back(
        {CollKind::kAllReduce, DataType::kFloat32, RedOp::kSum, 1000, -1, in_place, true});
    cases.push_back({CollKind::kAllReduce, DataType::kFloat32, RedOp::kSum, (4u << 20) / 4 + 5, -1,
                     in_place, true});
  }
  cases.push_back({CollKind::kAllGather, DataType::kFloat32, RedOp::kSum, 100000, -1, false, true});
  cases.push_back({CollKind::kBroadcast, DataType::kFloat64, RedOp::kSum, 300000, 0, false, true});
  return cases;
}

std::string RunAll(Communicator& comm, const std::vector<Case>& cases, runtime::Pool& pool) {
  for (const Case& c : cases) {
    std::string err = RunCase(comm, c, pool);
    if (!err.empty()) return err;
  }
  return "";
}

TEST_P(CollectivesTest, EveryCollectiveTypeOpAndSizeIsExactOnOneToFourRanks) {
  // No rank dies here: a 10 s lease keeps a heartbeat starved under ASan on
  // 2 cores from getting a live rank fenced (seen once; see below).
  rank_lease_ = absl::Seconds(10);
  const bool full = GetParam() == CoherenceDomain::kHardware;
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    const auto cases = Matrix(n, full);
    RunRanks(n, [&](Communicator& comm, allocator::Allocator& alloc) {
      return RunAll(comm, cases, alloc.pool());
    });
    if (HasFailure()) return;
  }
}

TEST_P(CollectivesTest, EightRanksOnTwoCoresCompleteEveryCollective) {
  // More ranks than cores: waits must yield, nobody livelocks. Under a
  // sanitizer, beside other tests, a heartbeat thread can starve past a
  // 1 s lease: a survivor then fences a live rank and recovers its arena
  // while the rank's allocator tick still writes it (the simulated domain
  // aborts on that write-back: the window of docs/allocator.md, "Limits").
  rank_lease_ = absl::Seconds(10);
  const auto cases = Matrix(8, false);
  RunRanks(8, [&](Communicator& comm, allocator::Allocator& alloc) {
    return RunAll(comm, cases, alloc.pool());
  });
}

// Cases for the pipeline tests: every collective over many chunks, private
// and pool-resident, out of place and in place.
std::vector<Case> PipelineCases() {
  std::vector<Case> cases;
  for (CollKind k : AllKinds()) {
    for (bool in_pool : {false, true}) {
      for (bool in_place : {false, true}) {
        cases.push_back(
            {k, DataType::kFloat32, RedOp::kSum, 5000, Rooted(k) ? 1 : -1, in_place, in_pool});
      }
    }
  }
  cases.push_back({CollKind::kAllReduce, DataType::kFloat16, RedOp::kProd, 7777, -1, true, false});
  cases.push_back({CollKind::kAllReduce, DataType::kInt64, RedOp::kMax, 3001, -1, false, true});
  return cases;
}

TEST_P(CollectivesTest, SmallSlotsPipelineLargeMessagesThroughManyChunks) {
  // Slots of 4 KiB against messages of 20 KiB and more: tens of chunks in
  // flight per call, at the shallowest and the deepest ring, and with
  // chunks smaller than the slot.
  const auto cases = PipelineCases();
  for (uint32_t depth : {2u, 8u}) {
    for (uint64_t chunk : {uint64_t{0}, uint64_t{1000}}) {
      SCOPED_TRACE(absl::StrCat("depth ", depth, ", chunk ", chunk));
      CommOptions o;
      o.slot_bytes = 4096;
      o.oneshot_max = 256;
      o.depth = depth;
      o.chunk_bytes = chunk;
      RunRanks(
          3,
          [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
            const uint64_t before = comm.posts();
            std::string e = RunAll(comm, cases, alloc.pool());
            if (e.empty() && comm.posts() - before < 5 * cases.size()) {
              return absl::StrCat(comm.posts() - before, " posts for ", cases.size(),
                                  " calls: the messages did not go in many chunks");
            }
            return e;
          },
          absl::Seconds(120), o);
      if (HasFailure()) return;
    }
  }
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactWhenTheEngineCompletesLateAndOutOfOrder) {
  // The algorithms must wait for each copy before publishing it, for each
  // reduction before posting its result, and for each read before marking
  // a post read: the late engine runs nothing when asked, and later in a
  // random order.
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    return std::make_unique<LateEngine>(c, 1234 + r);
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kBfloat16, RedOp::kAvg, 3, Rooted(k) ? 0 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) {
        return RunAll(comm, cases, alloc.pool());
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactUnderTheCudaEnginesOrdering) {
  // The CUDA engine's contract replayed on the CPU: no inline posts (device
  // buffers are not host-readable), every copy and reduction a ticket that
  // completes late and out of order. Tiny calls then go through slots too.
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    return std::make_unique<LateEngine>(c, 4321 + r, /*device_like=*/true);
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kFloat16, RedOp::kSum, 1, Rooted(k) ? 1 : -1, false, false});
    cases.push_back({k, DataType::kInt64, RedOp::kMax, 5, Rooted(k) ? 0 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) {
        return RunAll(comm, cases, alloc.pool());
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, EveryCollectiveStaysExactWhenTheEnginePublishesThePostLines) {
  // CXLRT_CUDA_DOORBELL=copy replayed on the CPU: the engine writes each
  // post line and flag itself, late, after the copies behind it (as a
  // stream orders them), while the host goes on. A line published before
  // its bytes, or a slot reused before its peers read it, fails the checks.
  std::vector<LateEngine*> engines(3, nullptr);
  engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    auto e = std::make_unique<LateEngine>(c, 777 + r, /*device_like=*/true, /*publishes=*/true);
    engines[r] = e.get();
    return e;
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.oneshot_max = 1024;
  auto cases = PipelineCases();
  for (CollKind k : AllKinds()) {
    cases.push_back({k, DataType::kFloat32, RedOp::kSum, 3, Rooted(k) ? 2 : -1, false, false});
  }
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        std::string e = RunAll(comm, cases, alloc.pool());
        if (e.empty() && engines[comm.rank()]->published() == 0) {
          return "the engine published no post line";
        }
        return e;
      },
      absl::Seconds(120), o);
}

// A copy engine that fails (a GPU's sticky error) completes nothing again.
// A rank that meets it while it waits for a peer (which may be waiting for
// this rank's next post) must end the call with the engine's error at once,
// not with "waiting for rank j" at the deadline; the peer then gets
// kAborted. For a collective and for Send.
TEST_P(CollectivesTest, AFailedCopyEngineEndsTheCallWithItsErrorNotAtTheDeadline) {
  for (bool p2p : {false, true}) {
    SCOPED_TRACE(p2p ? "Send/Recv" : "AllReduce");
    engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
      auto e = std::make_unique<LateEngine>(c, 55 + r, /*device_like=*/true);
      if (r == 0) e->FailFrom(6);
      return e;
    };
    CommOptions o;
    o.slot_bytes = 8192;
    o.p2p_bytes = 1024;
    o.timeout = absl::Seconds(100);  // past the test's own limit
    RunRanks(
        2,
        [&](Communicator& comm, allocator::Allocator&) -> std::string {
          std::vector<float> x(100000, 1.0f), y(x.size());
          absl::Status s;
          for (int i = 0; i < 3 && s.ok(); ++i) {
            if (!p2p) {
              s = comm.AllReduce(x.data(), y.data(), x.size(), DataType::kFloat32, RedOp::kSum);
            } else {
              s = comm.rank() == 0 ? comm.Send(x.data(), x.size(), DataType::kFloat32, 1)
                                   : comm.Recv(y.data(), y.size(), DataType::kFloat32, 0);
            }
          }
          if (comm.rank() == 0) {
            if (s.code() != absl::StatusCode::kInternal ||
                std::string(s.message()).find("injected") == std::string::npos) {
              return "rank 0 did not report its engine's failure: " + s.ToString();
            }
          } else if (s.code() != absl::StatusCode::kAborted) {
            return "rank 1 did not see rank 0 abort: " + s.ToString();
          }
          return "";
        },
        absl::Seconds(60), o, "failing");
    if (HasFailure()) return;
  }
}

TEST_P(CollectivesTest, ARankStalledMidStreamDelaysTheOthersButNotTheirResults) {
  // Rank 1 stalls 300 ms before publishing its 7th post (inside a call of
  // many chunks): the others run ahead up to their rings and wait; every
  // result stays exact.
  CommOptions o;
  o.slot_bytes = 4096;
  o.oneshot_max = 256;
  const auto cases = PipelineCases();
  RunRanks(
      3,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        if (comm.rank() == 1) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:stall=300:7");
          if (!armed.ok()) return armed.ToString();
        }
        const absl::Time start = absl::Now();
        std::string e = RunAll(comm, cases, alloc.pool());
        if (e.empty() && absl::Now() - start < absl::Milliseconds(300)) {
          return "the stall did not happen";
        }
        return e;
      },
      absl::Seconds(120), o);
}

TEST_P(CollectivesTest, RanksThatDisagreeOnZeroCopyStillRunTheSameRounds) {
  // Rank 0's buffers lie in the pool, the others' do not: chunking must not
  // depend on it, or the ranks would run different numbers of rounds. No
  // rank dies: a long lease, as in EightRanksOnTwoCoresCompleteEveryCollective.
  rank_lease_ = absl::Seconds(10);
  std::vector<Case> cases;
  for (size_t count : {size_t{1000}, (size_t{3} << 20) / 4 + 5}) {
    for (CollKind k : AllKinds()) {
      for (int root : {0, 1}) {
        if (!Rooted(k) && root == 1) continue;
        cases.push_back(
            {k, DataType::kFloat32, RedOp::kSum, count, Rooted(k) ? root : -1, false, true, true});
      }
    }
  }
  RunRanks(3, [&](Communicator& comm, allocator::Allocator& alloc) {
    return RunAll(comm, cases, alloc.pool());
  });
}

TEST_P(CollectivesTest, APoolBufferOffItsElementsIsCopiedNotPostedInPlace) {
  // A peer refuses a post whose data is not aligned to the call's elements
  // (a hostile post made readers load misaligned floats), so a rank whose
  // pool-resident buffer is off its elements must copy it through its slot.
  RunRanks(2, [](Communicator& comm, allocator::Allocator&) -> std::string {
    constexpr size_t kCount = 20000;  // out-of-line: 80 KB
    auto buf = comm.Allocate(kCount * sizeof(float) + 8);
    if (!buf.ok()) return buf.status().ToString();
    auto* send = static_cast<uint8_t*>(*buf) + 2;  // off a float boundary
    for (size_t i = 0; i < kCount; ++i) {
      const float v = static_cast<float>(comm.rank() * 100000 + i);
      std::memcpy(send + i * sizeof(float), &v, sizeof(v));
    }
    std::vector<float> out(2 * kCount);
    absl::Status s = comm.AllGather(send, out.data(), kCount, DataType::kFloat32);
    if (!s.ok()) return "AllGather: " + s.ToString();
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        if (out[r * kCount + i] != static_cast<float>(r * 100000 + i)) {
          return absl::StrCat("element ", i, " of rank ", r, " is ", out[r * kCount + i]);
        }
      }
    }
    absl::Status freed = comm.Free(*buf);
    return freed.ok() ? "" : "Free: " + freed.ToString();
  });
}

TEST_P(CollectivesTest, AMismatchedCallIsAnErrorOnEveryRankNamingBoth) {
  RunRanks(2, [](Communicator& comm, allocator::Allocator&) -> std::string {
    std::vector<float> a(2048, 1.0f), b(2048);
    const size_t count = comm.rank() == 0 ? 1024 : 2048;
    absl::Status s = comm.AllReduce(a.data(), b.data(), count, DataType::kFloat32, RedOp::kSum);
    if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
    const std::string msg(s.message());
    if (msg.find("count=1024") == std::string::npos ||
        msg.find("count=2048") == std::string::npos || msg.find("rank 0") == std::string::npos ||
        msg.find("rank 1") == std::string::npos) {
      return "the message does not name both calls and ranks: " + msg;
    }
    s = comm.Barrier();
    if (s.code() != absl::StatusCode::kFailedPrecondition) {
      return "an aborted communicator ran a call: " + s.ToString();
    }
    return "";
  });
  // Different collectives, too.
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<int32_t> a(10, 1), b(30);
        absl::Status s = comm.rank() == 2
                             ? comm.AllGather(a.data(), b.data(), 10, DataType::kInt32)
                             : comm.Broadcast(a.data(), b.data(), 10, DataType::kInt32, 0);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
        if (std::string(s.message()).find("AllGather") == std::string::npos) {
          return "does not name the other call: " + s.ToString();
        }
        return "";
      },
      absl::Seconds(60), {}, "mixed");
}

TEST_P(CollectivesTest, ARankKilledMidCollectiveAbortsTheOthersNamingIt) {
  // Rank 1 dies at its third round post; the others get kAborted naming
  // it within its lease (1 s), far before the 30 s timeout.
  CommOptions o;
  o.timeout = absl::Seconds(30);
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 1) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:3");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(1000, 1.0f), b(1000);
        const absl::Time start = absl::Now();
        absl::Status s;
        for (int i = 0; i < 10 && s.ok(); ++i) {
          s = comm.AllReduce(a.data(), b.data(), 1000, DataType::kFloat32, RedOp::kSum);
        }
        if (comm.rank() == 1) return "rank 1 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 1") == std::string::npos) {
          return "does not name rank 1: " + s.ToString();
        }
        if (absl::Now() - start > absl::Seconds(10)) return "took too long to notice";
        comm.Abort();
        return "";
      },
      absl::Seconds(60), o, "killed", [](int r) { return r == 1 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, ARankKilledMidPipelineAbortsTheOthersNamingIt) {
  // Rank 2 dies at its 9th post, inside one all-gather of many chunks
  // (4 KiB slots, 1 MB per rank), with the others' posts still in its ring:
  // they get kAborted naming it within its lease, not a hang.
  CommOptions o;
  o.timeout = absl::Seconds(30);
  o.slot_bytes = 4096;
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 2) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:9");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(250000, 1.0f), b(3 * 250000);
        const absl::Time start = absl::Now();
        absl::Status s = comm.AllGather(a.data(), b.data(), a.size(), DataType::kFloat32);
        if (comm.rank() == 2) return "rank 2 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 2") == std::string::npos) {
          return "does not name rank 2: " + s.ToString();
        }
        if (absl::Now() - start > absl::Seconds(10)) return "took too long to notice";
        comm.Abort();
        return "";
      },
      absl::Seconds(60), o, "killed-pipeline",
      [](int r) { return r == 2 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, AsynchronousCallsQueueAndRunInOrderOnTheProxy) {
  // Calls return once queued; Synchronize waits for them; every result is
  // exact, in call order (each call's input depends on the one before).
  CommOptions o;
  o.asynchronous = true;
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        const int n = comm.size(), r = comm.rank();
        constexpr int kCalls = 12;
        constexpr size_t kCount = 300000;  // two-shot, several chunks
        std::vector<std::vector<int64_t>> in(kCalls, std::vector<int64_t>(kCount));
        std::vector<std::vector<int64_t>> out(kCalls, std::vector<int64_t>(kCount, -1));
        // The others come 500 ms late: a call that waited for them (a
        // synchronous one) could not return before they do.
        if (r != 0) absl::SleepFor(absl::Milliseconds(500));
        const absl::Time start = absl::Now();
        for (int k = 0; k < kCalls; ++k) {
          for (size_t i = 0; i < kCount; ++i) in[k][i] = 1000 * k + r + static_cast<int64_t>(i);
          absl::Status s =
              comm.AllReduce(in[k].data(), out[k].data(), kCount, DataType::kInt64, RedOp::kSum);
          if (!s.ok()) return absl::StrCat("call ", k, " was not queued: ", s.ToString());
        }
        if (r == 0 && absl::Now() - start > absl::Milliseconds(250)) {
          return absl::StrCat("queueing ", kCalls, " calls took ",
                              absl::FormatDuration(absl::Now() - start),
                              ": they waited for the late ranks");
        }
        if (absl::Status s = comm.Synchronize(); !s.ok()) return "Synchronize: " + s.ToString();
        for (int k = 0; k < kCalls; ++k) {
          for (size_t i = 0; i < kCount; ++i) {
            const int64_t want =
                n * (1000 * k + static_cast<int64_t>(i)) + int64_t{n} * (n - 1) / 2;
            if (out[k][i] != want) {
              return absl::StrCat("call ", k, " element ", i, ": ", out[k][i], ", want ", want);
            }
          }
        }
        // Synchronous entry points wait for the queue first.
        int64_t x = r, y = 0;
        if (!comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum).ok()) return "last call";
        if (absl::Status s = comm.Barrier(); !s.ok()) return "Barrier: " + s.ToString();
        if (y != int64_t{n} * (n - 1) / 2) return absl::StrCat("queued call before Barrier: ", y);
        return comm.AsyncError().ok() ? "" : comm.AsyncError().ToString();
      },
      absl::Seconds(120), o, "async");
}

TEST_P(CollectivesTest, AsynchronousErrorsReachSynchronizeAndTheNextCall) {
  // Rank 2 dies inside the queued calls: the others' Synchronize reports
  // kAborted naming it, and their next call is refused with that error.
  CommOptions o;
  o.asynchronous = true;
  o.timeout = absl::Seconds(30);
  o.slot_bytes = 4096;
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 2) {
          absl::Status armed = runtime::ArmFaults("coll.round.posted:crash:30");
          if (!armed.ok()) return armed.ToString();
        }
        std::vector<float> a(100000, 1.0f), b(100000);
        for (int k = 0; k < 4; ++k) {
          absl::Status s =
              comm.AllReduce(a.data(), b.data(), a.size(), DataType::kFloat32, RedOp::kSum);
          if (!s.ok()) return "queueing failed: " + s.ToString();
        }
        absl::Status s = comm.Synchronize();
        if (comm.rank() == 2) return "rank 2 survived its crash point";
        if (s.code() != absl::StatusCode::kAborted) return "not aborted: " + s.ToString();
        if (std::string(s.message()).find("rank 2") == std::string::npos) {
          return "does not name rank 2: " + s.ToString();
        }
        if (comm.AsyncError().code() != absl::StatusCode::kAborted) return "AsyncError lost it";
        absl::Status next = comm.AllReduce(a.data(), b.data(), 1, DataType::kFloat32, RedOp::kSum);
        if (next.code() != absl::StatusCode::kFailedPrecondition ||
            std::string(next.message()).find("rank 2") == std::string::npos) {
          return "the next call: " + next.ToString();
        }
        return "";
      },
      absl::Seconds(60), o, "async-killed",
      [](int r) { return r == 2 ? runtime::kFaultExitCode : 0; });
}

TEST_P(CollectivesTest, AMissingRankTimesOutWithADeadline) {
  CommOptions o;
  o.timeout = absl::Milliseconds(500);
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        if (comm.rank() == 1) {
          absl::SleepFor(absl::Seconds(2));  // never calls; stays alive
          comm.Abort();
          return "";
        }
        int32_t x = 1, y = 0;
        absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
        if (s.code() != absl::StatusCode::kDeadlineExceeded) return "no deadline: " + s.ToString();
        comm.Abort();
        // Rank 0's Destroy frees the block only once rank 1 can no longer
        // write it: while rank 1 lives and stays joined, Destroy times out
        // and keeps the block.
        absl::Status d = comm.Destroy();
        if (d.code() != absl::StatusCode::kDeadlineExceeded ||
            d.message().find("rank 1") == std::string::npos) {
          return "Destroy while rank 1 is joined: " + d.ToString();
        }
        return "";
      },
      absl::Seconds(60), o, "late");
}

// A CPU engine whose copies out of the pool start late: a reader that has
// seen a post and is slow to copy it (descheduled, or a GPU's DMA queued
// behind others).
class SlowReadEngine final : public CopyEngine {
 public:
  SlowReadEngine(runtime::Coherence& c, absl::Duration delay)
      : cpu_(MakeCpuEngine(c)), delay_(delay) {}
  const char* name() const override { return "slow reader (test)"; }
  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    return cpu_->ToPool(dst, src, n);
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    absl::SleepFor(delay_);
    return cpu_->FromPool(dst, pool_src, n);
  }
  Ticket Copy(void* dst, const void* src, size_t n) override { return cpu_->Copy(dst, src, n); }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    return cpu_->Reduce(t, op, out, srcs, n, count, avg_divisor);
  }
  bool Poll(Ticket t) override { return cpu_->Poll(t); }
  absl::Status Wait(Ticket t, absl::Time deadline) override { return cpu_->Wait(t, deadline); }

 private:
  std::unique_ptr<CopyEngine> cpu_;
  const absl::Duration delay_;
};

// Issue 25, defect 6: the root of a broadcast returns once its post is out,
// aborts and destroys its communicator, and its pool memory goes to the
// next allocation, filled with a pattern, while the reader (rank 0, slow
// to copy) still has the post to read. The reader must get the root's
// bytes or an error, never OK with the pattern (it got OK with 0 of
// 131,072 elements right when the root's Destroy freed its slots at once).
TEST_P(CollectivesTest, AnAbortedRootKeepsItsSlotsUntilTheReaderHasReadThem) {
  constexpr size_t kCount = 131072;
  engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    if (r != 0) return nullptr;
    return std::make_unique<SlowReadEngine>(c, absl::Milliseconds(500));
  };
  CommOptions o;
  o.slot_bytes = 1 << 20;
  o.timeout = absl::Seconds(20);
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        std::vector<float> buf(kCount);
        if (comm.rank() == 1) {
          for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(i + 1);
          absl::Status s = comm.Broadcast(buf.data(), buf.data(), kCount, DataType::kFloat32, 1);
          if (!s.ok()) return "root's Broadcast: " + s.ToString();
          const std::vector<PoolOffset> slots = comm.slots();
          comm.Abort();
          absl::Status d = comm.Destroy();
          if (!d.ok()) return "root's Destroy after its Abort: " + d.ToString();
          // The next allocations, filled with a pattern: the allocator hands
          // back a freed slot first.
          runtime::Coherence& c = alloc.pool().coherence();
          std::vector<uint8_t> pattern(o.slot_bytes, 0xEE);
          std::vector<PoolOffset> mine;
          size_t reused = 0;
          for (int k = 0; k < 32 && reused < slots.size(); ++k) {
            auto got = alloc.Allocate(o.slot_bytes, {.alignment = 4096});
            if (!got.ok()) break;
            mine.push_back(*got);
            c.CopyToPool(*got, pattern.data(), pattern.size());
            reused += std::find(slots.begin(), slots.end(), *got) != slots.end();
          }
          absl::SleepFor(absl::Seconds(1));  // the reader has read by then
          for (PoolOffset m : mine) (void)alloc.Free(m);
          return "";
        }
        absl::Status s = comm.Broadcast(nullptr, buf.data(), kCount, DataType::kFloat32, 1);
        std::string err;
        if (s.ok()) {
          size_t right = 0;
          for (size_t i = 0; i < kCount; ++i) right += buf[i] == static_cast<float>(i + 1);
          if (right != kCount) {
            err = absl::StrCat("the reader's Broadcast returned OK with ", right, " of ", kCount,
                               " elements right");
          }
        }
        (void)comm.Destroy();  // the root aborted: its barrier fails
        return err;
      },
      absl::Seconds(60), o, "reused");
}

// Issue 25, suspected: a call that fails returns only once its engine's
// copies have ended (they write the caller's buffers and this rank's
// slots), and Destroy frees the slots only once the engine is drained. The
// late engine leaves copies pending as a GPU's streams do; after the
// failed call none may remain, and none may write the slots' next owner.
TEST_P(CollectivesTest, AFailedCallAndDestroyDrainTheEngineBeforeTheBuffersAndSlotsGo) {
  LateEngine* mine = nullptr;  // in each rank's process
  engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
    auto e = std::make_unique<LateEngine>(c, 77 + r, /*device_like=*/true);
    e->RunOnlyWhenWaited();
    mine = e.get();
    return e;
  };
  CommOptions o;
  o.slot_bytes = 8192;
  o.timeout = absl::Seconds(20);
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        // Different counts: the first post each rank checks is a mismatch,
        // with the chunks after it posted ahead and still copying.
        const size_t count = comm.rank() == 0 ? 100000 : 100016;
        std::vector<float> x(count, 1.0f), y(count);
        absl::Status s = comm.AllReduce(x.data(), y.data(), count, DataType::kFloat32, RedOp::kSum);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
        std::string err;
        if (mine->pending() != 0) {
          err = absl::StrCat(mine->pending(),
                             " copies of the failed call were still pending when it returned; ");
        }
        const std::vector<PoolOffset> slots = comm.slots();
        absl::Status d = comm.Destroy();
        if (!d.ok()) return err + "Destroy: " + d.ToString();
        if (mine->pending() != 0) {
          absl::StrAppend(&err, mine->pending(),
                          " copies were still pending when Destroy freed the slots; ");
        }
        // The slots' next owner fills them; then whatever the engine still
        // had runs (a GPU's copies land whenever they land).
        runtime::Coherence& c = alloc.pool().coherence();
        std::vector<uint8_t> pattern(o.slot_bytes, 0xEE), got(o.slot_bytes);
        std::vector<PoolOffset> next;
        for (size_t k = 0; k < 2 * slots.size(); ++k) {
          auto b = alloc.Allocate(o.slot_bytes, {.alignment = 4096});
          if (!b.ok()) return b.status().ToString();
          next.push_back(*b);
          c.CopyToPool(*b, pattern.data(), pattern.size());
        }
        (void)mine->Drain(absl::InfiniteFuture());
        for (PoolOffset b : next) {
          c.Fetch(got.data(), b, got.size());
          if (got != pattern) {
            absl::StrAppend(&err, "a copy of the failed call wrote the block at 0x", absl::Hex(b),
                            " after Destroy freed it; ");
          }
          (void)alloc.Free(b);
        }
        return err;
      },
      absl::Seconds(60), o, "drained");
}

// Issue 25, defect 5: a job whose rank 0 was killed leaves its block with
// a dead maker, and its rank 1 alive. A new job's rank 0 must not re-make
// the block while that rank lives (its next call writes its post and
// abort lines into the block), and names it; once it has aborted, the
// block is taken.
TEST_P(CollectivesTest, AStaleBlockIsNotRemadeWhileARankOfTheOldJobLives) {
  struct Shared {
    int a1_joined, go, a1_done, b_tried;
    char a1_status[256], b0_status[512];
  };
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::memset(sh, 0, sizeof(Shared));
  auto await = [](const int* flag, int want) {
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= want;
  };
  CommOptions old_job;
  old_job.timeout = absl::Seconds(20);
  const pid_t a0 = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "stale", 2, 0, old_job);
    if (!comm.ok() || !await(&sh->a1_joined, 1)) return 3;
    raise(SIGKILL);  // dies without leaving
    return 4;
  });
  const pid_t a1 = Spawn([&]() -> int {
    // A long lease: a heartbeat starved on a loaded machine must not make
    // this live rank look dead to the new job.
    auto h = OpenRankHost(uri_, absl::Seconds(4));
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "stale", 2, 1, old_job);
    if (!comm.ok()) return 3;
    __atomic_store_n(&sh->a1_joined, 1, __ATOMIC_RELEASE);
    if (!await(&sh->go, 1)) return 4;  // idle meanwhile: joined, alive
    int64_t x = 1, y = 0;
    absl::Status s = (*comm)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
    std::snprintf(sh->a1_status, sizeof(sh->a1_status), "%s", s.ToString().c_str());
    (*comm)->Abort();
    (void)(*comm)->Destroy();
    __atomic_store_n(&sh->a1_done, 1, __ATOMIC_RELEASE);
    return s.code() == absl::StatusCode::kAborted ? 0 : 5;
  });
  EXPECT_EQ(WaitExit(a0, absl::Seconds(60)), 128 + SIGKILL);
  CommOptions new_job;
  new_job.timeout = absl::Seconds(5);  // past rank 0's lease: its block is stale by then
  std::vector<pid_t> b;
  for (int r = 0; r < 2; ++r) {
    b.push_back(Spawn([&, r]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      auto comm = Communicator::Create(*h->alloc, "stale", 2, r, new_job);
      if (r == 0) {
        std::snprintf(sh->b0_status, sizeof(sh->b0_status), "%s", comm.status().ToString().c_str());
      }
      __atomic_add_fetch(&sh->b_tried, 1, __ATOMIC_ACQ_REL);
      if (!comm.ok()) return 10;
      // The old rank's call comes while this instance lives.
      if (!await(&sh->a1_done, 1)) return 11;
      int64_t x = 10 + r, y = 0;
      absl::Status s = (*comm)->AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
      return s.ok() && y == 21 ? 0 : 12;
    }));
  }
  EXPECT_TRUE(await(&sh->b_tried, 2));
  __atomic_store_n(&sh->go, 1, __ATOMIC_RELEASE);
  const int b0 = WaitExit(b[0], absl::Seconds(60));
  EXPECT_EQ(WaitExit(b[1], absl::Seconds(60)), 10);
  EXPECT_EQ(b0, 10) << "the new job's rank 0 re-made the block while rank 1 of the old job was "
                       "alive (exit "
                    << b0
                    << "; 12: the old rank's call then broke the new instance): " << sh->b0_status;
  const std::string said = sh->b0_status;
  EXPECT_NE(said.find("ALREADY_EXISTS"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1"), std::string::npos) << said;
  EXPECT_NE(said.find(absl::StrCat("pid ", a1)), std::string::npos) << said;
  EXPECT_EQ(WaitExit(a1, absl::Seconds(60)), 0) << sh->a1_status;
  munmap(sh, 4096);
  // The old rank aborted and left: a new job takes the block.
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        int64_t x = 10 + comm.rank(), y = 0;
        absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
        if (!s.ok()) return s.ToString();
        return y == 21 ? "" : absl::StrCat("AllReduce gave ", y);
      },
      absl::Seconds(60), {}, "stale");
}

// Issue 13, defects 2-4: communicators of one name created, used,
// destroyed and re-created in a loop, ranks on one core and on two. Each
// all-reduce result is checked (a rank that joined the previous instance
// got 1002 instead of 2002), and after each Destroy rank 0 fills a canary
// block the size of the freed one, which the allocator hands it at the same
// place: a rank still writing the old instance changes it (72 bytes of it,
// before Destroy waited for every rank).

TEST_P(CollectivesTest, ReCreatedCommunicatorsNeverMixInstancesOrWriteFreedBlocks) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    return CycleCommunicators(comm, alloc, /*one_core=*/false);
  });
}

TEST_P(CollectivesTest, ReCreatedCommunicatorsOnOneCoreNeverMixInstances) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    return CycleCommunicators(comm, alloc, /*one_core=*/true);
  });
}

// The lifecycle stress with killed ranks: six generations of ranks (fresh
// processes, so fresh hosts) create, use and destroy one name; in four a
// rank dies at a round post (rank 0 too, leaving its block to the next
// generation's rank 0 to replace). Every result before the death is
// checked, every survivor must see kAborted naming the dead rank, and each
// freed block gets a canary (a durable named block in its place) that is
// checked after every later generation: no rank of any generation writes
// outside its own block. The checks run in a child too: a parent with host
// threads must not fork (a child can inherit a lock a thread held, as
// ASan's allocator showed).
TEST_P(CollectivesTest, ReCreatedCommunicatorsSurviveKilledRanksAndWriteNoFreedBlock) {
  struct Shared {
    uint64_t block_offset, block_size;  // this generation's, from its rank 0
    int canaries;                       // canary/0 .. canary/N-1
    char error[512];
  };
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  sh->canaries = 0;
  auto seed = [](int k) { return static_cast<uint8_t>(0x5A + k); };
  // In a child: checks every canary; then, when `add` and the generation's
  // block was freed, puts a canary in its place; when `remove`, frees them.
  auto check = [&](int gen, bool add, bool remove) -> int {
    return WaitExit(Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      runtime::Coherence& c = h->pool->coherence();
      for (int k = 0; k < sh->canaries; ++k) {
        auto b = h->alloc->Find(absl::StrCat("canary/", k));
        if (!b.ok()) return 3;
        std::vector<uint8_t> got(b->size);
        c.Fetch(got.data(), b->offset, b->size);
        for (uint64_t i = 0; i < b->size; ++i) {
          if (got[i] != static_cast<uint8_t>(seed(k) ^ i)) {
            std::snprintf(sh->error, sizeof(sh->error),
                          "a rank of generation %d wrote byte %llu of freed block 0x%llx", gen,
                          static_cast<unsigned long long>(i),
                          static_cast<unsigned long long>(b->offset));
            return 4;
          }
        }
        if (remove && !h->alloc->FreeNamed(absl::StrCat("canary/", k)).ok()) return 5;
      }
      if (add && sh->block_size != 0 && absl::IsNotFound(h->alloc->Find("comm/life").status())) {
        const int k = sh->canaries;
        auto got = h->alloc->AllocateNamed(absl::StrCat("canary/", k), sh->block_size,
                                           {.alignment = 2 << 20});
        if (!got.ok()) return 6;
        std::vector<uint8_t> fill(sh->block_size);
        for (uint64_t i = 0; i < fill.size(); ++i) fill[i] = static_cast<uint8_t>(seed(k) ^ i);
        c.CopyToPool(*got, fill.data(), fill.size());
        ++sh->canaries;
      }
      return 0;
    }));
  };
  const int kVictims[] = {-1, 1, 0, 2, -1, 0};
  CommOptions o;
  o.timeout = absl::Seconds(30);
  for (int gen = 0; gen < 6; ++gen) {
    SCOPED_TRACE(absl::StrCat("generation ", gen));
    const int victim = kVictims[gen];
    const int die_at = 2 + gen % 3;  // the victim's post that kills it
    sh->block_offset = sh->block_size = 0;
    RunRanks(
        3,
        [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
          const int r = comm.rank();
          if (r == 0) {
            auto b = alloc.Find("comm/life");
            if (!b.ok()) return b.status().ToString();
            sh->block_offset = b->offset;
            sh->block_size = b->size;
          }
          if (r == victim) {
            absl::Status armed =
                runtime::ArmFaults(absl::StrCat("coll.round.posted:crash:", die_at));
            if (!armed.ok()) return armed.ToString();
          }
          for (int call = 0; call < 6; ++call) {
            const int64_t base = 1000 * (gen + 1) + 10 * call, x = base + r;
            int64_t y = 0;
            absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
            if (s.ok()) {
              if (y != 3 * base + 3) {
                return absl::StrCat("call ", call, " gave ", y, ", want ", 3 * base + 3);
              }
              continue;
            }
            if (victim < 0) return absl::StrCat("call ", call, ": ", s.ToString());
            if (s.code() != absl::StatusCode::kAborted ||
                s.message().find(absl::StrCat("rank ", victim)) == std::string::npos) {
              return absl::StrCat("call ", call, " after rank ", victim,
                                  " died: not kAborted naming it: ", s.ToString());
            }
            comm.Abort();
            break;
          }
          if (r == victim) return "survived its crash point";
          return "";
        },
        absl::Seconds(90), o, "life",
        [&](int r) { return r == victim ? runtime::kFaultExitCode : 0; });
    if (HasFailure()) break;
    // A freed block gets a canary in its place; a block left by a dead rank
    // 0 stays for the next generation to replace.
    ASSERT_EQ(check(gen, /*add=*/true, /*remove=*/false), 0) << sh->error;
  }
  EXPECT_GE(sh->canaries, 3) << "Destroy freed too few blocks to check";
  EXPECT_EQ(check(6, /*add=*/false, /*remove=*/true), 0) << sh->error;
  munmap(sh, 4096);
}

// Issue 13, defect 8: a header whose p2p_bytes is 0 (Send/Recv divided by
// it) or absurd (the plan's product overflowed) is refused at join.
TEST_P(CollectivesTest, AJoinerRefusesAHeaderWithBadBufferSizes) {
  for (uint64_t bad : {uint64_t{0}, uint64_t{1} << 62, uint64_t{100}}) {
    CommOptions o;
    o.timeout = absl::Seconds(3);
    pid_t maker = Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      auto comm = Communicator::Create(*h->alloc, "badhdr", 2, 0, o);
      return comm.ok() ? 3 : 0;  // rank 1 never joins: a deadline
    });
    pid_t joiner = Spawn([&]() -> int {
      auto h = OpenRankHost(uri_);
      if (!h.ok()) return 2;
      runtime::Coherence& c = h->pool->coherence();
      // Wait for rank 0's header, then damage it as a hostile pool would
      // (a valid checksum over the bad size).
      auto made = AwaitHeader(*h, "comm/badhdr", absl::Seconds(3));
      if (!made) return 4;
      auto& [b, hdr] = *made;
      hdr.p2p_bytes = bad;
      hdr.checksum = runtime::Crc32c(&hdr, offsetof(CommHeaderLayout, checksum));
      c.PublishObject(b.offset, hdr);
      auto comm = Communicator::Create(*h->alloc, "badhdr", 2, 1, o);
      if (comm.ok()) return 5;
      if (comm.status().code() != absl::StatusCode::kDataLoss ||
          comm.status().message().find("p2p_bytes") == std::string::npos) {
        std::fprintf(stderr, "joiner got %s\n", comm.status().ToString().c_str());
        return 6;
      }
      return 0;
    });
    EXPECT_EQ(WaitExit(joiner, absl::Seconds(30)), 0) << "p2p_bytes " << bad;
    EXPECT_EQ(WaitExit(maker, absl::Seconds(30)), 0);
  }
}

// Issue 13, defect 7: a peer whose post says it holds fewer bytes than the
// call reads (here 8 inline bytes for a 64 KiB broadcast) is a corrupt
// post: kDataLoss, never a read past the post into other memory.
TEST_P(CollectivesTest, APostShorterThanTheCallIsDataLossNotAnOverRead) {
  CommOptions o;
  o.timeout = absl::Seconds(5);
  constexpr size_t kCount = 16384;  // floats: 64 KiB
  pid_t reader = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    auto comm = Communicator::Create(*h->alloc, "short", 2, 0, o);
    if (!comm.ok()) return 3;
    std::vector<float> out(kCount, -1.0f);
    absl::Status s = (*comm)->Broadcast(nullptr, out.data(), kCount, DataType::kFloat32, 1);
    if (s.code() != absl::StatusCode::kDataLoss ||
        s.message().find("posted 8 bytes") == std::string::npos) {
      std::fprintf(stderr, "reader got %s\n", s.ToString().c_str());
      return 4;
    }
    (*comm)->Abort();
    return 0;
  });
  // The hostile rank 1: a live host that joins by hand and posts round 1
  // with the right call but 8 bytes.
  pid_t hostile = Spawn([&]() -> int {
    auto h = OpenRankHost(uri_);
    if (!h.ok()) return 2;
    runtime::Coherence& c = h->pool->coherence();
    auto made = AwaitHeader(*h, "comm/short", absl::Seconds(5));
    if (!made) return 3;
    auto& [b, hdr] = *made;
    auto slot = h->alloc->Allocate(hdr.slot_bytes);
    if (!slot.ok()) return 4;
    const runtime::PoolOffset rank1 = b.offset + sizeof(CommHeaderLayout) + sizeof(RankLayout);
    JoinLayout me = {};
    me.instance = hdr.instance;
    me.host_slot = h->membership->slot();
    me.host_epoch = h->membership->epoch();
    me.pid = getpid();
    RingLayout ring = {};
    for (uint32_t i = 0; i < hdr.depth; ++i) ring.slot[i] = *slot;
    c.Publish(rank1 + 8, reinterpret_cast<uint8_t*>(&me) + 8, sizeof(me) - 8);
    c.Publish(rank1 + offsetof(RankLayout, ring), &ring, sizeof(ring));
    c.StoreFlag(rank1, static_cast<uint64_t>(JoinState::kJoined));
    PostLayout post = {};
    post.instance = hdr.instance;
    post.desc.kind = static_cast<uint8_t>(CollKind::kBroadcast);
    post.desc.type = static_cast<uint8_t>(DataType::kFloat32);
    post.desc.op = static_cast<uint8_t>(RedOp::kSum);
    post.desc.root = 1;
    post.desc.count = kCount;
    post.desc.call = 1;
    post.len = 8;
    const runtime::PoolOffset line = rank1 + offsetof(RankLayout, post) + sizeof(PostLayout);
    c.Publish(line + 8, reinterpret_cast<uint8_t*>(&post) + 8, sizeof(post) - 8);
    c.StoreFlag(line, 1);
    // Stay alive (and leave) once rank 0 has read the post.
    absl::SleepFor(absl::Seconds(2));
    c.StoreFlag(rank1, static_cast<uint64_t>(JoinState::kLeft));
    return 0;
  });
  EXPECT_EQ(WaitExit(reader, absl::Seconds(30)), 0);
  EXPECT_EQ(WaitExit(hostile, absl::Seconds(30)), 0);
}

TEST_P(CollectivesTest, ManyBackToBackCallsTwoCommunicatorsAndSendRecv) {
  // Thousands of tiny all-reduces (inline rounds, sequence numbers far past
  // the two slots), a second communicator over the same ranks with calls
  // interleaved, and a ring of Send/Recv larger than the p2p buffer.
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        auto other = Communicator::Create(alloc, "second", comm.size(), comm.rank());
        if (!other.ok()) return "second communicator: " + other.status().ToString();
        const int n = comm.size(), r = comm.rank();
        for (int i = 0; i < 3000; ++i) {
          int64_t x = r + i, y = 0;
          absl::Status s = comm.AllReduce(&x, &y, 1, DataType::kInt64, RedOp::kSum);
          if (!s.ok()) return s.ToString();
          if (y != int64_t{n} * i + n * (n - 1) / 2) return absl::StrCat("call ", i, ": got ", y);
          if (i % 100 == 0) {
            double d = r, m = 0;
            s = (*other)->AllReduce(&d, &m, 1, DataType::kFloat64, RedOp::kMax);
            if (!s.ok() || m != n - 1) return "second communicator: " + s.ToString();
          }
        }
        std::vector<uint32_t> out(100000), in(100000);
        for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint32_t>(r * 1000003 + i);
        const int to = (r + 1) % n, from = (r + n - 1) % n;
        // Even ranks send first, odd ones receive first: no cycle of blocked sends.
        for (int step = 0; step < 2; ++step) {
          absl::Status s = (r % 2 == step)
                               ? comm.Send(out.data(), out.size(), DataType::kUint32, to)
                               : comm.Recv(in.data(), in.size(), DataType::kUint32, from);
          if (!s.ok()) return s.ToString();
        }
        for (size_t i = 0; i < in.size(); ++i) {
          if (in[i] != static_cast<uint32_t>(from * 1000003 + i)) {
            return absl::StrCat("Recv from ", from, ": element ", i, " is ", in[i]);
          }
        }
        absl::Status s = (*other)->Destroy();
        return s.ok() ? "" : s.ToString();
      },
      absl::Seconds(120), {}, "many");
}

TEST_P(CollectivesTest, ASendMeetingARecvOfAnotherSizeIsAnError) {
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> v(100);
        absl::Status s = comm.rank() == 0 ? comm.Send(v.data(), 100, DataType::kFloat32, 1)
                                          : comm.Recv(v.data(), 50, DataType::kFloat32, 0);
        if (comm.rank() == 1) {
          if (s.code() != absl::StatusCode::kInvalidArgument ||
              std::string(s.message()).find("count=100") == std::string::npos) {
            return "no mismatch: " + s.ToString();
          }
        } else if (!s.ok()) {
          return "send: " + s.ToString();
        }
        comm.Abort();
        return "";
      },
      absl::Seconds(60), {}, "p2p");
}

// Send/Recv messages of 0 to hundreds of chunks around a ring of three
// ranks, every rank sending and receiving, through chunks of 256 B (a ring
// of kP2pSlots per channel, wrapped many times). With the CPU engine, and
// with the late engine (device-like): a chunk published before its copy
// into the pool completed, or marked consumed while its copy out still
// reads it, hands over wrong bytes.
TEST_P(CollectivesTest, SendAndRecvStayExactThroughTheChannelRing) {
  std::vector<LateEngine*> late(3, nullptr);
  for (bool late_engine : {false, true}) {
    SCOPED_TRACE(late_engine ? "late engine" : "cpu engine");
    engine_factory_ = nullptr;
    if (late_engine) {
      engine_factory_ = [&](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
        auto e = std::make_unique<LateEngine>(c, 99 + r, /*device_like=*/true);
        late[r] = e.get();
        return e;
      };
    }
    CommOptions o;
    o.p2p_bytes = 1024;
    RunRanks(
        3,
        [&](Communicator& comm, allocator::Allocator&) -> std::string {
          const int n = comm.size(), r = comm.rank();
          const int to = (r + 1) % n, from = (r + n - 1) % n;
          for (size_t count : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
                               size_t{1000}, size_t{100003}}) {
            std::vector<uint32_t> out(count), in(count, 0xdeadbeef);
            for (size_t i = 0; i < count; ++i) out[i] = static_cast<uint32_t>(r * 1000003 + i);
            // Rank 0 receives first, the others send first: no cycle of
            // blocked sends, and messages longer than the ring block.
            for (int step = 0; step < 2; ++step) {
              absl::Status s = ((r == 0) == (step == 1))
                                   ? comm.Send(out.data(), count, DataType::kUint32, to)
                                   : comm.Recv(in.data(), count, DataType::kUint32, from);
              if (!s.ok()) return absl::StrCat("count ", count, ": ", s.ToString());
            }
            for (size_t i = 0; i < count; ++i) {
              if (in[i] != static_cast<uint32_t>(from * 1000003 + i)) {
                return absl::StrCat("count ", count, ": element ", i, " from rank ", from, " is ",
                                    in[i]);
              }
            }
          }
          if (late[r] != nullptr && late[r]->most_pending() < 2) {
            return "the late engine never had two chunks in flight";
          }
          return "";
        },
        absl::Seconds(120), o, "p2p");
    if (HasFailure()) return;
  }
}

// Unset, a channel is the largest power of two in [64 KiB, 1 MiB] whose
// n x n channels take at most 1/16 of the pool (512 MiB here); rank 0's
// choice holds for every rank, and a given size is rounded up to whole
// chunk lines.
TEST_P(CollectivesTest, SendRecvChannelsAreSizedByThePoolUnlessTold) {
  for (auto [n, told, want] :
       {std::tuple{2, 0, 1 << 20}, std::tuple{8, 0, 512 << 10}, std::tuple{2, 1000, 1024}}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks, told ", told));
    CommOptions o;
    o.p2p_bytes = told;
    RunRanks(
        n,
        [&, want = want](Communicator& comm, allocator::Allocator&) -> std::string {
          if (comm.p2p_bytes() != static_cast<uint64_t>(want)) {
            return absl::StrCat("channels of ", comm.p2p_bytes(), " bytes, not ", want);
          }
          return "";
        },
        absl::Seconds(60), o, "p2p");
    if (HasFailure()) return;
  }
}

// The channel's flow control, told by causality rather than time: a Send
// of kP2pSlots chunks fits the ring and returns before its Recv begins; a
// Send of one chunk more returns only after its Recv has begun.
TEST_P(CollectivesTest, ASendRunsAheadOfItsReceiverByTheRingAndNoFurther) {
  auto* sh = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::atomic<int>& sent = sh[0];     // rank 0: Sends returned
  std::atomic<int>& started = sh[1];  // rank 1: Recvs begun
  CommOptions o;
  o.p2p_bytes = 1024;                             // kP2pSlots chunks of 256 B
  const size_t fits = 1024 / 4, more = fits + 1;  // floats
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> a(fits, 1.0f), b(more, 2.0f);
        if (comm.rank() == 0) {
          absl::Status s = comm.Send(a.data(), fits, DataType::kFloat32, 1);
          if (!s.ok()) return s.ToString();
          sent = 1;
          s = comm.Send(b.data(), more, DataType::kFloat32, 1);
          if (!s.ok()) return s.ToString();
          if (started.load() < 2)
            return "a Send longer than the ring returned before its Recv began";
          return "";
        }
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        while (sent.load() == 0) {
          if (absl::Now() > deadline) return "a Send that fits the ring did not return";
          absl::SleepFor(absl::Milliseconds(1));
        }
        started = 1;
        absl::Status s = comm.Recv(a.data(), fits, DataType::kFloat32, 0);
        if (!s.ok()) return s.ToString();
        started = 2;
        s = comm.Recv(b.data(), more, DataType::kFloat32, 0);
        if (!s.ok()) return s.ToString();
        if (a != std::vector<float>(fits, 1.0f) || b != std::vector<float>(more, 2.0f)) {
          return "wrong bytes received";
        }
        return "";
      },
      absl::Seconds(60), o, "p2p");
  munmap(sh, 4096);
}

// The probes a caller uses to drive p2p without waiting (the torch
// backend's p2p thread): SendFits says whether a Send's chunks fit the ring
// now, RecvReady whether the next Send's first chunk is posted.
TEST_P(CollectivesTest, TheP2pProbesSayWhenASendFitsAndWhenARecvCanStart) {
  auto* sh = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  std::atomic<int>& step = sh[0];  // 1: rank 1 probed an empty channel; 2: rank 0 sent;
                                   // 3: rank 1 received
  CommOptions o;
  o.p2p_bytes = 1024;  // kP2pSlots chunks of 256 B
  RunRanks(
      2,
      [&](Communicator& comm, allocator::Allocator&) -> std::string {
        auto await = [&](int v) {
          const absl::Time deadline = absl::Now() + absl::Seconds(30);
          while (step.load() < v) {
            if (absl::Now() > deadline) return false;
            absl::SleepFor(absl::Milliseconds(1));
          }
          return true;
        };
        std::vector<uint8_t> buf(768, 7);
        if (comm.rank() == 0) {
          if (!comm.SendFits(1, 1024)) return "4 chunks do not fit an empty ring";
          if (comm.SendFits(1, 1025)) return "5 chunks fit a ring of 4";
          if (comm.SendFits(0, 1) || comm.SendFits(2, 1)) return "a bad peer fits";
          if (!await(1)) return "rank 1 did not probe";
          absl::Status s = comm.Send(buf.data(), 768, DataType::kUint8, 1);  // 3 chunks
          if (!s.ok()) return s.ToString();
          if (!comm.SendFits(1, 256) || comm.SendFits(1, 512)) {
            return "after 3 unconsumed chunks, room is not 1 chunk";
          }
          step = 2;
          if (!await(3)) return "rank 1 did not receive";
          if (!comm.SendFits(1, 1024)) return "the ring is not empty after its Recv";
          return "";
        }
        if (comm.RecvReady(0)) return "a Recv can start before any Send";
        step = 1;
        if (!await(2)) return "rank 0 did not send";
        if (!comm.RecvReady(0)) return "a posted Send is not seen";
        std::vector<uint8_t> got(768);
        absl::Status s = comm.Recv(got.data(), 768, DataType::kUint8, 0);
        if (!s.ok()) return s.ToString();
        if (got != buf) return "wrong bytes received";
        if (comm.RecvReady(0)) return "a Recv can start after the only Send was received";
        step = 3;
        return "";
      },
      absl::Seconds(60), o, "probes");
  munmap(sh, 4096);
}

// AllToAllV between 3 ranks: rank i sends Count(i, j, scale) elements to
// rank j (zeros among them), from pieces with gaps in reversed order, into
// pieces with other gaps; every element and every gap is checked. Scales
// from all-empty through inline posts to many chunks of small slots, with
// the CPU engine and with the late engine (copies complete late and out of
// order).
size_t V2Count(int i, int j, size_t scale) { return (i * 5 + j * 3 + 1) % 4 * scale; }

std::string RunAllToAllV(Communicator& comm, DataType t, size_t scale) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = SizeOf(t), gap = 3;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t stotal = gap, rtotal = 0;
  for (int j = n - 1; j >= 0; --j) {  // send pieces in reversed order
    sc[j] = V2Count(r, j, scale);
    sd[j] = stotal;
    stotal += sc[j] + gap;
  }
  for (int j = 0; j < n; ++j) {
    rc[j] = V2Count(j, r, scale);
    rd[j] = rtotal + gap;
    rtotal += rc[j] + gap;
  }
  rtotal += gap;
  std::vector<uint8_t> send(stotal * es), recv(rtotal * es, 0xa5), want(rtotal * es, 0xa5);
  // Element k of the piece from rank i to rank j: Value(t, i * n + j, k).
  for (int j = 0; j < n; ++j) {
    for (size_t k = 0; k < sc[j]; ++k) Store(t, send.data(), sd[j] + k, Value(t, r * n + j, k));
    for (size_t k = 0; k < rc[j]; ++k) Store(t, want.data(), rd[j] + k, Value(t, j * n + r, k));
  }
  absl::Status s = comm.AllToAllV(send.data(), sc, sd, recv.data(), rc, rd, t);
  if (!s.ok()) return s.ToString();
  if (recv != want) {
    size_t b = 0;
    while (recv[b] == want[b]) ++b;
    return absl::StrCat("AllToAllV ", DataTypeName(t), " scale ", scale, ": byte ", b, " (element ",
                        b / es, ") differs");
  }
  return "";
}

TEST_P(CollectivesTest, AllToAllVMovesUnevenPiecesIncludingEmptyOnes) {
  for (bool late : {false, true}) {
    SCOPED_TRACE(late ? "late engine" : "cpu engine");
    if (late) {
      engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
        return std::make_unique<LateEngine>(c, 99 + r);
      };
    }
    CommOptions o;
    o.slot_bytes = 4096;  // 3 pieces of up to 1365 B per post: large scales take many chunks
    RunRanks(
        3,
        [&](Communicator& comm, allocator::Allocator&) -> std::string {
          const uint64_t before = comm.posts();
          for (DataType t : {DataType::kInt8, DataType::kFloat32, DataType::kFloat64}) {
            for (size_t scale : {0, 1, 2, 7, 1000}) {
              std::string e = RunAllToAllV(comm, t, scale);
              if (!e.empty()) return e;
            }
          }
          // 15 calls: at least 15 count posts, and tens of chunks at scale 1000.
          if (comm.posts() - before < 40) {
            return absl::StrCat(comm.posts() - before, " posts: the large calls did not chunk");
          }
          return "";
        },
        absl::Seconds(120), o);
    if (HasFailure()) return;
  }
}

TEST_P(CollectivesTest, AllToAllVCountsThatDisagreeAreAnErrorOnEveryRankNamingBoth) {
  RunRanks(
      3,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        const int r = comm.rank();
        std::vector<float> a(30, 1.0f), b(30);
        std::vector<size_t> counts = {4, 4, 4}, displs = {0, 10, 20};
        std::vector<size_t> rcounts = counts;
        if (r == 1) rcounts[0] = 5;  // rank 0 sends 4
        absl::Status s =
            comm.AllToAllV(a.data(), counts, displs, b.data(), rcounts, displs, DataType::kFloat32);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "no mismatch: " + s.ToString();
        const std::string msg(s.message());
        if (msg.find("rank 0 called AllToAllV(float32)") == std::string::npos ||
            msg.find("sending 4 elements to rank 1 but rank 1 expects 5") == std::string::npos) {
          return "the message does not name both ranks and counts: " + msg;
        }
        s = comm.Barrier();
        if (s.code() != absl::StatusCode::kFailedPrecondition) {
          return "an aborted communicator ran a call: " + s.ToString();
        }
        return "";
      },
      absl::Seconds(60), {}, "v-mismatch");
  RunRanks(
      1,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> a(8);
        std::vector<size_t> one = {4}, zero = {0}, two = {0, 0};
        absl::Status s =
            comm.AllToAllV(a.data(), one, zero, a.data() + 2, one, zero, DataType::kFloat32);
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            std::string(s.message()).find("overlap") == std::string::npos) {
          return "overlapping buffers: " + s.ToString();
        }
        s = comm.AllToAllV(a.data(), two, two, a.data() + 4, one, zero, DataType::kFloat32);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "2 counts: " + s.ToString();
        s = comm.AllToAllV(a.data(), one, zero, a.data() + 4, one, zero, DataType::kFloat32);
        return s.ok() ? "" : "the communicator broke: " + s.ToString();
      },
      absl::Seconds(60), {}, "v-args");
}

TEST_P(CollectivesTest, BadArgumentsAreRefusedWithoutTouchingTheCommunicator) {
  RunRanks(
      1,
      [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
        float x = 0;
        absl::Status s = comm.Broadcast(&x, &x, 1, DataType::kFloat32, 5);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "root 5: " + s.ToString();
        s = comm.Send(&x, 1, DataType::kFloat32, 0);
        if (s.code() != absl::StatusCode::kInvalidArgument) return "send to self: " + s.ToString();
        auto dup = Communicator::Create(alloc, "test", 1, 0);
        if (dup.status().code() != absl::StatusCode::kAlreadyExists) {
          return "a second communicator of a live name: " + dup.status().ToString();
        }
        auto bad = Communicator::Create(alloc, "x", 2, 2);
        if (bad.status().code() != absl::StatusCode::kInvalidArgument)
          return bad.status().ToString();
        s = comm.AllReduce(&x, &x, 1, DataType::kFloat32, RedOp::kSum);
        return s.ok() ? "" : "the communicator broke: " + s.ToString();
      },
      absl::Seconds(60), {}, "test");
}

// A pool of two devices: each rank's slots alternate devices by round
// parity and differ between neighbouring ranks, so every round spreads over
// both devices and a root's rounds rotate between them.
class StripedCollectivesTest : public CollectivesTest {
  std::string Extra() const override { return "&devices=2"; }
};

TEST_P(StripedCollectivesTest, SlotsAreStripedOverDevicesAndCollectivesStayExact) {
  RunRanks(3, [](Communicator& comm, allocator::Allocator& alloc) -> std::string {
    const runtime::DeviceMap& d = alloc.pool().devices();
    if (d.count() != 2) return absl::StrCat("the pool has ", d.count(), " devices");
    const uint32_t r = comm.rank();
    const std::vector<runtime::PoolOffset>& slots = comm.slots();
    for (uint32_t i = 0; i < slots.size(); ++i) {
      if (d.DeviceOf(slots[i]) != (r + i) % 2) {
        return absl::StrCat("rank ", r, "'s slot ", i, " is on device ", d.DeviceOf(slots[i]));
      }
    }
    std::vector<Case> cases;
    for (CollKind k : AllKinds()) {
      cases.push_back(
          {k, DataType::kFloat32, RedOp::kSum, 300000, Rooted(k) ? 2 : -1, false, false});
    }
    return RunAll(comm, cases, alloc.pool());
  });
}

TEST(RankFromEnvironmentTest, ReadsEveryLauncherAndRejectsNonsense) {
  const char* const kVars[] = {
      "CXLRT_RANK", "CXLRT_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "PMI_RANK",   "PMI_SIZE",         "SLURM_PROCID",         "SLURM_NTASKS",
      "RANK",       "WORLD_SIZE"};
  for (const char* v : kVars) unsetenv(v);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kNotFound);
  const struct {
    const char *rank, *size, *source;
  } kCases[] = {{"RANK", "WORLD_SIZE", "torchrun"},
                {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
                {"PMI_RANK", "PMI_SIZE", "mpirun (PMI)"},
                {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)"},
                {"CXLRT_RANK", "CXLRT_WORLD_SIZE", "cxlrt run"}};
  // Each launcher is found; an earlier row of the table wins over later ones.
  for (const auto& c : kCases) {
    setenv(c.rank, "3", 1);
    setenv(c.size, "4", 1);
    auto info = RankFromEnvironment();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->rank, 3);
    EXPECT_EQ(info->nranks, 4);
    EXPECT_EQ(info->source, c.source);
  }
  setenv("CXLRT_RANK", "4", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  setenv("CXLRT_RANK", "two", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv("CXLRT_WORLD_SIZE");
  setenv("CXLRT_RANK", "1", 1);
  EXPECT_EQ(RankFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* v : kVars) unsetenv(v);
}

TEST(ReduceTest, SixteenBitFloatsAccumulateInFp32AndIntegersWrap) {
  // 2048 + 1 + 1 in fp16: pairwise in fp16 the ones vanish (2049 is not an
  // fp16 value); accumulated in fp32 and rounded once they do not.
  Half a[1] = {Half(2048.0f)}, b[1] = {Half(1.0f)}, c[1] = {Half(1.0f)}, out[1];
  const void* srcs[] = {a, b, c};
  Reduce(DataType::kFloat16, RedOp::kSum, out, srcs, 3, 1, 3);
  EXPECT_EQ(static_cast<float>(out[0]), 2050.0f);
  int8_t x[1] = {100}, y[1] = {100}, z[1];
  const void* isrcs[] = {x, y};
  Reduce(DataType::kInt8, RedOp::kSum, z, isrcs, 2, 1, 2);
  EXPECT_EQ(z[0], static_cast<int8_t>(200 - 256));
  // In place: the output is also the third source.
  float f0[3000], f1[3000], f2[3000];
  for (int i = 0; i < 3000; ++i) f0[i] = 1, f1[i] = 2, f2[i] = 4;
  const void* fsrcs[] = {f0, f1, f2};
  Reduce(DataType::kFloat32, RedOp::kAvg, f2, fsrcs, 3, 3000, 3);
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(f2[i], 7.0f / 3.0f) << i;
}

INSTANTIATE_TEST_SUITE_P(Domains, CollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));
INSTANTIATE_TEST_SUITE_P(Domains, StripedCollectivesTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

}  // namespace
}  // namespace cxlrt::collectives
