#include "bench/coll_bench.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/runtime/affinity.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using collectives::CollKind;
using collectives::Communicator;
using collectives::DataType;
using collectives::RedOp;
using runtime::NowNs;

// The collectives this benchmark runs; kBarrier stands for sendrecv.
struct Kind {
  const char* name;
  CollKind kind;
  bool sendrecv;
};
constexpr Kind kKinds[] = {
    {"allreduce", CollKind::kAllReduce, false}, {"reducescatter", CollKind::kReduceScatter, false},
    {"allgather", CollKind::kAllGather, false}, {"broadcast", CollKind::kBroadcast, false},
    {"reduce", CollKind::kReduce, false},       {"gather", CollKind::kGather, false},
    {"scatter", CollKind::kScatter, false},     {"alltoall", CollKind::kAllToAll, false},
    {"sendrecv", CollKind::kBarrier, true},
};

bool Reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter;
}
bool Rooted(CollKind k) {
  return k == CollKind::kBroadcast || k == CollKind::kReduce || k == CollKind::kGather ||
         k == CollKind::kScatter;
}

// nccl-tests' bus bandwidth factor: what each rank's link carries.
double BusFactor(const Kind& k, int n) {
  if (k.sendrecv) return 1;
  switch (k.kind) {
    case CollKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return 1;
    default:
      return static_cast<double>(n - 1) / n;
  }
}

// The fewest seconds an op of `bytes` (nccl-tests' size) can take on the
// slowest rank when every byte a rank reads from its peers, or writes into
// the pool for them, is one copy at `copy_gbps` (the best single-thread
// copy at that size, measured in cache when it fits: a peer's bytes come
// from another core or from memory, which is no faster). Reductions count
// only their peers' bytes, as one copy each; private buffers add the copy
// into the pool that a CXL host needs before a peer can read its bytes
// (pool-resident ones are posted in place). The algorithms' own extra
// traffic is not counted, so busbw above the bound would mean the bound
// is wrong.
double BoundSeconds(const Kind& k, int n, double bytes, bool in_pool, double copy_gbps) {
  const double peers = static_cast<double>(n - 1) / n, S = bytes;
  const double priv = in_pool ? 0 : 1;
  double t = 0;  // bytes moved by the busiest rank
  if (k.sendrecv) {
    t = S + priv * S;
  } else {
    switch (k.kind) {
      case CollKind::kAllReduce:  // two-shot: read (n-1)/n S twice; post what peers need
        t = S <= (64 << 10) ? (n - 1) * S + priv * S : 2 * peers * S + priv * peers * S + S / n;
        break;
      case CollKind::kReduceScatter:
      case CollKind::kAllToAll:
        t = peers * S + priv * peers * S;
        break;
      case CollKind::kAllGather:
        t = peers * S + priv * S / n;
        break;
      case CollKind::kBroadcast:
        t = S;
        break;
      case CollKind::kReduce:
        t = std::max((n - 1) * S, priv * S);
        break;
      case CollKind::kGather:
      case CollKind::kScatter:
        t = std::max(peers * S, priv * S / n);
        break;
      default:
        t = 0;
    }
  }
  return n == 1 || copy_gbps <= 0 ? 0 : t / (copy_gbps * 1e9);
}

// What a run is held against, measured before the ranks start.
struct Limits {
  CopyLimits copy;                                   // at 64 MiB
  std::vector<std::pair<uint64_t, double>> at_size;  // best single-thread copy per size
  std::string affinity;
  double CopyAt(uint64_t bytes) const {
    for (const auto& [b, g] : at_size) {
      if (b == bytes) return g;
    }
    return copy.best_single;
  }
};

// Element counts of one call at `bytes` (nccl-tests' sizes: the larger
// buffer): the call's count argument, send and receive elements.
struct Counts {
  size_t arg, send, recv;
};
Counts CountsFor(const Kind& k, size_t bytes, size_t es, int n) {
  const size_t total = bytes / es;
  if (k.sendrecv) return {total, total, total};
  switch (k.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return {total, total, total};
    case CollKind::kAllGather:
    case CollKind::kGather:
      return {total / n, total / n, total / n * n};
    case CollKind::kReduceScatter:
    case CollKind::kScatter:
      return {total / n, total / n * n, total / n};
    case CollKind::kAllToAll:
      return {total / n, total / n * n, total / n * n};
    default:
      return {0, 0, 0};
  }
}

// Input element i of rank r: small integers, exact in every type.
double Pattern(DataType t, int r, size_t i) {
  const int v = static_cast<int>((r * 7 + i * 3) % 11);
  const bool unsigned_type =
      t == DataType::kUint8 || t == DataType::kUint32 || t == DataType::kUint64;
  return unsigned_type ? v : v - 5;
}

template <typename T>
void StoreAs(void* buf, size_t i, double v) {
  static_cast<T*>(buf)[i] = static_cast<T>(v);
}
void Store(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kInt8:
      return StoreAs<int8_t>(buf, i, v);
    case DataType::kUint8:
      return StoreAs<uint8_t>(buf, i, v);
    case DataType::kInt32:
      return StoreAs<int32_t>(buf, i, v);
    case DataType::kUint32:
      return StoreAs<uint32_t>(buf, i, v);
    case DataType::kInt64:
      return StoreAs<int64_t>(buf, i, v);
    case DataType::kUint64:
      return StoreAs<uint64_t>(buf, i, v);
    case DataType::kFloat16:
      return StoreAs<collectives::Half>(buf, i, v);
    case DataType::kBfloat16: {  // small integers: the top half of the fp32 is exact
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(u >> 16);
      return;
    }
    case DataType::kFloat32:
      return StoreAs<float>(buf, i, v);
    case DataType::kFloat64:
      return StoreAs<double>(buf, i, v);
  }
}

void Fill(DataType t, void* buf, size_t count, int rank, size_t first = 0) {
  for (size_t i = 0; i < count; ++i) Store(t, buf, i, Pattern(t, rank, first + i));
}

// Elements of `got` (rank r's receive buffer after the call) that differ
// from what the call must produce.
uint64_t CountWrong(const Kind& k, DataType t, RedOp op, int n, int r, int root, const Counts& c,
                    const uint8_t* got) {
  const size_t es = collectives::SizeOf(t);
  uint64_t wrong = 0;
  std::vector<uint8_t> want(std::max<size_t>(c.arg, 1) * es);
  auto compare = [&](const uint8_t* at, size_t elems) {
    for (size_t i = 0; i < elems; ++i) {
      wrong += std::memcmp(at + i * es, want.data() + i * es, es) != 0;
    }
  };
  if (k.sendrecv) {
    Fill(t, want.data(), c.arg, (r + n - 1) % n);
    compare(got, c.arg);
    return wrong;
  }
  if (Reduces(k.kind)) {
    if (k.kind == CollKind::kReduce && r != root) return 0;
    // The reduction of every rank's pattern, block by block.
    const size_t first = k.kind == CollKind::kReduceScatter ? r * c.arg : 0;
    constexpr size_t kBlock = 1 << 14;
    std::vector<std::vector<uint8_t>> src(n, std::vector<uint8_t>(kBlock * es));
    std::vector<const void*> ptrs(n);
    for (size_t at = 0; at < c.arg; at += kBlock) {
      const size_t m = std::min(kBlock, c.arg - at);
      for (int j = 0; j < n; ++j) {
        Fill(t, src[j].data(), m, j, first + at);
        ptrs[j] = src[j].data();
      }
      collectives::Reduce(t, op, want.data(), ptrs.data(), n, m, n);
      compare(got + at * es, m);
    }
    return wrong;
  }
  switch (k.kind) {
    case CollKind::kBroadcast:
      Fill(t, want.data(), c.arg, root);
      compare(got, c.arg);
      break;
    case CollKind::kAllGather:
    case CollKind::kGather:
      if (k.kind == CollKind::kGather && r != root) return 0;
      for (int j = 0; j < n; ++j) {
        Fill(t, want.data(), c.arg, j);
        compare(got + j * c.arg * es, c.arg);
      }
      break;
    case CollKind::kScatter:
      Fill(t, want.data(), c.arg, root, r * c.arg);
      compare(got, c.arg);
      break;
    case CollKind::kAllToAll:
      for (int j = 0; j < n; ++j) {
        Fill(t, want.data(), c.arg, j, r * c.arg);
        compare(got + j * c.arg * es, c.arg);
      }
      break;
    default:
      break;
  }
  return wrong;
}

absl::Status Call(Communicator& comm, const Kind& k, DataType t, RedOp op, int root,
                  const Counts& c, const void* send, void* recv) {
  if (k.sendrecv) {
    const int n = comm.size(), r = comm.rank();
    if (n == 1) {
      std::memmove(recv, send, c.arg * collectives::SizeOf(t));
      return absl::OkStatus();
    }
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    // Even ranks send first: no cycle of blocked sends.
    for (int step = 0; step < 2; ++step) {
      absl::Status s =
          r % 2 == step ? comm.Send(send, c.arg, t, to) : comm.Recv(recv, c.arg, t, from);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  switch (k.kind) {
    case CollKind::kAllReduce:
      return comm.AllReduce(send, recv, c.arg, t, op);
    case CollKind::kReduceScatter:
      return comm.ReduceScatter(send, recv, c.arg, t, op);
    case CollKind::kAllGather:
      return comm.AllGather(send, recv, c.arg, t);
    case CollKind::kBroadcast:
      return comm.Broadcast(send, recv, c.arg, t, root);
    case CollKind::kReduce:
      return comm.Reduce(send, recv, c.arg, t, op, root);
    case CollKind::kGather:
      return comm.Gather(send, recv, c.arg, t, root);
    case CollKind::kScatter:
      return comm.Scatter(send, recv, c.arg, t, root);
    case CollKind::kAllToAll:
      return comm.AllToAll(send, recv, c.arg, t);
    default:
      return absl::InvalidArgumentError("not a benchmarked collective");
  }
}

// Where the in-place call reads and writes (NCCL's conventions).
std::pair<const void*, void*> InPlace(const Kind& k, uint8_t* buf, const Counts& c, size_t es,
                                      int r) {
  if (k.kind == CollKind::kAllGather || k.kind == CollKind::kGather) {
    return {buf + r * c.arg * es, buf};
  }
  if (k.kind == CollKind::kReduceScatter || k.kind == CollKind::kScatter) {
    return {buf, buf + r * c.arg * es};
  }
  return {buf, buf};
}

struct Row {
  uint64_t bytes, count;
  double time_us[2];
  double algbw[2], busbw[2];
  uint64_t wrong[2];
  double bound_busbw;  // busbw at the traffic bound (BoundSeconds)
};

// One rank's whole run. Rank 0 prints. Returns 0 on success.
int RunRank(const CollBenchOptions& o, const Kind& k, DataType t, RedOp op, const std::string& uri,
            int nranks, int rank, const Limits& limits) {
  const double memcpy_gbps = limits.copy.memcpy;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "cxlrt bench %s: rank %d: %s\n", o.collective.c_str(), rank, what.c_str());
    return 1;
  };
  auto host = AttachHost(uri, AnySlot());
  if (!host.ok()) return fail(host.status().ToString());
  auto comm = Communicator::Create(*host->alloc, "bench/" + o.collective, nranks, rank);
  if (!comm.ok()) return fail(comm.status().ToString());
  Communicator& cm = **comm;

  const size_t es = collectives::SizeOf(t);
  const size_t max_elems = std::max<uint64_t>(o.max_bytes, es) / es;
  const size_t buf_bytes = (max_elems + nranks) * es;  // room for the rounding of counts
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  if (o.in_pool) {
    auto s = cm.Allocate(buf_bytes);
    auto r = cm.Allocate(buf_bytes);
    if (!s.ok() || !r.ok())
      return fail("pool buffers: " + (s.ok() ? r.status() : s.status()).ToString());
    send = static_cast<uint8_t*>(*s);
    recv = static_cast<uint8_t*>(*r);
  } else {
    void* a = mmap(nullptr, 2 * buf_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (a == MAP_FAILED) return fail("mmap of the buffers failed");
    send = static_cast<uint8_t*>(a);
    recv = send + buf_bytes;
  }
  Prefault(send, buf_bytes);
  Prefault(recv, buf_bytes);
  // --device: the collective runs on GPU buffers; send and recv above are
  // their host images (filled, then copied in; copied out, then checked).
  uint8_t* dsend = nullptr;
  uint8_t* drecv = nullptr;
  if (o.device) {
    if (o.in_pool) return fail("--device and --in-pool exclude each other");
    auto a = gpu::GpuAlloc(buf_bytes);
    auto b = gpu::GpuAlloc(buf_bytes);
    if (!a.ok() || !b.ok()) return fail("GPU buffers: " + (a.ok() ? b : a).status().ToString());
    dsend = static_cast<uint8_t*>(*a);
    drecv = static_cast<uint8_t*>(*b);
    if (rank == 0) {
      std::printf("# %s", gpu::DescribeGpus(nullptr, 0).c_str());
    }
  }
  // Where a host pointer into send/recv lies in the GPU images.
  auto on_device = [&](const void* p) -> uint8_t* {
    const auto* b = static_cast<const uint8_t*>(p);
    if (b >= send && b < send + buf_bytes) return dsend + (b - send);
    return drecv + (b - recv);
  };

  std::vector<Row> rows;
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = std::max<uint64_t>(bytes + 1, bytes * o.factor)) {
    const Counts c = CountsFor(k, bytes, es, nranks);
    Row row = {};
    row.bytes = std::max(c.send, c.recv) * es;
    row.count = std::max(c.send, c.recv);
    // In place means nothing for a send and a receive of one buffer at
    // once: sendrecv reports out of place only (nccl-tests does the same).
    for (int in_place = 0; in_place < (k.sendrecv ? 1 : 2); ++in_place) {
      const void* s = send;
      void* r = recv;
      if (in_place) std::tie(s, r) = InPlace(k, recv, c, es, rank);
      const void* cs = o.device ? on_device(s) : s;  // what the call is given
      void* cr = o.device ? on_device(r) : r;
      auto fill = [&]() -> absl::Status {
        if (in_place) {
          Fill(t, const_cast<void*>(s), c.send, rank);
        } else {
          Fill(t, send, c.send, rank);
        }
        if (!o.device) return absl::OkStatus();
        return gpu::CopySync(const_cast<void*>(cs), s, c.send * es);
      };
      if (absl::Status st = fill(); !st.ok()) return fail(st.ToString());
      for (int w = 0; w < o.warmup; ++w) {
        if (absl::Status st = Call(cm, k, t, op, o.root, c, cs, cr); !st.ok())
          return fail(st.ToString());
      }
      if (absl::Status st = cm.Barrier(); !st.ok()) return fail(st.ToString());
      const int64_t t0 = NowNs();
      for (int it = 0; it < o.iters; ++it) {
        if (absl::Status st = Call(cm, k, t, op, o.root, c, cs, cr); !st.ok())
          return fail(st.ToString());
      }
      double us = static_cast<double>(NowNs() - t0) / 1e3 / std::max(1, o.iters);
      uint64_t wrong = 0;
      if (o.check) {
        if (absl::Status st = fill(); !st.ok()) return fail(st.ToString());
        if (absl::Status st = Call(cm, k, t, op, o.root, c, cs, cr); !st.ok())
          return fail(st.ToString());
        if (o.device) {
          if (absl::Status st = gpu::CopySync(recv, drecv, buf_bytes); !st.ok())
            return fail(st.ToString());
        }
        wrong = CountWrong(k, t, op, nranks, rank, o.root, c, static_cast<const uint8_t*>(r));
      }
      // The slowest rank's time; every rank's wrong elements.
      double us_max = 0;
      uint64_t wrong_sum = 0;
      if (!cm.AllReduce(&us, &us_max, 1, DataType::kFloat64, RedOp::kMax).ok() ||
          !cm.AllReduce(&wrong, &wrong_sum, 1, DataType::kUint64, RedOp::kSum).ok()) {
        return fail("gathering the results failed");
      }
      row.time_us[in_place] = us_max;
      row.algbw[in_place] = us_max > 0 ? static_cast<double>(row.bytes) / (us_max * 1e3) : 0;
      row.busbw[in_place] = row.algbw[in_place] * BusFactor(k, nranks);
      row.wrong[in_place] = wrong_sum;
    }
    const double bound_s =
        BoundSeconds(k, nranks, static_cast<double>(row.bytes), o.in_pool, limits.CopyAt(bytes));
    // With --device the limit is the GPU's DMA (cxlrt bench dma), not a CPU copy.
    row.bound_busbw = bound_s > 0 && !o.device
                          ? static_cast<double>(row.bytes) / bound_s / 1e9 * BusFactor(k, nranks)
                          : 0;
    rows.push_back(row);
    if (bytes == o.max_bytes) break;
  }
  gpu::GpuFree(dsend);
  gpu::GpuFree(drecv);
  if (absl::Status st = cm.Destroy(); !st.ok()) return fail(st.ToString());
  if (rank != 0) return 0;

  const char* root_text = Rooted(k.kind) ? "" : "-1";
  if (o.json) {
    for (const Row& r : rows) {
      nlohmann::json j = {{"collective", o.collective},
                          {"ranks", nranks},
                          {"bytes", r.bytes},
                          {"count", r.count},
                          {"type", collectives::DataTypeName(t)},
                          {"redop", Reduces(k.kind) ? collectives::RedOpName(op) : "none"},
                          {"root", Rooted(k.kind) ? o.root : -1},
                          {"in_pool", o.in_pool},
                          {"time_us", r.time_us[0]},
                          {"algbw_gbps", r.algbw[0]},
                          {"busbw_gbps", r.busbw[0]},
                          {"wrong", r.wrong[0]},
                          {"inplace_time_us", r.time_us[1]},
                          {"inplace_algbw_gbps", r.algbw[1]},
                          {"inplace_busbw_gbps", r.busbw[1]},
                          {"inplace_wrong", r.wrong[1]},
                          {"memcpy_gbps", memcpy_gbps},
                          {"best_copy_gbps", limits.copy.best_single},
                          {"nt_copy_gbps", limits.copy.nontemporal},
                          {"two_thread_copy_gbps", limits.copy.two_threads},
                          {"bound_busbw_gbps", r.bound_busbw},
                          {"busbw_vs_bound", r.bound_busbw > 0 ? r.busbw[0] / r.bound_busbw : 0},
                          {"affinity", limits.affinity},
                          {"busbw_vs_memcpy", memcpy_gbps > 0 ? r.busbw[0] / memcpy_gbps : 0}};
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }
  std::printf("# cxlrt bench %s: %d ranks, %s, %s buffers, %d warm-up + %d timed iterations\n",
              o.collective.c_str(), nranks, uri.c_str(), o.in_pool ? "pool-resident" : "private",
              o.warmup, o.iters);
  std::printf(
      "# copy limits (one thread, 64 MiB): memcpy %.2f, vector %.2f, non-temporal %.2f GB/s; "
      "two threads %.2f GB/s\n",
      limits.copy.memcpy, limits.copy.vector, limits.copy.nontemporal, limits.copy.two_threads);
  std::printf("# affinity: %s\n", limits.affinity.c_str());
  std::printf(
      "# bound: busbw if every byte a rank must read from peers or post for them were "
      "one copy at the best single-thread rate at that size\n");
  std::printf("#%79s%37s\n", "out-of-place", "in-place");
  std::printf("#%11s %12s %8s %6s %5s %9s %7s %7s %6s %9s %7s %7s %6s %9s %7s %9s\n", "size",
              "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
              "busbw", "#wrong", "bus/memcpy", "bound", "bus/bound");
  std::printf("#%11s %12s %8s %6s %5s %9s %7s %7s %6s %9s %7s %7s %6s %9s %7s %9s\n", "(B)",
              "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
              "", "", "(GB/s)", "");
  for (const Row& r : rows) {
    std::printf(
        "%12lu %12lu %8s %6s %5s %9.2f %7.2f %7.2f %6lu %9.2f %7.2f %7.2f %6lu %9.2f %7.2f %9.2f\n",
        static_cast<unsigned long>(r.bytes), static_cast<unsigned long>(r.count),
        collectives::DataTypeName(t), Reduces(k.kind) ? collectives::RedOpName(op) : "none",
        Rooted(k.kind) ? absl::StrCat(o.root).c_str() : root_text, r.time_us[0], r.algbw[0],
        r.busbw[0], static_cast<unsigned long>(r.wrong[0]), r.time_us[1], r.algbw[1], r.busbw[1],
        static_cast<unsigned long>(r.wrong[1]), memcpy_gbps > 0 ? r.busbw[0] / memcpy_gbps : 0.0,
        r.bound_busbw, r.bound_busbw > 0 ? r.busbw[0] / r.bound_busbw : 0.0);
  }
  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong[0] + r.wrong[1];
  std::printf("# wrong elements: %lu\n", static_cast<unsigned long>(wrong));
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int RunCollBench(const CollBenchOptions& o) {
  const Kind* kind = nullptr;
  for (const Kind& k : kKinds) {
    if (o.collective == k.name) kind = &k;
  }
  auto type = collectives::ParseDataType(o.type);
  auto op = collectives::ParseRedOp(o.op);
  if (!kind || !type || !op) {
    std::fprintf(stderr, "cxlrt bench: unknown %s '%s'\n",
                 !kind ? "collective" : (!type ? "type" : "op"),
                 (!kind ? o.collective : (!type ? o.type : o.op)).c_str());
    return 1;
  }
  if (o.min_bytes > o.max_bytes || o.factor < 2 || o.iters < 1 || o.warmup < 0) {
    std::fprintf(stderr, "cxlrt bench: need -b <= -e, -f >= 2, -n >= 1, -w >= 0\n");
    return 1;
  }
  // The limits, measured before any rank runs (a quiet machine).
  Limits limits;
  limits.copy = MeasureCopyLimits(64 << 20, 5);
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = std::max<uint64_t>(bytes + 1, bytes * o.factor)) {
    limits.at_size.emplace_back(bytes, BestCopyGbps(bytes));
    if (bytes == o.max_bytes) break;
  }

  // Under a launcher: this process is one rank; the pool is shared.
  auto env = collectives::RankFromEnvironment();
  if (env.ok()) {
    const char* core = std::getenv("CXLRT_BOUND_CORE");
    limits.affinity = core ? absl::StrCat("by the launcher: rank ", env->rank, " on core ", core)
                           : "by the launcher, or none";
    std::string uri = o.pool.empty() ? runtime::DefaultPoolUri() : o.pool;
    if (env->rank == 0) {
      (void)runtime::Pool::Create(uri);  // kAlreadyExists is fine: a launcher made it
    }
    return RunRank(o, *kind, *type, *op, uri, env->nranks, env->rank, limits);
  }
  if (o.ranks < 1 || o.ranks > 64 || o.root < 0 || o.root >= o.ranks) {
    std::fprintf(stderr, "cxlrt bench: --ranks must be 1..64 and --root below it\n");
    return 1;
  }
  // Our own ranks, as emulated hosts of a pool made for the run.
  // A rank's data slots (4 MiB each where a GPU is and none was set), its
  // lines and buffers, and its in-pool buffers.
  const uint64_t slots = uint64_t{collectives::kCommDepth.Get()} *
                         std::max<uint64_t>(collectives::kCommSlotBytes.Get(), 4 << 20);
  const uint64_t per_rank = (4ull << 20) + slots + (o.in_pool ? 2 * (o.max_bytes + (1 << 20)) : 0);
  const std::string uri = o.pool.empty() ? absl::StrCat("emu://bench-coll-", getpid()) : o.pool;
  auto scratch = ScratchPool::Create(uri, (128ull << 20) + o.ranks * per_rank);
  if (!scratch.ok()) {
    std::fprintf(stderr, "cxlrt bench: %s\n", scratch.status().ToString().c_str());
    return 1;
  }
  auto plan = runtime::PlanAffinity(o.ranks, runtime::AffinitySetting());
  if (!plan.ok()) {
    std::fprintf(stderr, "cxlrt bench: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  limits.affinity = plan->why;
  return RunForkedRanks(o.ranks, plan->cores, [&](int r) {
    return RunRank(o, *kind, *type, *op, (*scratch)->open_uri(), o.ranks, r, limits);
  });
}

}  // namespace cxlrt::bench
