// Collectives across emulated hosts (forked processes): every collective x
// type x op x size x rank count, out of place and in place, checked bit for
// bit against a reference computed here element by element; pool-resident
// (zero-copy) buffers; more ranks than cores; asynchronous calls; many
// back-to-back calls on two communicators at once; uneven all-to-all; bad
// arguments. Both the hardware and the simulated coherence domain.

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/collectives/copy_engine.h"
#include "gtest/gtest.h"
#include "tests/collectives/communicator_test_util.h"
#include "tests/collectives/late_engine.h"
#include "tests/testing/test_util.h"

namespace cxlrt::collectives {
namespace {

using runtime::CoherenceDomain;

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

TEST_P(CollectivesTest, InlinePostsOfEveryLengthStayExact) {
  // An inline post of up to 8 bytes is one line, a longer one two
  // (comm_layout.h, PostLayout): every length from 1 to 64 bytes, in one
  // piece (all-reduce) and in 3 (all-to-all, 3 ranks), in both domains.
  RunRanks(3, [](Communicator& comm, allocator::Allocator&) -> std::string {
    const int r = comm.rank();
    auto value = [](int rank, size_t i, size_t len) {
      return static_cast<uint8_t>(rank * 31 + i * 7 + len);
    };
    for (size_t len = 1; len <= 64; ++len) {
      std::vector<uint8_t> send(len), recv(len, 0);
      for (size_t i = 0; i < len; ++i) send[i] = value(r, i, len);
      absl::Status s = comm.AllReduce(send.data(), recv.data(), len, DataType::kUint8, RedOp::kSum);
      if (!s.ok()) return s.ToString();
      for (size_t i = 0; i < len; ++i) {
        const uint8_t want = value(0, i, len) + value(1, i, len) + value(2, i, len);
        if (recv[i] != want) {
          return absl::StrCat("all-reduce of ", len, " bytes: byte ", i, " is ", int{recv[i]},
                              ", expected ", int{want});
        }
      }
    }
    for (size_t piece = 1; piece <= 21; ++piece) {  // 3 pieces: up to 63 inline bytes
      std::vector<uint8_t> send(3 * piece), recv(3 * piece, 0);
      for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, i, piece);
      absl::Status s = comm.AllToAll(send.data(), recv.data(), piece, DataType::kUint8);
      if (!s.ok()) return s.ToString();
      for (int j = 0; j < 3; ++j) {
        for (size_t i = 0; i < piece; ++i) {
          const uint8_t want = value(j, r * piece + i, piece);
          if (recv[j * piece + i] != want) {
            return absl::StrCat("all-to-all of ", piece, "-byte pieces: byte ", i, " from rank ", j,
                                " is ", int{recv[j * piece + i]}, ", expected ", int{want});
          }
        }
      }
    }
    return "";
  });
}

// The CPU engine copies up to 32 KiB into the pool with plain stores and
// a write-back, larger copies with non-temporal stores: every collective
// with chunks and pieces just under, at and over that bound, odd lengths
// (a tail that is no whole line) and element sizes 1 and 8, out of place
// and in place, private and pool-resident, in both domains (the simulated
// one shows a byte not written back before its post as a stale read).
TEST_P(CollectivesTest, CopiesAroundTheCachedCopyBoundStayExact) {
  rank_lease_ = absl::Seconds(10);
  for (int n : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    std::vector<Case> cases;
    for (CollKind k : AllKinds()) {
      if (k == CollKind::kBarrier) continue;
      for (DataType t : {DataType::kInt8, DataType::kFloat64}) {
        const size_t es = SizeOf(t);
        for (size_t bytes : {size_t{32 << 10} - 8, size_t{32 << 10}, size_t{32 << 10} + 8,
                             size_t{32 << 10} + 1000}) {
          for (int variant = 0; variant < 3; ++variant) {
            // Pool-resident broadcasts and scatters included: a non-root's
            // input is written through the cache and never posted, so only
            // Free's write-back keeps its dirty lines off the block's next
            // user on another host (the simulated domain aborts without it).
            Case c{k,           t, RedOp::kSum, bytes / es + (es == 1 ? 3 : 0), -1, variant == 1,
                   variant == 2};
            c.root = Rooted(k) ? static_cast<int>(c.count % n) : -1;
            cases.push_back(c);
          }
        }
      }
    }
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

// AllToAllV: rank i sends count(i, j) elements to rank j (zeros among
// them), from pieces with gaps in reversed order, into pieces with other
// gaps; every element and every gap is checked. With `pool` the send
// buffer comes from comm.Allocate and is written through the coherence
// layer (the simulated domain keeps those stores in this host's cache until
// the post in place writes them back), so it is posted in place.
size_t V2Count(int i, int j, size_t scale) { return (i * 5 + j * 3 + 1) % 4 * scale; }

std::string RunAllToAllV(Communicator& comm, DataType t,
                         const std::function<size_t(int, int)>& count,
                         runtime::Pool* pool = nullptr) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = SizeOf(t), gap = 3;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t stotal = gap, rtotal = 0;
  for (int j = n - 1; j >= 0; --j) {  // send pieces in reversed order
    sc[j] = count(r, j);
    sd[j] = stotal;
    stotal += sc[j] + gap;
  }
  for (int j = 0; j < n; ++j) {
    rc[j] = count(j, r);
    rd[j] = rtotal + gap;
    rtotal += rc[j] + gap;
  }
  rtotal += gap;
  std::vector<uint8_t> input(stotal * es), recv(rtotal * es, 0xa5), want(rtotal * es, 0xa5);
  // Element k of the piece from rank i to rank j: Value(t, i * n + j, k).
  for (int j = 0; j < n; ++j) {
    for (size_t k = 0; k < sc[j]; ++k) Store(t, input.data(), sd[j] + k, Value(t, r * n + j, k));
    for (size_t k = 0; k < rc[j]; ++k) Store(t, want.data(), rd[j] + k, Value(t, j * n + r, k));
  }
  const uint8_t* send = input.data();
  void* block = nullptr;
  if (pool) {
    auto p = comm.Allocate(input.size());
    if (!p.ok()) return "Allocate: " + p.status().ToString();
    block = *p;
    const auto at =
        static_cast<runtime::PoolOffset>(static_cast<uint8_t*>(block) - pool->backend().base());
    // Lines cached from an earlier use of the block would be written back
    // over the new bytes by the post in place: drop them first.
    pool->coherence().Invalidate(at, input.size());
    pool->coherence().Write(at, input.data(), input.size());
    send = static_cast<const uint8_t*>(block);
  }
  absl::Status s = comm.AllToAllV(send, sc, sd, recv.data(), rc, rd, t);
  if (block) {
    if (absl::Status f = comm.Free(block); s.ok() && !f.ok()) s = f;
  }
  if (!s.ok()) return s.ToString();
  if (recv != want) {
    size_t b = 0;
    while (recv[b] == want[b]) ++b;
    return absl::StrCat("AllToAllV ", DataTypeName(t), pool ? " pool-resident" : "", ": byte ", b,
                        " (element ", b / es, ") of rank ", r, "'s receive buffer differs");
  }
  return "";
}

std::string RunAllToAllV(Communicator& comm, DataType t, size_t scale) {
  return RunAllToAllV(comm, t, [scale](int i, int j) { return V2Count(i, j, scale); });
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

// Random splits with zeros and a hot rank (most of every rank's pieces go
// to it, as tokens to a hot expert), pool-resident send buffers on every
// rank, on rank 0 only (mixed), and on none; small slots, so the ranks
// that copy through them take many posts while those in place post once.
// 2 ranks with the CPU engine, 4 with the late engine.
TEST_P(CollectivesTest, AllToAllVPostsPoolResidentSendBuffersInPlace) {
  enum Mode { kPrivate, kEveryRank, kRankZero };
  for (int n : {2, 4}) {
    for (Mode mode : {kPrivate, kEveryRank, kRankZero}) {
      SCOPED_TRACE(absl::StrCat(n, " ranks, mode ", mode));
      if (n == 4) {
        engine_factory_ = [](runtime::Coherence& c, int r) -> std::unique_ptr<CopyEngine> {
          return std::make_unique<LateEngine>(c, 7 + r);
        };
      }
      CommOptions o;
      o.slot_bytes = 4096;
      RunRanks(
          n,
          [&](Communicator& comm, allocator::Allocator& alloc) -> std::string {
            const bool in_pool = mode == kEveryRank || (mode == kRankZero && comm.rank() == 0);
            for (uint32_t seed = 1; seed <= 6; ++seed) {
              // Every rank draws the same matrix: counts 0..2999, a third
              // of them zero, rank seed % n hot (8x); seed 6 sends nothing.
              std::vector<size_t> m(n * n);
              uint64_t x = seed * 0x9e3779b97f4a7c15ull;
              for (size_t k = 0; k < m.size(); ++k) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const size_t v = x % 3 == 0 ? 0 : (x >> 8) % 3000;
                m[k] = seed == 6 ? 0 : int(k % n) == int(seed % n) ? 8 * v : v;
              }
              size_t largest = 0;  // elements of the largest piece between two ranks
              for (int k = 0; k < n * n; ++k) {
                if (k / n != k % n) largest = std::max(largest, m[k]);
              }
              for (DataType t : {DataType::kInt8, DataType::kBfloat16, DataType::kFloat64}) {
                const uint64_t before = comm.posts();
                std::string e = RunAllToAllV(
                    comm, t, [&](int i, int j) { return m[i * n + j]; },
                    in_pool ? &alloc.pool() : nullptr);
                if (!e.empty()) return absl::StrCat("seed ", seed, ": ", e);
                // In place on every rank: the counts, then one post of every piece.
                const uint64_t posts = comm.posts() - before;
                if (mode == kEveryRank && largest > 0 && posts != 2) {
                  return absl::StrCat("seed ", seed, ": ", posts,
                                      " posts for a call in place on every rank (want 2)");
                }
                if (mode == kPrivate && largest * SizeOf(t) > 2 * 4096 && posts < 3) {
                  return absl::StrCat("seed ", seed, ": ", posts,
                                      " posts through 4 KiB slots: the call did not chunk");
                }
              }
            }
            return "";
          },
          absl::Seconds(120), o, "v-pool");
      if (HasFailure()) return;
    }
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

// Displacements a rank cannot honour are refused on that rank before the
// call begins (every rank here passes the same bad arguments, so none
// waits for a peer): receive pieces that overlap (two peers would write the
// same bytes, in whatever order the copies run), a piece whose end wraps
// size_t or the address space (it would read or write far outside the
// buffer). A well-formed call then still runs.
TEST_P(CollectivesTest, AllToAllVPiecesThatOverlapOrWrapAreRefused) {
  RunRanks(
      2,
      [](Communicator& comm, allocator::Allocator&) -> std::string {
        std::vector<float> a(16, 1.0f), b(16, 0.0f);
        const std::vector<size_t> four = {4, 4}, apart = {0, 8};
        struct Case {
          const char* what;
          std::vector<size_t> sd, rd;
        };
        const size_t wrap = SIZE_MAX - 1;
        const Case cases[] = {
            {"receive pieces overlapping", apart, {0, 2}},
            {"receive pieces at the same displacement", apart, {4, 4}},
            {"a send piece whose end wraps", {0, wrap}, apart},
            {"a receive piece whose end wraps", apart, {0, wrap}},
            {"a send piece whose end in bytes wraps", {0, SIZE_MAX / 4 - 2}, apart},
            {"a receive piece whose end in bytes wraps", apart, {0, SIZE_MAX / 4 - 2}},
        };
        for (const Case& k : cases) {
          absl::Status s =
              comm.AllToAllV(a.data(), four, k.sd, b.data(), four, k.rd, DataType::kFloat32);
          if (s.code() != absl::StatusCode::kInvalidArgument) {
            return absl::StrCat(k.what, ": ", s.ToString());
          }
        }
        absl::Status s =
            comm.AllToAllV(a.data(), four, apart, b.data(), four, apart, DataType::kFloat32);
        if (!s.ok()) return "the communicator broke: " + s.ToString();
        for (size_t k : {0, 1, 2, 3, 8, 9, 10, 11}) {
          if (b[k] != 1.0f) return absl::StrCat("element ", k, " is ", b[k]);
        }
        return "";
      },
      absl::Seconds(60), {}, "v-wrap");
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

}  // namespace
}  // namespace cxlrt::collectives
