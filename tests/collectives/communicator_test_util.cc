#include "tests/collectives/communicator_test_util.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::collectives {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::WaitExit;

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

std::string Name(const Case& c) {
  return absl::StrCat(CollKindName(c.kind), "(", c.count, " ", DataTypeName(c.type), " ",
                      RedOpName(c.op), " root ", c.root, c.in_place ? " in place" : "",
                      c.in_pool ? " pool-resident" : "", ")");
}

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

  const absl::Status s = CallCase(comm, c, send, recv);
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

absl::StatusOr<RankHost> OpenRankHost(const std::string& uri, absl::Duration lease) {
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

void CollectivesTest::SetUp() {
  create_ = PoolUri(
      dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam()), Extra()), "512M");
  auto p = runtime::Pool::Create(create_);
  ASSERT_TRUE(p.ok()) << p.status();
  uri_ = OpenUri(create_);
  // Children report their first failure here.
  errors_ = static_cast<char*>(
      mmap(nullptr, kErrBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(errors_, MAP_FAILED);
}

void CollectivesTest::TearDown() { munmap(errors_, kErrBytes); }

void CollectivesTest::RunRanks(int n, const Body& body, absl::Duration timeout,
                               const CommOptions& options, const std::string& name,
                               const std::function<int(int)>& expect_rc) {
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

}  // namespace cxlrt::collectives
