// Issue 27's stalled host, measured: rounds of a victim host stopped with
// SIGSTOP (from outside at a random time, or by itself at a named fault
// point: the allocator tick, a KV put's commit, a collective post, the
// heartbeat) and continued after 0.5-3 leases, while a survivor shares a
// communicator and a KV store with it. A stop shorter than the lease must
// pass with no fence; a longer one lets the survivor fence and recover the
// victim, which must then see kAborted and attach again. Every round ends
// with 0 audit problems (allocator and KV), 0 lost commits (each put the
// victim saw succeed is readable, byte-exact, by the survivor: no quota, so
// nothing is evicted) and 0 wrong bytes (all-reduce results, KV gets).
// Rounds: 8 per domain times CXLRT_TEST_SCALE (CXLRT_STOP_ROUNDS overrides).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/membership.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::kv {
namespace {

using ::cxlrt::testing::OpenUri;
using ::cxlrt::testing::PoolUri;
using ::cxlrt::testing::Spawn;
using ::cxlrt::testing::TempDir;
using ::cxlrt::testing::TestScale;
using runtime::CoherenceDomain;
using runtime::Pool;

constexpr absl::Duration kLease = absl::Milliseconds(250);
constexpr int kMaxPuts = 300;   // per round: the index (1024 entries per host) stays sparse
constexpr size_t kCount = 512;  // int32 elements of each all-reduce

int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

bool WaitFlag(const std::atomic<int>& flag, absl::Duration timeout);

// One round's shared state (an anonymous shared mapping). Each field has one
// writer: v_ the victim, s_ the survivor, d_ the driver.
struct RoundState {
  std::atomic<int> s_ready, v_ready, d_finish, s_may_close, v_done;
  std::atomic<uint32_t> v_slot;
  std::atomic<uint64_t> v_epoch;
  std::atomic<int> v_puts;     // puts recorded in put_ns
  int64_t put_ns[kMaxPuts];    // when put i returned OK (0: it did not)
  std::atomic<int> v_aborted;  // a call of the victim returned kAborted (fenced)
  std::atomic<int> v_reattached;
  std::atomic<int> v_refenced;   // the re-attached host was fenced as well         // a fresh host
                                 // put and read a key
  std::atomic<int> v_late_acks;  // calls that returned OK after the observed fence
  std::atomic<int64_t> s_fence_seen_ns;  // the survivor first saw the victim fenced or freed
  std::atomic<int> s_recovered;
  std::atomic<int> s_comm_failed;
  std::atomic<int> s_seen_liveness,
      s_end_liveness;  // the victim's slot when the fence was seen, at the end
  std::atomic<uint64_t> s_seen_epoch,
      s_end_epoch;           // the survivor's all-reduce failed (its peer dead)          //
                             // the survivor saw the victim's slot recovered
  std::atomic<int> missing;  // recorded puts not found at the end
  std::atomic<int> wrong_bytes, lost_commits, audit_problems, errors;
  std::atomic<int> allreduces;
  std::atomic<uint64_t> evictions;  // the checker's count (no quota: should be 0)
  char error_text[1024];
};

void Note(RoundState* st, const std::string& what) {
  if (st->errors.fetch_add(1) == 0) {
    snprintf(st->error_text, sizeof(st->error_text), "%s", what.c_str());
  }
  fprintf(stderr, "lease stop stress: %s\n", what.c_str());
}

std::string KeyOf(int i) { return absl::StrCat("v-", i); }

// A value that only this key's put writes: length and bytes from the key.
std::vector<uint8_t> ValueOf(const std::string& key) {
  std::mt19937_64 rng(std::hash<std::string>()(key));
  std::vector<uint8_t> v(256 + rng() % 3840);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

int32_t Contribution(int rank, uint64_t iter, size_t i) {
  return static_cast<int32_t>(iter * 7 + i * 3 + static_cast<uint64_t>(rank) * 1000003);
}

struct Host : ::cxlrt::testing::TestHost {
  std::unique_ptr<Store> store;
  std::unique_ptr<collectives::Communicator> comm;
};

absl::StatusOr<Host> AttachHost(const std::string& uri, bool comm, int rank) {
  ::cxlrt::testing::TestHostOptions o;
  o.lease = kLease;
  o.tick = absl::Milliseconds(2);
  Host h;
  CXLRT_ASSIGN_OR_RETURN(static_cast<::cxlrt::testing::TestHost&>(h),
                         ::cxlrt::testing::AttachTestHost(uri, o));
  StoreOptions so;
  so.create = true;
  so.hosts = 8;
  so.entries_per_host = 1024;
  so.pins_per_host = 64;
  so.max_namespaces = 2;
  CXLRT_ASSIGN_OR_RETURN(h.store, Store::Open(*h.alloc, so));
  if (comm) {
    collectives::CommOptions co;
    co.timeout = absl::Seconds(10);
    CXLRT_ASSIGN_OR_RETURN(h.comm,
                           collectives::Communicator::Create(*h.alloc, "stress", 2, rank, co));
  }
  return h;
}

bool Fenced(const absl::Status& s) { return s.code() == absl::StatusCode::kAborted; }

// One all-reduce; false when the communicator is done (an error: a fenced
// or dead peer, or this host fenced). Counts wrong bytes. The last element
// carries the victim's "this is my last one" (`last`), returned in `*end`,
// so that both ranks leave after the same call.
bool AllReduceOnce(Host& h, int rank, uint64_t iter, bool last, bool* end, RoundState* st,
                   absl::Status* err) {
  std::vector<int32_t> send(kCount), recv(kCount);
  for (size_t i = 0; i + 1 < kCount; ++i) send[i] = Contribution(rank, iter, i);
  send[kCount - 1] = rank == 1 && last ? 1 : 0;
  *err = h.comm->AllReduce(send.data(), recv.data(), kCount, collectives::DataType::kInt32,
                           collectives::RedOp::kSum);
  if (!err->ok()) return false;
  int wrong = 0;
  for (size_t i = 0; i + 1 < kCount; ++i) {
    if (recv[i] != static_cast<int32_t>(static_cast<uint32_t>(Contribution(0, iter, i)) +
                                        static_cast<uint32_t>(Contribution(1, iter, i)))) {
      ++wrong;
    }
  }
  if (recv[kCount - 1] != 0 && recv[kCount - 1] != 1) ++wrong;
  *end = recv[kCount - 1] == 1;
  if (wrong > 0) {
    st->wrong_bytes += wrong * 4;
    Note(st, absl::StrCat("rank ", rank, " all-reduce ", iter, ": ", wrong, " wrong elements"));
  }
  st->allreduces += 1;
  return true;
}

// The victim: allocations, KV puts and all-reduces until the driver says
// finish. On kAborted (fenced) it drops the host without writing, attaches
// again, puts and reads one key, and exits.
int Victim(const std::string& uri, RoundState* st, const std::string& fault, uint64_t seed) {
  if (!fault.empty() && !runtime::ArmFaults(fault).ok()) return 20;
  auto h = AttachHost(uri, true, 1);
  if (!h.ok()) {
    Note(st, absl::StrCat("victim attach: ", h.status().ToString()));
    return 21;
  }
  st->v_slot = h->membership->slot();
  st->v_epoch = h->membership->epoch();
  st->v_ready = 1;
  std::mt19937_64 rng(seed);
  std::vector<PoolOffset> live;
  bool comm_up = true;
  uint64_t iter = 0;
  absl::Status fenced_by;
  auto late = [&] {
    int64_t f = st->s_fence_seen_ns.load();
    return f != 0 && NowNs() > f;
  };
  bool comm_ended = false;  // the last all-reduce ran: both ranks leave
  while (fenced_by.ok() && (st->d_finish.load() == 0 || (comm_up && !comm_ended))) {
    const bool finishing = st->d_finish.load() != 0;
    // Allocator: keep a few blocks of the victim's own arena live.
    auto off = h->alloc->Allocate(64 + rng() % 8192);
    if (!off.ok()) {
      if (Fenced(off.status())) {
        fenced_by = off.status();
        break;
      }
      Note(st, absl::StrCat("victim allocate: ", off.status().ToString()));
    } else {
      if (late()) st->v_late_acks += 1;
      live.push_back(*off);
      if (live.size() > 16) {
        absl::Status f = h->alloc->Free(live.front());
        live.erase(live.begin());
        if (Fenced(f)) {
          fenced_by = f;
          break;
        }
      }
    }
    // KV: put the next key; record it once the put returned OK.
    const int i = st->v_puts.load();
    if (i < kMaxPuts && !finishing) {
      const std::string key = KeyOf(i);
      const std::vector<uint8_t> v = ValueOf(key);
      absl::Status p = h->store->Put("s", key, v.data(), v.size());
      if (p.ok()) {
        if (late()) st->v_late_acks += 1;
        st->put_ns[i] = NowNs();
      } else if (Fenced(p)) {
        fenced_by = p;
        break;
      } else {
        Note(st, absl::StrCat("victim put ", key, ": ", p.ToString()));
      }
      st->v_puts = i + 1;
    }
    // Collective: one all-reduce with the survivor while both are in it.
    if (comm_up) {
      absl::Status e;
      bool end = false;
      if (AllReduceOnce(*h, 1, iter++, finishing, &end, st, &e)) {
        comm_ended = end;
        if (end) comm_up = false;
      } else {
        comm_up = false;
        if (!h->membership->CheckSelf().ok()) {
          fenced_by = e;
          break;
        }
        // The survivor left: it saw this host dead. Fine only if fenced.
      }
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (!fenced_by.ok()) {
    st->v_aborted = 1;
    // Nothing of this incarnation may write again: drop it (its allocator
    // and store refuse to write once fenced), then come back as a new host.
    h->comm.reset();
    h->store.reset();
    (void)h->alloc->Close();
    h->alloc.reset();
    h->membership.reset();
    h->pool.reset();
    auto again = AttachHost(uri, false, 1);
    if (!again.ok()) {
      Note(st, absl::StrCat("victim re-attach: ", again.status().ToString()));
      st->v_done = 1;
      return 22;
    }
    const std::string key = absl::StrCat("again-", seed);
    const std::vector<uint8_t> v = ValueOf(key);
    absl::Status p = again->store->Put("s", key, v.data(), v.size());
    std::vector<uint8_t> back(v.size());
    auto n = again->store->Get("s", key, back.data(), back.size());
    if (!p.ok() || !n.ok() || *n != v.size() || back != v) {
      Note(st, absl::StrCat("victim after re-attach: put ", p.ToString(), ", get ",
                            n.ok() ? "wrong bytes" : n.status().ToString()));
    } else {
      st->v_reattached = 1;
    }
    again->store.reset();
    absl::Status c = again->alloc->Close();
    // A fresh host starved past its lease (an overloaded machine) is fenced
    // too and closes without writing: counted, not an error.
    if (Fenced(c)) {
      st->v_refenced = 1;
    } else if (!c.ok()) {
      Note(st, absl::StrCat("victim re-attached close: ", c.ToString()));
    }
    st->v_done = 1;
    return 0;
  }
  // Not fenced: leave the communicator and close cleanly.
  for (PoolOffset o : live) (void)h->alloc->Free(o);
  if (comm_ended) {
    absl::Status d = h->comm->Destroy();
    if (!d.ok()) Note(st, absl::StrCat("victim leaves the communicator: ", d.ToString()));
  }
  h->comm.reset();
  h->store.reset();
  st->v_done = 1;
  absl::Status c = h->alloc->Close();
  if (!c.ok() && !Fenced(c)) Note(st, absl::StrCat("victim close: ", c.ToString()));
  if (Fenced(c)) st->v_aborted = 1;
  return 0;
}

// Checks the victim's recorded puts: each is readable with its bytes.
void CheckPuts(Host& h, RoundState* st, bool final) {
  const int n = st->v_puts.load();
  std::vector<uint8_t> buf(8192);
  for (int i = 0; i < n; ++i) {
    if (st->put_ns[i] == 0) continue;
    const std::string key = KeyOf(i);
    const std::vector<uint8_t> v = ValueOf(key);
    auto got = h.store->Get("s", key, buf.data(), buf.size());
    if (!got.ok()) {
      if (got.status().code() == absl::StatusCode::kNotFound && final) {
        // Lost unless an eviction (the checker counts them) removed it.
        st->missing += 1;
        fprintf(stderr, "lease stop stress: %s (put returned OK) is not in the store\n",
                key.c_str());
      } else if (got.status().code() != absl::StatusCode::kNotFound) {
        Note(st, absl::StrCat("survivor get ", key, ": ", got.status().ToString()));
      }
      continue;
    }
    if (*got != v.size() || std::memcmp(buf.data(), v.data(), v.size()) != 0) {
      st->wrong_bytes += 1;
      Note(st, absl::StrCat("wrong bytes: ", key, " read ", *got, " bytes"));
    }
  }
}

// The survivor: makes the store, all-reduces with the victim, reads its
// puts, watches its slot (fenced, then recovered by this host's tick).
int Survivor(const std::string& uri, RoundState* st) {
  auto h = AttachHost(uri, false, 0);
  if (!h.ok()) {
    Note(st, absl::StrCat("survivor attach: ", h.status().ToString()));
    return 31;
  }
  st->s_ready = 1;
  collectives::CommOptions co;
  co.timeout = absl::Seconds(10);
  auto comm = collectives::Communicator::Create(*h->alloc, "stress", 2, 0, co);
  if (!comm.ok()) {
    Note(st, absl::StrCat("survivor communicator: ", comm.status().ToString()));
    return 32;
  }
  h->comm = std::move(*comm);
  bool comm_up = true;
  uint64_t iter = 0;
  // The victim stores its slot and epoch after its Create returns, which
  // can be after this host's: wait for them (v_ready is stored last).
  if (!WaitFlag(st->v_ready, absl::Seconds(20))) {
    Note(st, "survivor: the victim never said its slot");
    return 33;
  }
  const uint32_t vslot = st->v_slot.load();
  const uint64_t vepoch = st->v_epoch.load();
  auto watch = [&] {
    auto v = h->membership->Host(vslot);
    if (!v.ok()) return;
    if (st->s_fence_seen_ns.load() == 0 &&
        (v->liveness == runtime::Liveness::kFenced ||
         (v->record.epoch != vepoch && st->d_finish.load() == 0))) {
      st->s_fence_seen_ns = NowNs();
      st->s_seen_liveness = static_cast<int>(v->liveness);
      st->s_seen_epoch = v->record.epoch;
    }
    st->s_end_liveness = static_cast<int>(v->liveness);
    st->s_end_epoch = v->record.epoch;
    if (st->s_fence_seen_ns.load() != 0 && v->liveness != runtime::Liveness::kFenced &&
        v->liveness != runtime::Liveness::kDead) {
      st->s_recovered = 1;  // released (free) or taken again at a later epoch
    }
  };
  int reads = 0;
  while (st->s_may_close.load() == 0) {
    watch();
    if (comm_up) {
      absl::Status e;
      bool end = false;
      if (AllReduceOnce(*h, 0, iter++, false, &end, st, &e)) {
        if (end) {
          comm_up = false;
          absl::Status d = h->comm->Destroy();
          if (!d.ok()) Note(st, absl::StrCat("survivor leaves the communicator: ", d.ToString()));
        }
      } else {
        comm_up = false;
        watch();
        // Only a victim seen dead (the peer watch's kAborted) may end the
        // collectives; the driver checks that this never follows a short stop.
        if (e.code() != absl::StatusCode::kAborted) {
          Note(st, absl::StrCat("survivor all-reduce ", iter - 1, ": ", e.ToString()));
        }
        st->s_comm_failed = 1;
      }
    } else {
      absl::SleepFor(absl::Milliseconds(2));
    }
    if (++reads % 8 == 0) CheckPuts(*h, st, false);
  }
  watch();
  CheckPuts(*h, st, true);
  if (comm_up) Note(st, "the survivor's communicator never ended");
  h->comm.reset();
  h->store.reset();
  absl::Status c = h->alloc->Close();
  if (!c.ok()) Note(st, absl::StrCat("survivor close: ", c.ToString()));
  return 0;
}

// Allocator and KV audits of the pool, by a host that only reads.
int Checker(const std::string& uri, RoundState* st) {
  auto pool = Pool::Open(uri);
  if (!pool.ok()) {
    Note(st, absl::StrCat("checker open: ", pool.status().ToString()));
    return 41;
  }
  std::vector<std::string> problems;
  absl::Status a = allocator::Audit(**pool, &problems);
  absl::Status k = Audit(**pool, &problems);
  if (!a.ok() || !k.ok()) {
    st->audit_problems += std::max<int>(1, static_cast<int>(problems.size()));
    Note(st, absl::StrCat("audit: ", a.ToString(), " / ", k.ToString(),
                          problems.empty() ? "" : absl::StrCat(" first: ", problems[0])));
  }
  auto stats = ReadStats(**pool);
  if (stats.ok()) {
    for (const NamespaceStats& n : stats->namespaces) st->evictions += n.evictions;
  }
  return 0;
}

// Waits for `pid` to exit or (with `stopped`) stop. Returns the waitpid
// status, or -1 after `timeout` (the child is then killed).
int WaitChild(pid_t pid, absl::Duration timeout, bool stopped = false) {
  const absl::Time end = absl::Now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG | (stopped ? WUNTRACED : 0));
    if (r == pid) return status;
    if (absl::Now() > end) {
      if (stopped) return -1;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

bool WaitFlag(const std::atomic<int>& flag, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (flag.load() == 0) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

struct Totals {
  int rounds = 0, stops = 0, short_stops = 0, long_stops = 0, mid_stops = 0, point_stops = 0;
  int fences = 0, recoveries = 0, victim_aborts = 0, reattached = 0, short_fenced = 0,
      long_unfenced = 0, points_missed = 0, hung = 0, evicted = 0, refenced = 0;
  int audit_problems = 0, lost_commits = 0, wrong_bytes = 0, late_acks = 0, errors = 0;
  long puts = 0, allreduces = 0;
};

class LeaseStopStressTest : public ::testing::TestWithParam<CoherenceDomain> {};

TEST_P(LeaseStopStressTest, StoppedHostsAreFencedOrSurviveAndNothingIsLostOrWrong) {
  const std::string domain(runtime::CoherenceDomainName(GetParam()));
  int rounds = 8 * TestScale();
  if (const char* r = std::getenv("CXLRT_STOP_ROUNDS")) rounds = std::max(1, std::atoi(r));
  uint64_t seed = 27;
  if (const char* s = std::getenv("CXLRT_STOP_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::mt19937_64 rng(seed * 2 + (GetParam() == CoherenceDomain::kSimulated));
  const double lease_ms = absl::ToDoubleMilliseconds(kLease);
  // A stop shorter than the lease less two beats (the victim's beat then
  // stands still for less than the lease, against the lease + margin that
  // death needs) must not be fenced. One past lease + margin + a few beats
  // and the survivor's recovery period should be. Between: either.
  const double beat_ms = std::min(40.0, lease_ms / 4);
  const double short_below = lease_ms - 2 * beat_ms, long_above = lease_ms * 1.25 + 150;
  auto* st = static_cast<RoundState*>(
      mmap(nullptr, sizeof(RoundState), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(st, MAP_FAILED);
  Totals t;
  const char* kPoints[] = {"alloc.tick.begin", "kv.put.copied", "coll.post.begin",
                           "membership.heartbeat"};
  for (int round = 0; round < rounds; ++round) {
    std::memset(static_cast<void*>(st), 0, sizeof(RoundState));
    TempDir dir;
    const std::string create = PoolUri(dir, absl::StrCat("coherence=", domain), "128M");
    ASSERT_TRUE(Pool::Create(create).ok());
    const std::string uri = OpenUri(create);
    // Half the rounds stop the victim at a named point (its count-th hit),
    // half from outside at a random time.
    std::string fault;
    const int how = static_cast<int>(rng() % 8);
    if (how < 4) {
      const uint64_t count = how == 0   ? 50 + rng() % 200
                             : how == 3 ? 3 + rng() % 10
                                        : 5 + rng() % 60;
      fault = absl::StrCat(kPoints[how], ":stop:", count);
    }
    // A third of the stops are short (0.5-0.68 leases), the rest 0.68-3.
    const double frac = static_cast<double>(rng() % 1000) / 1000.0;
    const double stop_ms = lease_ms * (rng() % 3 == 0 ? 0.5 + 0.18 * frac : 0.68 + 2.32 * frac);
    const uint64_t vseed = seed * 1000 + round;
    const pid_t s = Spawn([&] { return Survivor(uri, st); });
    // The survivor made the store before the victim opens it.
    if (!WaitFlag(st->s_ready, absl::Seconds(20))) {
      ADD_FAILURE() << "round " << round << ": the survivor did not attach";
      kill(s, SIGKILL);
      waitpid(s, nullptr, 0);
      ++t.hung;
      continue;
    }
    const pid_t v = Spawn([&] { return Victim(uri, st, fault, vseed); });
    bool stopped = false;
    if (WaitFlag(st->v_ready, absl::Seconds(20))) {
      if (!fault.empty()) {
        const int status = WaitChild(v, absl::Seconds(3), /*stopped=*/true);
        stopped = status != -1 && WIFSTOPPED(status);
        if (!stopped) {
          ++t.points_missed;
          fault.clear();
        } else {
          ++t.point_stops;
        }
      }
      if (!stopped) {
        absl::SleepFor(absl::Milliseconds(20 + rng() % 300));
        stopped = kill(v, SIGSTOP) == 0;
      }
    }
    int64_t stop_ns = 0;
    if (stopped) {
      const int64_t t0 = NowNs();
      absl::SleepFor(absl::Milliseconds(stop_ms));
      kill(v, SIGCONT);
      stop_ns = NowNs() - t0;
      ++t.stops;
    }
    // Let the victim run on (and find its fence), then finish.
    absl::SleepFor(kLease * 2);
    st->d_finish = 1;
    const int vs = WaitChild(v, absl::Seconds(30));
    if (vs == -1) {
      ++t.hung;
      ADD_FAILURE() << "round " << round << ": the victim hung (killed)";
    } else if (!WIFEXITED(vs) || WEXITSTATUS(vs) != 0) {
      Note(st, absl::StrCat("victim ended with status ", vs));
    }
    st->s_may_close = 1;
    const int ss = WaitChild(s, absl::Seconds(30));
    if (ss == -1) {
      ++t.hung;
      ADD_FAILURE() << "round " << round << ": the survivor hung (killed)";
    } else if (!WIFEXITED(ss) || WEXITSTATUS(ss) != 0) {
      Note(st, absl::StrCat("survivor ended with status ", ss));
    }
    const pid_t c = Spawn([&] { return Checker(uri, st); });
    if (WaitChild(c, absl::Seconds(30)) == -1) ++t.hung;
    const int evicted = static_cast<int>(st->evictions.load());
    st->lost_commits = std::max(0, st->missing.load() - evicted);
    t.evicted += std::min(st->missing.load(), evicted);

    const double ms = static_cast<double>(stop_ns) / 1e6;
    const bool fenced = st->s_fence_seen_ns.load() != 0;
    if (stopped) {
      if (ms < short_below) {
        ++t.short_stops;
        // Liveness, not safety: a victim whose heartbeat thread was already
        // starved before the stop (an overloaded machine) may be called dead
        // after a short stop. Counted; most must survive (below).
        if (fenced || st->s_comm_failed) ++t.short_fenced;
      } else if (ms > long_above) {
        ++t.long_stops;
        if (!fenced) ++t.long_unfenced;
      } else {
        ++t.mid_stops;
      }
    }
    ++t.rounds;
    t.fences += fenced;
    t.recoveries += st->s_recovered.load();
    t.victim_aborts += st->v_aborted.load();
    t.reattached += st->v_reattached.load();
    t.refenced += st->v_refenced.load();
    t.audit_problems += st->audit_problems.load();
    t.lost_commits += st->lost_commits.load();
    t.wrong_bytes += st->wrong_bytes.load();
    t.late_acks += st->v_late_acks.load();
    t.errors += st->errors.load();
    t.allreduces += st->allreduces.load();
    for (int i = 0; i < st->v_puts.load(); ++i) t.puts += st->put_ns[i] != 0;
    printf(
        "%s round %d: %s stop %.0f ms (lease %.0f): %s%s%s%s; puts %d, late acks %d, "
        "evictions %lu, audit %d, lost %d, wrong %d, errors %d%s%s\n",
        domain.c_str(), round, fault.empty() ? "external" : fault.c_str(), ms, lease_ms,
        fenced ? "fenced" : "not fenced", st->s_recovered ? ", recovered" : "",
        st->v_aborted ? ", victim aborted" : "", st->v_reattached ? ", re-attached" : "",
        st->v_puts.load(), st->v_late_acks.load(), static_cast<unsigned long>(st->evictions.load()),
        st->audit_problems.load(), st->lost_commits.load(), st->wrong_bytes.load(),
        st->errors.load(), st->errors ? ": " : "", st->errors ? st->error_text : "");
    if (fenced) {
      printf("  victim slot %u epoch %lu: seen as %s at epoch %lu, at the end %s at epoch %lu\n",
             st->v_slot.load(), static_cast<unsigned long>(st->v_epoch.load()),
             runtime::LivenessName(static_cast<runtime::Liveness>(st->s_seen_liveness.load())),
             static_cast<unsigned long>(st->s_seen_epoch.load()),
             runtime::LivenessName(static_cast<runtime::Liveness>(st->s_end_liveness.load())),
             static_cast<unsigned long>(st->s_end_epoch.load()));
    }
    fflush(stdout);
  }
  munmap(st, sizeof(RoundState));
  printf(
      "TOTALS %s: rounds %d, stops %d (short %d, long %d, between %d; at a point %d, points not "
      "reached %d), fences %d, recoveries %d, victim aborts %d, re-attached %d (fenced again %d), "
      "short stops "
      "fenced %d, long stops not fenced %d, audit problems %d, lost commits %d, wrong bytes %d, "
      "acks after the fence %d, other errors %d, hung %d; %ld puts (%d missing keys accounted "
      "for by evictions), %ld all-reduces\n",
      domain.c_str(), t.rounds, t.stops, t.short_stops, t.long_stops, t.mid_stops, t.point_stops,
      t.points_missed, t.fences, t.recoveries, t.victim_aborts, t.reattached, t.refenced,
      t.short_fenced, t.long_unfenced, t.audit_problems, t.lost_commits, t.wrong_bytes, t.late_acks,
      t.errors, t.hung, t.puts, t.evicted, t.allreduces);
  EXPECT_EQ(t.audit_problems, 0);
  EXPECT_EQ(t.lost_commits, 0);
  EXPECT_EQ(t.wrong_bytes, 0);
  EXPECT_EQ(t.late_acks, 0) << "calls of the victim returned OK after the survivor saw it fenced";
  EXPECT_LE(t.short_fenced * 2, t.short_stops)
      << "most hosts stopped for less than their lease were called dead: death comes too early";
  EXPECT_EQ(t.errors, 0);
  EXPECT_EQ(t.hung, 0);
  // Both outcomes happen (seeded: a fixed draw of stop lengths).
  if (rounds >= 6) {
    EXPECT_GT(t.short_stops, 0);
    EXPECT_GT(t.fences, 0);
    EXPECT_EQ(t.fences, t.victim_aborts) << "every fenced victim learns it";
  }
}

INSTANTIATE_TEST_SUITE_P(Domains, LeaseStopStressTest,
                         ::testing::Values(CoherenceDomain::kSimulated, CoherenceDomain::kHardware),
                         [](const auto& info) {
                           return std::string(runtime::CoherenceDomainName(info.param));
                         });

}  // namespace
}  // namespace cxlrt::kv
