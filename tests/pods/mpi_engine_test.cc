// The Open MPI engine between pods (cxlrt/pods/mpi_engine.h), run under
// mpirun with 3 ranks or more (tests/CMakeLists.txt): every operation, type
// and op exact against a reference each rank computes alone, Split into
// uneven rails, Send/Recv matched in order per tag, the cutting of long
// counts, bad arguments, Abort. Every rank runs every test in the same
// order; a wait that fails on one rank fails the others at its deadline.
// The deadline and killed-member paths: mpi_engine_fault.cc.
#include "cxlrt/pods/mpi_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "cxlrt/collectives/types.h"

namespace cxlrt::pods {
namespace {

using collectives::DataType;
using collectives::RedOp;

constexpr DataType kAllTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,
                                  DataType::kUint32,  DataType::kInt64,    DataType::kUint64,
                                  DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32,
                                  DataType::kFloat64};
constexpr RedOp kEngineOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax};

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

InterPodEngine& World() {
  static std::unique_ptr<InterPodEngine> world = [] {
    auto w = MpiEngine::World(MPI_COMM_WORLD);
    if (!w.ok()) {
      fprintf(stderr, "MpiEngine::World: %s\n", std::string(w.status().message()).c_str());
      std::abort();
    }
    return std::move(*w);
  }();
  return *world;
}

// Element i of member `m`'s input: small integers 1..5, so that every op
// (3 members: products up to 125) is exact in every type, int8 and bf16
// included, whatever order MPI reduces in.
int Value(int m, size_t i, int salt) { return static_cast<int>((m * 7 + i * 3 + salt) % 5) + 1; }

void Store(DataType t, void* buf, size_t i, int v) {
  switch (t) {
    case DataType::kInt8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v);
      return;
    case DataType::kUint8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      return;
    case DataType::kInt32:
      static_cast<int32_t*>(buf)[i] = v;
      return;
    case DataType::kUint32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v);
      return;
    case DataType::kInt64:
      static_cast<int64_t*>(buf)[i] = v;
      return;
    case DataType::kUint64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v);
      return;
    case DataType::kFloat16:
      static_cast<collectives::Half*>(buf)[i] = collectives::Half(static_cast<float>(v));
      return;
    case DataType::kBfloat16: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(bits >> 16);  // exact: small ints
      return;
    }
    case DataType::kFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      return;
    case DataType::kFloat64:
      static_cast<double*>(buf)[i] = v;
      return;
  }
}

std::vector<char> Input(DataType t, int m, size_t count, int salt) {
  std::vector<char> b(count * collectives::SizeOf(t) + 1);
  for (size_t i = 0; i < count; ++i) Store(t, b.data(), i, Value(m, i, salt));
  return b;
}

// op over every member's Input, in member order.
std::vector<char> Reference(DataType t, RedOp op, int members, size_t count, int salt) {
  std::vector<std::vector<char>> in;
  std::vector<const void*> srcs;
  for (int m = 0; m < members; ++m) in.push_back(Input(t, m, count, salt));
  for (auto& b : in) srcs.push_back(b.data());
  std::vector<char> out(count * collectives::SizeOf(t) + 1);
  if (count) collectives::Reduce(t, op, out.data(), srcs.data(), members, count, 1);
  return out;
}

std::string Case(DataType t, RedOp op, size_t count) {
  return std::string(collectives::DataTypeName(t)) + " " + collectives::RedOpName(op) +
         " count=" + std::to_string(count);
}

TEST(MpiEngineTest, WorldHasEveryRank) {
  World();  // initialises MPI
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(World().rank(), rank);
  EXPECT_EQ(World().size(), size);
  EXPECT_STREQ(World().name(), "mpi");
  ASSERT_GE(size, 3) << "run under mpirun -n 3 or more";
}

TEST(MpiEngineTest, AllReduceIsExactForEveryTypeAndOp) {
  InterPodEngine& w = World();
  for (DataType t : kAllTypes) {
    for (RedOp op : kEngineOps) {
      for (size_t count : {size_t{1}, size_t{1000}}) {
        const size_t bytes = count * collectives::SizeOf(t);
        std::vector<char> send = Input(t, w.rank(), count, 1), recv(bytes + 1, 0x5a);
        auto ticket = w.AllReduce(send.data(), recv.data(), count, t, op);
        ASSERT_TRUE(ticket.ok()) << ticket.status();
        ASSERT_TRUE(w.Wait(*ticket, Soon()).ok()) << Case(t, op, count);
        const std::vector<char> want = Reference(t, op, w.size(), count, 1);
        EXPECT_EQ(0, std::memcmp(recv.data(), want.data(), bytes)) << Case(t, op, count);
        EXPECT_EQ(recv[bytes], 0x5a) << "wrote past the end: " << Case(t, op, count);
        // In place.
        auto again = w.AllReduce(send.data(), send.data(), count, t, op);
        ASSERT_TRUE(again.ok()) << again.status();
        ASSERT_TRUE(w.Wait(*again, Soon()).ok());
        EXPECT_EQ(0, std::memcmp(send.data(), want.data(), bytes))
            << "in place " << Case(t, op, count);
      }
    }
  }
}

TEST(MpiEngineTest, ReduceScatterIsExactForEveryTypeAndOp) {
  InterPodEngine& w = World();
  const size_t rc = 37;
  for (DataType t : kAllTypes) {
    for (RedOp op : kEngineOps) {
      const size_t esz = collectives::SizeOf(t);
      std::vector<char> send = Input(t, w.rank(), rc * w.size(), 2), recv(rc * esz, 0);
      auto ticket = w.ReduceScatter(send.data(), recv.data(), rc, t, op);
      ASSERT_TRUE(ticket.ok()) << ticket.status();
      ASSERT_TRUE(w.Wait(*ticket, Soon()).ok());
      const std::vector<char> want = Reference(t, op, w.size(), rc * w.size(), 2);
      EXPECT_EQ(0, std::memcmp(recv.data(), want.data() + w.rank() * rc * esz, rc * esz))
          << Case(t, op, rc);
      // In place (send == recv): the shard lands at the start.
      auto again = w.ReduceScatter(send.data(), send.data(), rc, t, op);
      ASSERT_TRUE(again.ok()) << again.status();
      ASSERT_TRUE(w.Wait(*again, Soon()).ok());
      EXPECT_EQ(0, std::memcmp(send.data(), want.data() + w.rank() * rc * esz, rc * esz))
          << "in place " << Case(t, op, rc);
    }
  }
}

TEST(MpiEngineTest, AllGatherBroadcastAndReduceAreExactForEveryType) {
  InterPodEngine& w = World();
  const size_t count = 101;
  for (DataType t : kAllTypes) {
    const size_t esz = collectives::SizeOf(t), bytes = count * esz;
    std::vector<char> want(bytes * w.size());
    for (int m = 0; m < w.size(); ++m) {
      std::vector<char> in = Input(t, m, count, 3);
      std::memcpy(want.data() + m * bytes, in.data(), bytes);
    }
    std::vector<char> send = Input(t, w.rank(), count, 3), recv(bytes * w.size(), 0);
    auto ticket = w.AllGather(send.data(), recv.data(), count, t);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    ASSERT_TRUE(w.Wait(*ticket, Soon()).ok());
    EXPECT_EQ(recv, want) << collectives::DataTypeName(t);
    // In place: send == recv + rank * count.
    std::vector<char> inplace(bytes * w.size(), 0);
    std::memcpy(inplace.data() + w.rank() * bytes, send.data(), bytes);
    ticket = w.AllGather(inplace.data() + w.rank() * bytes, inplace.data(), count, t);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    ASSERT_TRUE(w.Wait(*ticket, Soon()).ok());
    EXPECT_EQ(inplace, want) << "in place " << collectives::DataTypeName(t);

    for (int root = 0; root < w.size(); ++root) {
      std::vector<char> buf =
          w.rank() == root ? Input(t, root, count, 4) : std::vector<char>(bytes + 1, 0);
      auto b = w.Broadcast(buf.data(), count, t, root);
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_TRUE(w.Wait(*b, Soon()).ok());
      EXPECT_EQ(0, std::memcmp(buf.data(), Input(t, root, count, 4).data(), bytes))
          << collectives::DataTypeName(t) << " root " << root;

      for (RedOp op : kEngineOps) {
        std::vector<char> in = Input(t, w.rank(), count, 5), out(bytes, 0);
        auto r = w.Reduce(in.data(), out.data(), count, t, op, root);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(w.Wait(*r, Soon()).ok());
        if (w.rank() == root) {
          const std::vector<char> ref = Reference(t, op, w.size(), count, 5);
          EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), bytes)) << Case(t, op, count);
        }
        // In place at the root.
        r = w.Reduce(in.data(), in.data(), count, t, op, root);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(w.Wait(*r, Soon()).ok());
        if (w.rank() == root) {
          const std::vector<char> ref = Reference(t, op, w.size(), count, 5);
          EXPECT_EQ(0, std::memcmp(in.data(), ref.data(), bytes))
              << "in place " << Case(t, op, count);
        }
      }
    }
  }
}

// Bytes member `from` sends to member `to` in round `round`: 0 for about a
// third of the pairs, else up to 5000 (same on every member).
size_t Split(int from, int to, int round) {
  std::mt19937 g(static_cast<uint32_t>(from * 1000 + to * 10 + round));
  return g() % 3 == 0 ? 0 : g() % 5000;
}
char Byte(int from, int to, size_t i) { return static_cast<char>(from * 31 + to * 7 + i); }

TEST(MpiEngineTest, AllToAllVMatchesAReferenceWithRandomSplitsAndZeros) {
  InterPodEngine& w = World();
  const int n = w.size(), me = w.rank();
  for (int round = 0; round < 5; ++round) {
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t st = 0, rt = 0;
    for (int j = 0; j < n; ++j) {
      // Gaps between the blocks, in reverse order on the receive side.
      sc[j] = Split(me, j, round);
      sd[j] = st + 3;
      st = sd[j] + sc[j];
      rc[n - 1 - j] = Split(n - 1 - j, me, round);
      rd[n - 1 - j] = rt + 5;
      rt = rd[n - 1 - j] + rc[n - 1 - j];
    }
    std::vector<char> send(st, 0), recv(rt, 0x11);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < sc[j]; ++i) send[sd[j] + i] = Byte(me, j, i);
    }
    auto t = w.AllToAllV(send.data(), sc, sd, recv.data(), rc, rd);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(w.Wait(*t, Soon()).ok());
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < rc[j]; ++i) {
        ASSERT_EQ(recv[rd[j] + i], Byte(j, me, i)) << "round " << round << " from " << j;
      }
      for (size_t g = rd[j] - 5; g < rd[j]; ++g) ASSERT_EQ(recv[g], 0x11) << "gap written";
    }
  }
}

TEST(MpiEngineTest, SendRecvMatchInOrderPerTag) {
  InterPodEngine& w = World();
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  // To `next`: tag 5 "a", tag 7 "b", tag 5 "c"; from `prev`, receive tag 7
  // first: per (peer, tag) in order, across tags in any order.
  std::vector<std::string> out = {std::string(1000, 'a'), std::string(1000, 'b'),
                                  std::string(1000, 'c')};
  const int tags[] = {5, 7, 5};
  std::vector<InterPodEngine::Ticket> tickets;
  std::string b7(1000, 0), b5a(1000, 0), b5b(1000, 0);
  auto r7 = w.Recv(b7.data(), 1000, prev, 7);
  auto r5a = w.Recv(b5a.data(), 1000, prev, 5);
  auto r5b = w.Recv(b5b.data(), 1000, prev, 5);
  ASSERT_TRUE(r7.ok() && r5a.ok() && r5b.ok());
  for (int i = 0; i < 3; ++i) {
    auto s = w.Send(out[i].data(), out[i].size(), next, tags[i]);
    ASSERT_TRUE(s.ok()) << s.status();
    tickets.push_back(*s);
  }
  ASSERT_TRUE(w.Wait(tickets.back(), Soon()).ok());
  EXPECT_EQ(b7, out[1]);
  EXPECT_EQ(b5a, out[0]);
  EXPECT_EQ(b5b, out[2]);
  // Zero bytes, and a barrier.
  auto z = w.Send(nullptr, 0, next, 9);
  auto zr = w.Recv(nullptr, 0, prev, 9);
  ASSERT_TRUE(z.ok() && zr.ok());
  auto bar = w.Barrier();
  ASSERT_TRUE(bar.ok());
  EXPECT_TRUE(w.Wait(*bar, Soon()).ok());
}

TEST(MpiEngineTest, SplitMakesUnevenRailsRankedByKey) {
  InterPodEngine& w = World();
  // Rails: color rank % 2 ({0, 2, ...} and {1, 3, ...}), ranked in reverse.
  auto rail = w.Split(w.rank() % 2, -w.rank(), Soon());
  ASSERT_TRUE(rail.ok()) << rail.status();
  InterPodEngine& r = **rail;
  const int members = (w.size() - w.rank() % 2 + 1) / 2;
  EXPECT_EQ(r.size(), members);
  EXPECT_EQ(r.rank(), members - 1 - w.rank() / 2);
  // A sum over the rail: the world ranks of its members.
  int64_t mine = w.rank(), sum = -1;
  auto t = r.AllReduce(&mine, &sum, 1, DataType::kInt64, RedOp::kSum);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(r.Wait(*t, Soon()).ok());
  int64_t want = 0;
  for (int k = w.rank() % 2; k < w.size(); k += 2) want += k;
  EXPECT_EQ(sum, want);
  // A rail of a rail.
  auto one = r.Split(r.rank(), 0, Soon());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->size(), 1);
  EXPECT_EQ(w.Split(-1, 0, Soon()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MpiEngineTest, LongCountsAreCutIntoCallsOfTheLimit) {
  MpiEngineOptions options;
  options.max_count_per_call = 7;
  auto small = MpiEngine::World(MPI_COMM_WORLD, options);
  ASSERT_TRUE(small.ok()) << small.status();
  InterPodEngine& w = **small;
  const size_t count = 100;
  std::vector<char> send = Input(DataType::kFloat16, w.rank(), count, 6), recv(2 * count, 0);
  auto t = w.AllReduce(send.data(), recv.data(), count, DataType::kFloat16, RedOp::kSum);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(w.Wait(*t, Soon()).ok());
  EXPECT_EQ(0, std::memcmp(recv.data(),
                           Reference(DataType::kFloat16, RedOp::kSum, w.size(), count, 6).data(),
                           2 * count));
  std::vector<char> buf =
      w.rank() == 1 ? Input(DataType::kInt32, 1, count, 7) : std::vector<char>(4 * count, 0);
  t = w.Broadcast(buf.data(), count, DataType::kInt32, 1);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(w.Wait(*t, Soon()).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), Input(DataType::kInt32, 1, count, 7).data(), 4 * count));
  std::vector<double> in(count, w.rank() + 1.0), out(count, 0);
  t = w.Reduce(in.data(), out.data(), count, DataType::kFloat64, RedOp::kMax, 0);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(w.Wait(*t, Soon()).ok());
  if (w.rank() == 0) {
    EXPECT_EQ(out, std::vector<double>(count, w.size()));
  }
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  std::string msg(count, static_cast<char>('A' + w.rank())), got(count, 0);
  auto r = w.Recv(got.data(), count, prev, 1);
  auto s = w.Send(msg.data(), count, next, 1);
  ASSERT_TRUE(r.ok() && s.ok());
  ASSERT_TRUE(w.Wait(*s, Soon()).ok());
  EXPECT_EQ(got, std::string(count, static_cast<char>('A' + prev)));
  // What cannot be cut is refused, naming the limit.
  auto rs = w.ReduceScatter(send.data(), recv.data(), 8, DataType::kFloat16, RedOp::kSum);
  EXPECT_EQ(rs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rs.status().message().find("above 7 elements"), std::string::npos) << rs.status();
  EXPECT_EQ(w.AllGather(send.data(), recv.data(), 8, DataType::kUint8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MpiEngineTest, BadArgumentsAreRefusedNamingWhatWasWrong) {
  InterPodEngine& w = World();
  float x = 1, y = 0;
  auto avg = w.AllReduce(&x, &y, 1, DataType::kFloat32, RedOp::kAvg);
  EXPECT_EQ(avg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(avg.status().message().find("avg"), std::string::npos) << avg.status();
  EXPECT_EQ(w.Broadcast(&x, 1, DataType::kFloat32, w.size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Reduce(&x, &y, 1, DataType::kFloat32, RedOp::kSum, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Send(&x, 4, w.size() + 3, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto tag = w.Recv(&x, 4, 0, -2);
  EXPECT_EQ(tag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tag.status().message().find("tag -2"), std::string::npos) << tag.status();
  EXPECT_EQ(w.AllReduce(&x, &y, 1, static_cast<DataType>(99), RedOp::kSum).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<size_t> two(2, 0);
  auto a2a = w.AllToAllV(&x, two, two, &y, two, two);
  EXPECT_EQ(a2a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a2a.status().message().find("one per member"), std::string::npos) << a2a.status();
  std::vector<size_t> big(w.size(), size_t{1} << 32), zero(w.size(), 0);
  EXPECT_EQ(w.AllToAllV(&x, big, zero, &y, zero, zero).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> v(4, 0);
  EXPECT_EQ(w.AllReduce(v.data(), v.data() + 1, 2, DataType::kFloat32, RedOp::kSum).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto wait = w.Wait(1u << 30, Soon());
  EXPECT_EQ(wait.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wait.message().find("no such ticket"), std::string::npos) << wait;
  // None of these broke the engine.
  auto bar = w.Barrier();
  ASSERT_TRUE(bar.ok()) << bar.status();
  EXPECT_TRUE(w.Wait(*bar, Soon()).ok());
}

// The progress thread moves a 16 MiB Send (TCP's rendezvous needs the
// receiver's answers) while the receiver makes no MPI call for 6 s: the
// sender's Wait completes long before (deadline 4 s). Without the thread
// the receiver answers only in its own Wait, 6 s later.
TEST(MpiEngineTest, TheProgressThreadMovesASendWhileTheReceiverComputes) {
  ASSERT_TRUE(MpiEngine::ThreadMultiple()) << "World asks for MPI_THREAD_MULTIPLE";
  auto e = MpiEngine::World(MPI_COMM_WORLD);
  ASSERT_TRUE(e.ok()) << e.status();
  InterPodEngine& w = **e;
  std::vector<char> buf(16 << 20, static_cast<char>(w.rank() + 1));
  if (w.rank() == 0) {
    auto s = w.Send(buf.data(), buf.size(), 1, 2);
    ASSERT_TRUE(s.ok());
    absl::Status st = w.Wait(*s, absl::Now() + absl::Seconds(4));
    EXPECT_TRUE(st.ok()) << st;
  } else if (w.rank() == 1) {
    auto r = w.Recv(buf.data(), buf.size(), 0, 2);
    ASSERT_TRUE(r.ok());
    absl::SleepFor(absl::Seconds(6));  // no MPI call: only the thread enters MPI
    ASSERT_TRUE(w.Wait(*r, Soon()).ok());
    EXPECT_EQ(buf, std::vector<char>(16 << 20, 1));
  }
  auto bar = World().Barrier();
  ASSERT_TRUE(bar.ok());
  EXPECT_TRUE(World().Wait(*bar, Soon()).ok());
}

TEST(MpiEngineTest, ARecvOfTheWrongSizeIsAnErrorNotAShortBuffer) {
  auto e = MpiEngine::World(MPI_COMM_WORLD);
  ASSERT_TRUE(e.ok()) << e.status();
  InterPodEngine& w = **e;
  char buf[16] = {};
  if (w.rank() == 0) {
    auto s = w.Send("12345678", 8, 1, 3);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(w.Wait(*s, Soon()).ok());
  } else if (w.rank() == 1) {
    auto r = w.Recv(buf, 16, 0, 3);
    ASSERT_TRUE(r.ok());
    absl::Status st = w.Wait(*r, Soon());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("sent 8 bytes where this Recv expected 16"), std::string::npos)
        << st;
    // The engine is unusable after it.
    EXPECT_EQ(w.Barrier().status().code(), absl::StatusCode::kInvalidArgument);
  }
  auto bar = World().Barrier();
  ASSERT_TRUE(bar.ok());
  EXPECT_TRUE(World().Wait(*bar, Soon()).ok());
}

TEST(MpiEngineTest, AbortFailsThePendingWaitAndEveryLaterCall) {
  auto e = MpiEngine::World(MPI_COMM_WORLD);
  ASSERT_TRUE(e.ok()) << e.status();
  InterPodEngine& w = **e;
  // A Recv nobody sends: Abort from another thread ends its Wait.
  char buf[8];
  auto r = w.Recv(buf, 8, (w.rank() + 1) % w.size(), 77);
  ASSERT_TRUE(r.ok());
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    w.Abort("the test aborts");
  });
  const absl::Time start = absl::Now();
  absl::Status st = w.Wait(*r, absl::Now() + absl::Seconds(30));
  aborter.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("the test aborts"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(w.Barrier().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w.Split(0, 0, Soon()).status().code(), absl::StatusCode::kAborted);
  w.Abort("twice is harmless");
  auto bar = World().Barrier();
  ASSERT_TRUE(bar.ok());
  EXPECT_TRUE(World().Wait(*bar, Soon()).ok());
}

}  // namespace
}  // namespace cxlrt::pods
