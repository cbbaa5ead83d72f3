// The hierarchical communicator across pods (cxlrt/pods/): every collective
// on 2 pods x 2 ranks, on uneven pods (2 + 3) and on pods whose ranks are
// not contiguous, exact against the single-pool reference of
// communicator_test_util; all-to-all-v with random splits; Send/Recv across
// pods; one pod going straight to the pool communicator; a rank killed in
// either pod. Ranks are forked processes; each maps its pod's pool and the
// interconnect pool, over which the pool engine runs. Both coherence
// domains.
#include "cxlrt/pods/pod_communicator.h"

#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/pods/layout.h"
#include "cxlrt/pods/pool_engine.h"
#include "gtest/gtest.h"
#include "tests/collectives/communicator_test_util.h"
#include "tests/pods/pod_case.h"
#include "tests/testing/test_util.h"

namespace cxlrt::pods {
namespace {

using collectives::Case;
using collectives::CollKind;
using collectives::CommOptions;
using collectives::RankHost;
using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::WaitExit;
using runtime::CoherenceDomain;

// Forwards to a real engine and counts the operations started through it.
class CountingEngine final : public InterPodEngine {
 public:
  CountingEngine(std::unique_ptr<InterPodEngine> e, int* ops) : e_(std::move(e)), ops_(ops) {}
  int rank() const override { return e_->rank(); }
  int size() const override { return e_->size(); }
  const char* name() const override { return e_->name(); }
  absl::StatusOr<std::unique_ptr<InterPodEngine>> Split(int color, int key,
                                                        absl::Time deadline) override {
    ++*ops_;
    return e_->Split(color, key, deadline);
  }
  absl::StatusOr<Ticket> AllReduce(const void* s, void* r, size_t n, DataType t,
                                   RedOp op) override {
    ++*ops_;
    return e_->AllReduce(s, r, n, t, op);
  }
  absl::StatusOr<Ticket> ReduceScatter(const void* s, void* r, size_t n, DataType t,
                                       RedOp op) override {
    ++*ops_;
    return e_->ReduceScatter(s, r, n, t, op);
  }
  absl::StatusOr<Ticket> AllGather(const void* s, void* r, size_t n, DataType t) override {
    ++*ops_;
    return e_->AllGather(s, r, n, t);
  }
  absl::StatusOr<Ticket> Broadcast(void* b, size_t n, DataType t, int root) override {
    ++*ops_;
    return e_->Broadcast(b, n, t, root);
  }
  absl::StatusOr<Ticket> Reduce(const void* s, void* r, size_t n, DataType t, RedOp op,
                                int root) override {
    ++*ops_;
    return e_->Reduce(s, r, n, t, op, root);
  }
  absl::StatusOr<Ticket> AllToAllV(const void* s, absl::Span<const size_t> sc,
                                   absl::Span<const size_t> sd, void* r,
                                   absl::Span<const size_t> rc,
                                   absl::Span<const size_t> rd) override {
    ++*ops_;
    return e_->AllToAllV(s, sc, sd, r, rc, rd);
  }
  absl::StatusOr<Ticket> Barrier() override {
    ++*ops_;
    return e_->Barrier();
  }
  absl::StatusOr<Ticket> Send(const void* b, size_t n, int peer, int tag) override {
    ++*ops_;
    return e_->Send(b, n, peer, tag);
  }
  absl::StatusOr<Ticket> Recv(void* b, size_t n, int peer, int tag) override {
    ++*ops_;
    return e_->Recv(b, n, peer, tag);
  }
  absl::Status Wait(Ticket t, absl::Time deadline) override {
    ++*ops_;
    return e_->Wait(t, deadline);
  }
  void Abort(absl::string_view why) override {
    ++*ops_;
    e_->Abort(why);
  }

 private:
  std::unique_ptr<InterPodEngine> e_;
  int* ops_;
};

class PodsTest : public ::testing::TestWithParam<CoherenceDomain> {
 protected:
  void SetUp() override {
    errors_ = static_cast<char*>(
        mmap(nullptr, kErrBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(errors_, MAP_FAILED);
  }
  void TearDown() override { munmap(errors_, kErrBytes); }

  // A pool in the parameter's coherence domain; returns its open URI.
  std::string MakePool() {
    const std::string create =
        PoolUri(dir_, absl::StrCat("coherence=", runtime::CoherenceDomainName(GetParam())), "96M");
    auto p = runtime::Pool::Create(create);
    EXPECT_TRUE(p.ok()) << p.status();
    return OpenUri(create);
  }

  struct Rank {
    MultiPodCommunicator* comm;
    int world_rank;
    int* engine_ops;  // operations through the world engine since Create
  };
  using Body = std::function<std::string(Rank&)>;

  // Runs `body` in one process per world rank; world rank w maps pod
  // pods[w]'s pool and the interconnect pool. Rank w must exit with
  // expect_rc(w) (0 by default). With `leave_at_exit` false a rank exits
  // without destroying its communicator (after a failure).
  void RunPods(const std::vector<int>& pods, const Body& body, const CommOptions& options,
               const PodOptions& pod_options = {}, const std::function<int(int)>& expect_rc = {},
               bool leave_at_exit = true, absl::Duration lease = absl::Milliseconds(1000)) {
    const int npools = *std::max_element(pods.begin(), pods.end()) + 1;
    std::vector<std::string> pod_uris;
    for (int p = 0; p < npools; ++p) pod_uris.push_back(MakePool());
    const std::string ic_uri = MakePool();
    if (HasFailure()) return;
    std::memset(errors_, 0, kErrBytes);
    const int n = static_cast<int>(pods.size());
    std::vector<pid_t> pids;
    for (int w = 0; w < n; ++w) {
      pids.push_back(Spawn([&, w]() -> int {
        PodOptions po = pod_options;
        if (chunk_bytes_of_) po.chunk_bytes = chunk_bytes_of_(w);
        std::string err =
            RunRank(pod_uris[pods[w]], ic_uri, n, w, body, options, po, leave_at_exit, lease);
        if (err.empty()) return 0;
        std::snprintf(errors_ + w * kErrPerRank, kErrPerRank - 1, "world rank %d: %s", w,
                      err.c_str());
        return 1;
      }));
    }
    for (int w = 0; w < n; ++w) {
      const int rc = WaitExit(pids[w], absl::Seconds(120));
      EXPECT_EQ(rc, expect_rc ? expect_rc(w) : 0)
          << "world rank " << w << " exit " << rc << ": " << errors_ + w * kErrPerRank;
    }
  }

  static std::string RunRank(const std::string& pod_uri, const std::string& ic_uri, int n, int w,
                             const Body& body, const CommOptions& options,
                             const PodOptions& pod_options, bool leave_at_exit,
                             absl::Duration lease) {
    auto pod = collectives::OpenRankHost(pod_uri, lease);
    if (!pod.ok()) return "pod pool: " + pod.status().ToString();
    auto ic = collectives::OpenRankHost(ic_uri, lease);
    if (!ic.ok()) return "interconnect pool: " + ic.status().ToString();
    auto world = MakePoolEngine(*ic->alloc, "world", n, w, options);
    if (!world.ok()) return "world engine: " + world.status().ToString();
    int ops = 0;
    auto counted = std::make_unique<CountingEngine>(*std::move(world), &ops);
    auto comm =
        MultiPodCommunicator::Create(*pod->alloc, "t", std::move(counted), options, pod_options);
    if (!comm.ok()) return "Create: " + comm.status().ToString();
    ops = 0;
    Rank rank{comm->get(), w, &ops};
    std::string err = body(rank);
    if (!leave_at_exit) {
      // Exits without the leaving barriers; the heartbeats run on until
      // the process ends, so nothing they touch is freed.
      for (RankHost* h : {&*pod, &*ic}) {
        (void)h->alloc.release();
        (void)h->membership.release();
        (void)h->pool.release();
      }
      (void)comm->release();
      return err;
    }
    if (err.empty()) {
      absl::Status d = (*comm)->Destroy();
      if (!d.ok()) err = "Destroy: " + d.ToString();
      float x = 0;
      d = (*comm)->AllReduce(&x, &x, 1, DataType::kFloat32, RedOp::kSum);
      if (err.empty() && d.code() != absl::StatusCode::kFailedPrecondition) {
        err = "a call after Destroy: " + d.ToString();
      }
    }
    return err;
  }

  static CommOptions Options() {
    CommOptions o;
    o.timeout = absl::Seconds(30);
    o.slot_bytes = 64 << 10;
    return o;
  }

  // When set, world rank w's PodOptions::chunk_bytes (RunPods).
  std::function<uint64_t(int)> chunk_bytes_of_;

  static constexpr size_t kErrPerRank = 1024;
  static constexpr size_t kErrBytes = 16 * kErrPerRank;
  ::cxlrt::testing::TempDir dir_;
  char* errors_ = nullptr;
};

TEST(PodLayoutTest, PodsAreOrderedByLowestWorldRankAndRanksArePodMajor) {
  std::vector<PoolIdLayout> ids(5);
  auto set = [&](int w, uint64_t id, const char* name) {
    ids[w].creation_id = id;
    std::snprintf(ids[w].name, sizeof ids[w].name, "%s", name);
  };
  // World ranks 0 and 3 map pool B; 1, 2 and 4 map pool A; a pool of A's
  // name with another creation id is another pod.
  set(0, 7, "B");
  set(1, 9, "A");
  set(2, 9, "A");
  set(3, 7, "B");
  set(4, 9, "A");
  auto l = LayoutFromIds(ids, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->npods, 2);
  EXPECT_EQ(l->pod_sizes, (std::vector<int>{2, 3}));
  EXPECT_EQ(l->world_of, (std::vector<int>{0, 3, 1, 2, 4}));
  EXPECT_EQ(l->rank, 4);
  EXPECT_EQ(l->pod, 1);
  EXPECT_EQ(l->local_rank, 2);
  EXPECT_EQ(l->min_pod_size, 2);
  set(2, 10, "A");
  l = LayoutFromIds(ids, 2);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->npods, 3);
  EXPECT_EQ(l->pod_sizes, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(l->rank, 4);
  EXPECT_FALSE(LayoutFromIds(ids, 5).ok());
  EXPECT_FALSE(LayoutFromIds({}, 0).ok());
}

TEST_P(PodsTest, EveryCollectiveIsExactOnTwoPodsOfTwo) {
  PodOptions po;
  po.chunk_bytes = 4096;  // 20011 elements span many chunks
  const bool full = GetParam() == CoherenceDomain::kHardware;
  RunPods(
      {0, 0, 1, 1},
      [full](Rank& r) -> std::string {
        if (r.comm->npods() != 2 || r.comm->pod_size() != 2 || r.comm->rank() != r.world_rank) {
          return absl::StrCat("layout: pods ", r.comm->npods(), " pod size ", r.comm->pod_size(),
                              " rank ", r.comm->rank());
        }
        for (const Case& c : PodMatrix(r.comm->size(), full)) {
          std::string e = RunPodCase(*r.comm, c);
          if (!e.empty()) return e;
        }
        return "";
      },
      Options(), po);
}

TEST_P(PodsTest, EveryCollectiveIsExactOnUnevenPodsOfTwoAndThree) {
  PodOptions po;
  po.chunk_bytes = 4096;
  const bool full = GetParam() == CoherenceDomain::kHardware;
  RunPods(
      {0, 0, 1, 1, 1},
      [full](Rank& r) -> std::string {
        for (const Case& c : PodMatrix(r.comm->size(), full)) {
          std::string e = RunPodCase(*r.comm, c);
          if (!e.empty()) return e;
        }
        return "";
      },
      Options(), po);
}

TEST_P(PodsTest, RanksThatDisagreeOnChunkBytesAreRefusedAtCreate) {
  // Different chunks would cut a call into engine operations that do not
  // match: every rank's Create refuses, naming the two values.
  chunk_bytes_of_ = [](int w) -> uint64_t { return w == 2 ? 8192 : 4096; };
  RunPods(
      {0, 0, 1, 1}, [](Rank&) -> std::string { return "Create succeeded"; }, Options(), {},
      [](int) { return 1; });
  for (int w = 0; w < 4; ++w) {
    const std::string err = errors_ + w * kErrPerRank;
    EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
    EXPECT_NE(err.find("chunk_bytes differs between ranks: 4096 at world rank 0, 8192 at world "
                       "rank 2"),
              std::string::npos)
        << err;
  }
}

TEST_P(PodsTest, PodsOfScatteredWorldRanksArePodMajor) {
  // Pod 0 = world ranks {0, 3}, pod 1 = {1, 2, 4}: the communicator's rank
  // is pod-major, and the results are those of that rank order.
  PodOptions po;
  po.chunk_bytes = 4096;
  RunPods(
      {0, 1, 1, 0, 1},
      [](Rank& r) -> std::string {
        const int want[] = {0, 2, 3, 1, 4};
        if (r.comm->rank() != want[r.world_rank]) {
          return absl::StrCat("rank ", r.comm->rank(), ", want ", want[r.world_rank]);
        }
        for (const Case& c : PodMatrix(r.comm->size(), false)) {
          if (c.count == 20011) continue;
          std::string e = RunPodCase(*r.comm, c);
          if (!e.empty()) return e;
        }
        return "";
      },
      Options(), po);
}

TEST_P(PodsTest, ThreePodsWithAPodOfOneRankAreExact) {
  // Pods {0, 4}, {1, 3}, {2}: one rail (m = 1), scattered ranks.
  PodOptions po;
  po.chunk_bytes = 4096;
  RunPods(
      {0, 1, 2, 1, 0},
      [](Rank& r) -> std::string {
        if (r.comm->npods() != 3) return absl::StrCat(r.comm->npods(), " pods");
        for (const Case& c : PodMatrix(r.comm->size(), false)) {
          std::string e = RunPodCase(*r.comm, c);
          if (!e.empty()) return e;
        }
        return RunAllToAllV(*r.comm, 99, DataType::kInt64);
      },
      Options(), po);
}

TEST_P(PodsTest, CallsThatDisagreeAcrossPodsAreAnErrorOnEveryRank) {
  // Pod 0 all-reduces 1000 floats, pod 1 2000: each pod agrees with itself,
  // so the rails see the mismatch; every rank must get an error, never OK
  // with wrong bytes and never a hang.
  RunPods(
      {0, 0, 1, 1},
      [](Rank& r) -> std::string {
        const size_t count = r.comm->pod() == 0 ? 1000 : 2000;
        std::vector<float> a(count, 1.0f), b(count);
        absl::Status s =
            r.comm->AllReduce(a.data(), b.data(), count, DataType::kFloat32, RedOp::kSum);
        if (s.ok()) return "a mismatched all-reduce gave OK";
        if (s.code() != absl::StatusCode::kInvalidArgument &&
            s.code() != absl::StatusCode::kAborted) {
          return "mismatched all-reduce: " + s.ToString();
        }
        return "";
      },
      Options(), {}, {}, /*leave_at_exit=*/false);
}

TEST_P(PodsTest, AllToAllVWithRandomSplitsIncludingZerosMatchesTheReference) {
  for (const std::vector<int>& pods : {std::vector<int>{0, 0, 1, 1}, {0, 1, 1, 0, 1}}) {
    RunPods(
        pods,
        [](Rank& r) -> std::string {
          for (uint32_t seed = 1; seed <= 6; ++seed) {
            std::string e =
                RunAllToAllV(*r.comm, seed, seed % 2 ? DataType::kFloat32 : DataType::kUint8);
            if (!e.empty()) return e;
          }
          // Counts that disagree are an error on every rank, never bytes.
          if (r.comm->rank() == 0) {
            std::vector<size_t> c(r.comm->size(), 1), d(r.comm->size());
            for (size_t j = 0; j < d.size(); ++j) d[j] = j;
            std::vector<float> a(d.size() + 1), b(d.size() + 1);
            c[r.comm->size() - 1] = 2;  // rank n-1 expects 1
            d.back() = d.size() - 1;
            absl::Status s = r.comm->AllToAllV(
                a.data(), c, d, b.data(), std::vector<size_t>(d.size(), 1), d, DataType::kFloat32);
            if (s.ok()) return "mismatched counts gave OK";
          } else {
            std::vector<size_t> c(r.comm->size(), 1), d(r.comm->size());
            for (size_t j = 0; j < d.size(); ++j) d[j] = j;
            std::vector<float> a(d.size()), b(d.size() + 1);
            absl::Status s = r.comm->AllToAllV(a.data(), c, d, b.data(), c, d, DataType::kFloat32);
            if (s.ok()) return "mismatched counts gave OK";
          }
          return "";
        },
        Options(), {}, {}, /*leave_at_exit=*/false);
    if (HasFailure()) return;
  }
}

TEST_P(PodsTest, SendAndRecvReachEveryRankAcrossPodsInOrder) {
  RunPods(
      {0, 0, 1, 1, 1},
      [](Rank& r) -> std::string {
        MultiPodCommunicator& c = *r.comm;
        const int n = c.size(), me = c.rank();
        const int to = (me + 1) % n, from = (me + n - 1) % n;
        // Two messages per pair, a small one and one larger than the
        // engine's channel, in order; even ranks send first.
        for (size_t count : {size_t{1001}, size_t{100003}}) {
          std::vector<float> out(count), in(count);
          for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(me * 1000 + i % 997);
          auto send = [&] { return c.Send(out.data(), count, DataType::kFloat32, to); };
          auto recv = [&] { return c.Recv(in.data(), count, DataType::kFloat32, from); };
          absl::Status s = me % 2 == 0 ? send() : recv();
          if (s.ok()) s = me % 2 == 0 ? recv() : send();
          if (!s.ok()) return absl::StrCat("rank ", me, ": ", s.ToString());
          for (size_t i = 0; i < count; ++i) {
            if (in[i] != static_cast<float>(from * 1000 + i % 997)) {
              return absl::StrCat("rank ", me, " got a wrong element ", i, " from ", from);
            }
          }
        }
        // Rank 0 (pod 0) and rank 4 (pod 1) exchange three messages one way.
        if (me == 0 || me == n - 1) {
          for (int k = 0; k < 3; ++k) {
            int64_t v = me == 0 ? 100 + k : -1;
            absl::Status s = me == 0 ? c.Send(&v, 1, DataType::kInt64, n - 1)
                                     : c.Recv(&v, 1, DataType::kInt64, 0);
            if (!s.ok()) return s.ToString();
            if (v != 100 + k) return absl::StrCat("message ", k, " arrived as ", v);
          }
        }
        // A bad peer is an error naming it (and, as every error, ends the
        // communicator on every rank: last).
        if (!c.Barrier().ok()) return "Barrier failed";
        absl::Status bad = c.Send(nullptr, 0, DataType::kFloat32, me);
        if (bad.code() != absl::StatusCode::kInvalidArgument ||
            std::string(bad.message()).find(absl::StrCat("peer ", me)) == std::string::npos) {
          return "Send to itself: " + bad.ToString();
        }
        return "";
      },
      Options(), {}, {}, /*leave_at_exit=*/false);
}

TEST_P(PodsTest, OnePodGoesStraightToThePoolCommunicatorWithoutTheEngine) {
  RunPods(
      {0, 0, 0},
      [](Rank& r) -> std::string {
        if (r.comm->npods() != 1) return "not one pod";
        for (const Case& c : PodMatrix(r.comm->size(), false)) {
          std::string e = RunPodCase(*r.comm, c);
          if (!e.empty()) return e;
        }
        if (!r.comm->Barrier().ok()) return "Barrier failed";
        int64_t v = 5;
        if (r.comm->rank() == 0 && !r.comm->Send(&v, 1, DataType::kInt64, 2).ok()) return "Send";
        if (r.comm->rank() == 2 && !r.comm->Recv(&v, 1, DataType::kInt64, 0).ok()) return "Recv";
        if (*r.engine_ops != 0) {
          return absl::StrCat(*r.engine_ops, " engine calls after Create with one pod");
        }
        return "";
      },
      Options());
}

// A rank SIGKILLed inside a loop of collectives: every other rank, in its
// pod and in the other, gets kAborted or the engine's error within the
// deadline, never a hang and never OK for the call that lost it.
TEST_P(PodsTest, ARankKilledInEitherPodFailsEveryOtherRankWithinTheDeadline) {
  struct Kill {
    std::vector<int> pods;
    int victim;  // world rank
  };
  for (const Kill& k : {Kill{{0, 0, 1, 1}, 1}, Kill{{0, 0, 1, 1, 1}, 3}}) {
    CommOptions o = Options();
    o.timeout = absl::Seconds(5);
    PodOptions po;
    po.chunk_bytes = 4096;
    const int victim = k.victim;
    RunPods(
        k.pods,
        [victim](Rank& r) -> std::string {
          std::vector<float> a(20000, 1.0f), b(20000);
          absl::Status s;
          absl::Time died = absl::InfiniteFuture();
          for (int i = 0; i < 2000 && s.ok(); ++i) {
            if (i == 5) died = absl::Now();
            if (r.world_rank == victim && i == 5) raise(SIGKILL);
            switch (i % 3) {
              case 0:
                s = r.comm->AllReduce(a.data(), b.data(), a.size(), DataType::kFloat32,
                                      RedOp::kSum);
                break;
              case 1:
                s = r.comm->AllGather(a.data(), b.data(), a.size() / 5, DataType::kFloat32);
                break;
              default:
                s = r.comm->Broadcast(a.data(), a.data(), a.size(), DataType::kFloat32, 0);
                break;
            }
          }
          if (s.ok()) return "every call succeeded with a rank dead";
          if (s.code() != absl::StatusCode::kAborted &&
              s.code() != absl::StatusCode::kDeadlineExceeded) {
            return "not aborted: " + s.ToString();
          }
          const absl::Duration took = absl::Now() - died;
          if (took > absl::Seconds(20)) return "noticed after " + absl::FormatDuration(took);
          if (r.comm->Barrier().code() != absl::StatusCode::kFailedPrecondition) {
            return "usable after the error";
          }
          return "";
        },
        o, po, [victim](int w) { return w == victim ? 128 + SIGKILL : 0; },
        /*leave_at_exit=*/false, absl::Milliseconds(500));
    if (HasFailure()) return;
  }
}

// The pool engine alone: Split orders a color's members by key, then rank;
// a Recv that meets another tag or size is an error, never bytes; a Wait
// for an operation a member never starts ends at its deadline.
TEST_P(PodsTest, PoolEngineSplitsByKeyAndRefusesAMismatchedRecv) {
  const std::string ic = MakePool();
  if (HasFailure()) return;
  std::memset(errors_, 0, kErrBytes);
  std::vector<pid_t> pids;
  for (int w = 0; w < 4; ++w) {
    pids.push_back(Spawn([&, w]() -> int {
      auto run = [&]() -> std::string {
        auto h = collectives::OpenRankHost(ic);
        if (!h.ok()) return h.status().ToString();
        auto e = MakePoolEngine(*h->alloc, "e", 4, w, Options());
        if (!e.ok()) return e.status().ToString();
        InterPodEngine& eng = **e;
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        // Colors {0, 1, 0, 1}, keys descending: ranks 2, 0 and 3, 1.
        auto sub = eng.Split(w % 2, 10 - w, deadline);
        if (!sub.ok()) return "Split: " + sub.status().ToString();
        const int want_rank = w < 2 ? 1 : 0;
        if ((*sub)->rank() != want_rank || (*sub)->size() != 2) {
          return absl::StrCat("split rank ", (*sub)->rank(), " of ", (*sub)->size());
        }
        int32_t v = w, sum = 0;
        auto t = (*sub)->AllReduce(&v, &sum, 1, DataType::kInt32, RedOp::kSum);
        if (!t.ok()) return t.status().ToString();
        absl::Status s = (*sub)->Wait(*t, deadline);
        if (!s.ok() || sum != (w % 2 == 0 ? 2 : 4))
          return absl::StrCat("sum ", sum, " ", s.ToString());
        if (eng.AllReduce(&v, &sum, 1, DataType::kInt32, RedOp::kAvg).ok()) return "kAvg accepted";
        // Rank 0 sends tag 1; rank 1 expects tag 2.
        if (w == 0) {
          auto st = eng.Send(&v, sizeof v, 1, 1);
          if (!st.ok()) return st.status().ToString();
          (void)eng.Wait(*st, deadline);
        } else if (w == 1) {
          auto rt = eng.Recv(&v, sizeof v, 0, 2);
          if (!rt.ok()) return rt.status().ToString();
          s = eng.Wait(*rt, deadline);
          if (s.code() != absl::StatusCode::kInvalidArgument ||
              std::string(s.message()).find("tag 1") == std::string::npos) {
            return "mismatched Recv: " + s.ToString();
          }
          if (v != 1) return "the mismatched Recv wrote its buffer";
        } else if (w == 2) {
          // Rank 3 never joins this barrier: the Wait ends at its deadline.
          auto bt = (*sub)->Barrier();
          if (!bt.ok()) return bt.status().ToString();
          const absl::Time t0 = absl::Now();
          s = (*sub)->Wait(*bt, t0 + absl::Milliseconds(300));
          if (s.code() != absl::StatusCode::kDeadlineExceeded) return "Wait: " + s.ToString();
          if (absl::Now() - t0 > absl::Seconds(2)) return "Wait overran its deadline";
          if ((*sub)->Barrier().ok()) return "usable after a deadline";
        }
        // Leave without the barriers of a clean exit (rank 2's split is
        // blocked on rank 3 until its timeout).
        (void)e->release();
        (void)sub->release();
        (void)h->alloc.release();
        (void)h->membership.release();
        (void)h->pool.release();
        return "";
      };
      const std::string err = run();
      if (err.empty()) return 0;
      std::snprintf(errors_ + w * kErrPerRank, kErrPerRank - 1, "rank %d: %s", w, err.c_str());
      return 1;
    }));
  }
  for (int w = 0; w < 4; ++w) {
    const int rc = WaitExit(pids[w], absl::Seconds(60));
    EXPECT_EQ(rc, 0) << "rank " << w << ": " << errors_ + w * kErrPerRank;
  }
}

INSTANTIATE_TEST_SUITE_P(Domains, PodsTest,
                         ::testing::Values(CoherenceDomain::kHardware,
                                           CoherenceDomain::kSimulated));

}  // namespace
}  // namespace cxlrt::pods
