// What the tests of the hierarchical communicator share (pod_case.h).
#include "tests/pods/pod_case.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace cxlrt::pods {

using collectives::Case;
using collectives::CollKind;
using collectives::RefReduce;
using collectives::Sizes;
using collectives::Store;
using collectives::Value;

// One rank's run of `c` on the hierarchical communicator, checked against
// the reference (what one pool of all the ranks gives). Host buffers.
std::string RunPodCase(MultiPodCommunicator& comm, const Case& c) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = SizeOf(c.type);
  auto [scount, rcount] = Sizes(c, n);
  const size_t big = std::max(scount, rcount);
  std::vector<uint8_t> own_send, own_recv;
  uint8_t *send = nullptr, *recv = nullptr;
  if (c.in_place) {
    own_recv.assign(std::max<size_t>(big * es, 1), 0xEE);
    recv = own_recv.data();
    size_t at = 0;
    if (c.kind == CollKind::kAllGather || c.kind == CollKind::kGather) at = r * c.count;
    send = recv + at * es;
    if (c.kind == CollKind::kReduceScatter || c.kind == CollKind::kScatter) {
      recv = send + r * c.count * es;
    }
  } else {
    own_send.assign(std::max<size_t>(scount * es, 1), 0);
    own_recv.assign(std::max<size_t>(rcount * es, 1), 0xEE);
    send = own_send.data();
    recv = own_recv.data();
  }
  for (size_t i = 0; i < scount; ++i) Store(c.type, send, i, Value(c.type, r, i));
  const absl::Status s = CallCase(comm, c, send, recv);
  if (!s.ok()) return absl::StrCat(collectives::Name(c), " at rank ", r, ": ", s.ToString());
  std::vector<uint8_t> want(std::max<size_t>(rcount * es, 1), 0xEE);
  bool check = true;
  switch (c.kind) {
    case CollKind::kAllReduce:
    case CollKind::kReduce:
      check = c.kind == CollKind::kAllReduce || r == c.root;
      for (size_t i = 0; i < c.count; ++i) RefReduce(c.type, c.op, n, i, want.data(), i);
      break;
    case CollKind::kReduceScatter:
      for (size_t i = 0; i < c.count; ++i) {
        RefReduce(c.type, c.op, n, r * c.count + i, want.data(), i);
      }
      break;
    case CollKind::kAllGather:
    case CollKind::kGather:
      check = c.kind == CollKind::kAllGather || r == c.root;
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < c.count; ++i) {
          Store(c.type, want.data(), j * c.count + i, Value(c.type, j, i));
        }
      }
      break;
    case CollKind::kBroadcast:
      for (size_t i = 0; i < c.count; ++i) Store(c.type, want.data(), i, Value(c.type, c.root, i));
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
  if (check && rcount > 0 && std::memcmp(want.data(), recv, rcount * es) != 0) {
    size_t bad = 0;
    while (bad < rcount * es && want[bad] == recv[bad]) ++bad;
    return absl::StrCat(collectives::Name(c), " at rank ", r, " of ", n, " (pod ", comm.pod(),
                        " local ", comm.local_rank(), "): wrong byte ", bad, " (element ", bad / es,
                        "): got 0x", absl::Hex(recv[bad]), ", want 0x", absl::Hex(want[bad]));
  }
  return "";
}

// Every collective; a few types and ops (every op on int32, kAvg on 16-bit
// floats); counts 0, 1, 7 (fewer than the ranks' shards), 1001 (not
// divisible by any pod or rank count) and 20011 (many 4 KiB chunks).
std::vector<Case> PodMatrix(int n, bool full) {
  struct TypeOp {
    DataType type;
    RedOp op;
  };
  std::vector<TypeOp> reducing = {{DataType::kFloat32, RedOp::kSum},
                                  {DataType::kInt32, RedOp::kAvg},
                                  {DataType::kBfloat16, RedOp::kAvg}};
  if (full) {
    for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax}) {
      reducing.push_back({DataType::kInt32, op});
    }
    reducing.push_back({DataType::kFloat16, RedOp::kAvg});
    reducing.push_back({DataType::kUint8, RedOp::kMax});
    reducing.push_back({DataType::kFloat64, RedOp::kMin});
    reducing.push_back({DataType::kInt8, RedOp::kProd});
  }
  const std::vector<TypeOp> moving = {{DataType::kFloat32, RedOp::kSum},
                                      {DataType::kInt8, RedOp::kSum},
                                      {DataType::kFloat64, RedOp::kSum}};
  std::vector<Case> cases;
  for (CollKind k : collectives::AllKinds()) {
    if (k == CollKind::kBarrier) {
      cases.push_back({k, DataType::kFloat32, RedOp::kSum, 0, -1, false, false});
      continue;
    }
    const auto& tos = collectives::Reduces(k) ? reducing : moving;
    for (size_t t = 0; t < tos.size(); ++t) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{20011}}) {
        if (count == 20011 && t > 0) continue;  // the long run for the first type only
        if (!full && count < 7 && t > 0) continue;
        for (bool in_place : {false, true}) {
          const int root = collectives::Rooted(k) ? static_cast<int>((count + t) % n) : -1;
          cases.push_back({k, tos[t].type, tos[t].op, count, root, in_place, false});
        }
      }
    }
  }
  return cases;
}

// Rank i sends counts[i][j] elements to rank j (zeros included), from
// send + sd[j] into rank j's recv + rd[i], with a gap between pieces that
// must stay untouched.
std::string RunAllToAllV(MultiPodCommunicator& comm, uint32_t seed, DataType type) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = SizeOf(type);
  std::mt19937 rng(seed);
  std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
  for (auto& row : counts) {
    for (auto& c : row) {
      const uint32_t roll = rng() % 8;
      c = roll < 2 ? 0 : roll < 6 ? rng() % 50 : rng() % 5000;  // zeros, small, a few large
    }
  }
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t sat = 0, rat = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = counts[r][j];
    sd[j] = sat;
    sat += sc[j] + 3;
    rc[j] = counts[j][r];
    rd[j] = rat;
    rat += rc[j] + 3;
  }
  auto value = [&](int from, int to, size_t e) {
    return static_cast<double>((from * 31 + to * 7 + e) % 100);
  };
  std::vector<uint8_t> send(std::max<size_t>(sat * es, 1), 0),
      recv(std::max<size_t>(rat * es, 1), 0xEE);
  for (int j = 0; j < n; ++j) {
    for (size_t e = 0; e < sc[j]; ++e) Store(type, send.data(), sd[j] + e, value(r, j, e));
  }
  absl::Status s = comm.AllToAllV(send.data(), sc, sd, recv.data(), rc, rd, type);
  if (!s.ok()) return "AllToAllV: " + s.ToString();
  std::vector<uint8_t> want(recv.size(), 0xEE);
  for (int j = 0; j < n; ++j) {
    for (size_t e = 0; e < rc[j]; ++e) Store(type, want.data(), rd[j] + e, value(j, r, e));
  }
  if (want != recv) {
    size_t bad = 0;
    while (want[bad] == recv[bad]) ++bad;
    return absl::StrCat("AllToAllV seed ", seed, " at rank ", r, ": wrong byte ", bad);
  }
  return "";
}

}  // namespace cxlrt::pods
