// What `cxlrt top` shows (tools/top_view.h): rates from the deltas between
// each host's publications, sums over hosts and ranks, host states, and
// frames that say "unknown" rather than fail on a pool without metrics, a
// corrupt metrics area or a pool that cannot be read. The live view in a
// real terminal is tests/tools/top_tmux_test.py.
#include "tools/top_view.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "cxlrt/metrics/pool_metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/host_util.h"
#include "tests/testing/test_util.h"

namespace cxlrt::tools {
namespace {

using metrics::HostMetrics;
using metrics::PoolMetrics;
using runtime::Sample;

constexpr int64_t kT0 = int64_t{1'800'000'000} * 1'000'000'000;

Sample Counter(const std::string& name, runtime::Labels l, uint64_t v) {
  return runtime::CounterSample({name.c_str(), "", ""}, std::move(l), v);
}
Sample Gauge(const std::string& name, runtime::Labels l, double v) {
  return runtime::GaugeSample({name.c_str(), "", ""}, std::move(l), v);
}

HostMetrics MakeHost(uint32_t slot, uint32_t pid, int64_t published_ns,
                     std::vector<Sample> samples) {
  HostMetrics h;
  h.slot = slot;
  h.state = runtime::SlotState::kAttached;
  h.hostname = "node" + std::to_string(slot);
  h.pid = pid;
  h.alive = true;
  h.heartbeat_age = absl::Milliseconds(20);
  h.lease_margin = absl::Seconds(2);
  h.published = true;
  h.published_unix_ns = published_ns;
  h.published_age = absl::Milliseconds(100);
  h.samples = std::move(samples);
  return h;
}

std::vector<Sample> Kv(uint64_t hits, uint64_t misses, uint64_t evictions, double entries) {
  runtime::Labels l = {{"namespace", "llama"}};
  return {Counter("kv.hits", l, hits),
          Counter("kv.misses", l, misses),
          Counter("kv.puts", l, 0),
          Counter("kv.evictions", l, evictions),
          Gauge("kv.entries", l, entries),
          Gauge("kv.stored_bytes", l, entries * 4096),
          Gauge("kv.quota_bytes", l, 1 << 20),
          Gauge("kv.quota_use", l, 0.25)};
}

std::string Text(const TopFrame& f) {
  std::vector<std::string> lines;
  for (const TopLine& l : RenderTop(f, {"emu://t", absl::UnixEpoch(), absl::Seconds(1), false})) {
    lines.push_back(l.text);
  }
  return absl::StrJoin(lines, "\n");
}

PoolMetrics PoolOf(std::vector<HostMetrics> hosts) {
  PoolMetrics m;
  m.metrics_block = true;
  m.hosts = std::move(hosts);
  return m;
}

TEST(TopModelTest, RatesAreDeltasBetweenEachHostsOwnPublications) {
  TopModel model;
  TopFrame f = model.Update(
      PoolOf({MakeHost(0, 10, kT0, Kv(100, 10, 0, 8)), MakeHost(1, 11, kT0, Kv(50, 0, 2, 4))}));
  ASSERT_EQ(f.namespaces.size(), 1u);
  const TopNamespaceRow* r = &f.namespaces[0];
  EXPECT_EQ(r->name, "llama");
  EXPECT_EQ(r->entries, 12);
  EXPECT_EQ(r->bytes, 12 * 4096);
  EXPECT_DOUBLE_EQ(*r->hit_rate, 150.0 / 160);
  EXPECT_FALSE(r->hits_per_s.has_value()) << "one publication gives no rate";
  EXPECT_NE(Text(f).find("93.8"), std::string::npos) << Text(f);

  // Host 0 published again 2 s later; host 1 half a second later.
  f = model.Update(PoolOf({MakeHost(0, 10, kT0 + 2'000'000'000, Kv(300, 30, 0, 8)),
                           MakeHost(1, 11, kT0 + 500'000'000, Kv(100, 0, 7, 4))}));
  r = &f.namespaces[0];
  EXPECT_DOUBLE_EQ(*r->hits_per_s, 200.0 / 2 + 50 / 0.5);
  EXPECT_DOUBLE_EQ(*r->misses_per_s, 10);
  EXPECT_DOUBLE_EQ(*r->evictions_per_s, 10);
  EXPECT_DOUBLE_EQ(*r->puts_per_s, 0);

  // A read that finds no new publication keeps the rates (not zero).
  f = model.Update(PoolOf({MakeHost(0, 10, kT0 + 2'000'000'000, Kv(300, 30, 0, 8)),
                           MakeHost(1, 11, kT0 + 500'000'000, Kv(100, 0, 7, 4))}));
  EXPECT_DOUBLE_EQ(*f.namespaces[0].hits_per_s, 200.0);

  // A counter that went down was reset: it counted from zero since.
  f = model.Update(PoolOf({MakeHost(0, 10, kT0 + 3'000'000'000, Kv(40, 30, 0, 8)),
                           MakeHost(1, 11, kT0 + 1'000'000'000, Kv(100, 0, 7, 4))}));
  EXPECT_DOUBLE_EQ(*f.namespaces[0].hits_per_s, 40.0);

  // Another process in slot 0: its counters start a new history.
  f = model.Update(PoolOf({MakeHost(0, 99, kT0 + 4'000'000'000, Kv(5, 0, 0, 8)),
                           MakeHost(1, 11, kT0 + 1'500'000'000, Kv(110, 0, 7, 4))}));
  EXPECT_DOUBLE_EQ(*f.namespaces[0].hits_per_s, 20.0) << "only host 1 has a rate";
}

TEST(TopModelTest, AHostWhoseMetricsAreStaleCountsAsIdle) {
  TopModel model;
  model.Update(PoolOf({MakeHost(0, 10, kT0, Kv(0, 0, 0, 1))}));
  TopFrame f = model.Update(PoolOf({MakeHost(0, 10, kT0 + 1'000'000'000, Kv(100, 0, 0, 1))}));
  EXPECT_DOUBLE_EQ(*f.namespaces[0].hits_per_s, 100);
  HostMetrics old = MakeHost(0, 10, kT0 + 1'000'000'000, Kv(100, 0, 0, 1));
  old.published_age = kStaleRates + absl::Seconds(1);
  f = model.Update(PoolOf({old}));
  EXPECT_DOUBLE_EQ(*f.namespaces[0].hits_per_s, 0);
}

std::vector<Sample> Coll(const std::string& rank, uint64_t calls, uint64_t bus, uint64_t ns) {
  runtime::Labels l = {{"communicator", "train"},
                       {"rank", rank},
                       {"collective", "allreduce"},
                       {"size_bucket", "4MiB"}};
  return {Counter("collective.calls", l, calls), Counter("collective.bytes", l, calls << 20),
          Counter("collective.time", l, ns), Counter("collective.bus_bytes", l, bus)};
}

TEST(TopModelTest, CommunicatorsSumTheirRanks) {
  TopModel model;
  TopFrame f = model.Update(PoolOf({MakeHost(0, 10, kT0, Coll("0", 10, 1000, 100)),
                                    MakeHost(1, 11, kT0, Coll("1", 9, 3000, 100))}));
  ASSERT_EQ(f.collectives.size(), 1u);
  const TopCollectiveRow* r = &f.collectives[0];
  EXPECT_EQ(r->communicator, "train");
  EXPECT_EQ(r->ranks, 2);
  EXPECT_EQ(r->calls, 10u) << "the calls of the rank furthest ahead";
  EXPECT_DOUBLE_EQ(*r->busbw_avg, 4000.0 / 200);
  EXPECT_FALSE(r->calls_per_s.has_value());
  EXPECT_FALSE(r->busbw_now.has_value());
  const int64_t s = 1'000'000'000;
  f = model.Update(PoolOf({MakeHost(0, 10, kT0 + s, Coll("0", 30, 2000, 200)),
                           MakeHost(1, 11, kT0 + s, Coll("1", 19, 3000, 300))}));
  r = &f.collectives[0];
  EXPECT_DOUBLE_EQ(*r->calls_per_s, (20.0 + 10.0) / 2) << "per rank";
  EXPECT_DOUBLE_EQ(*r->busbw_now, 1000.0 / 300) << "bus bytes over time, both summed over ranks";
  const std::string text = Text(f);
  EXPECT_NE(text.find("train"), std::string::npos) << text;
  EXPECT_NE(text.find("15.0"), std::string::npos) << text;
}

TEST(TopModelTest, HostStatesAndProblemsAreShown) {
  TopModel model;
  HostMetrics alive = MakeHost(0, 10, kT0, {Gauge("kv.pins_held", {}, 3)});
  HostMetrics dead = MakeHost(1, 11, kT0, {});
  dead.alive = false;
  dead.lease_margin = -absl::Milliseconds(1500);
  HostMetrics fenced = MakeHost(2, 12, 0, {});
  fenced.state = runtime::SlotState::kFenced;
  fenced.alive = false;
  fenced.published = false;
  fenced.problem = "not attached with a current owner line";
  HostMetrics corrupt = MakeHost(3, 13, 0, {});
  corrupt.published = false;
  corrupt.problem = "its area's checksum is wrong";
  TopFrame f = model.Update(PoolOf({alive, dead, fenced, corrupt}));
  ASSERT_EQ(f.hosts.size(), 4u);
  EXPECT_EQ(f.hosts[0].state, "alive");
  EXPECT_EQ(f.hosts[0].pins, 3);
  EXPECT_EQ(f.hosts[1].state, "dead");
  EXPECT_EQ(f.hosts[2].state, "fenced");
  EXPECT_EQ(f.attached, 3u);
  EXPECT_EQ(f.alive, 2u);
  EXPECT_EQ(f.fenced, 1u);
  EXPECT_EQ(f.publishing, 2u);
  const std::string text = Text(f);
  EXPECT_NE(text.find("-1.50s"), std::string::npos) << text;
  EXPECT_NE(text.find("slot 3: metrics unknown: its area's checksum is wrong"), std::string::npos)
      << text;
  EXPECT_NE(text.find("3 attached, 2 alive, 1 fenced"), std::string::npos) << text;
  EXPECT_NE(
      text.find("   2 node2                  12 fenced           -          -        -      -"),
      std::string::npos)
      << text;
}

TEST(TopModelTest, APoolWithoutMetricsOrUnreadableSaysSo) {
  TopModel model;
  PoolMetrics m;
  HostMetrics h = MakeHost(0, 10, 0, {});
  h.published = false;
  h.problem = "the pool has no metrics block (no host has published)";
  m.hosts = {h};
  std::string text = Text(model.Update(m));
  EXPECT_NE(text.find("unknown: no host has published its metrics"), std::string::npos) << text;
  EXPECT_EQ(text.find("metrics unknown:"), std::string::npos) << "said once, not per host";

  text = Text(model.Update(absl::DataLossError("host record 3 has checksum 0x1")));
  EXPECT_NE(text.find("cannot read the pool's metrics: host record 3"), std::string::npos) << text;
}

TEST(TopFormatTest, Figures) {
  EXPECT_EQ(TopBytes(0), "0");
  EXPECT_EQ(TopBytes(1023), "1023");
  EXPECT_EQ(TopBytes(40960), "40.0K");
  EXPECT_EQ(TopBytes(300.0 * 1024 * 1024), "300M");
  EXPECT_EQ(TopDuration(absl::Milliseconds(18)), "18ms");
  EXPECT_EQ(TopDuration(absl::Microseconds(5)), "5us");
  EXPECT_EQ(TopDuration(absl::Milliseconds(2480)), "2.48s");
  EXPECT_EQ(TopDuration(-absl::Milliseconds(1200)), "-1.20s");
  EXPECT_EQ(TopRate(49.84), "49.8");
  EXPECT_EQ(TopRate(12345), "12.3k");
}

// Against a real pool: one host publishes, the other's area is corrupt;
// the frame shows the first and says what is wrong with the second.
TEST(TopPoolTest, ACorruptAreaIsReportedAndTheOtherHostsShown) {
  ::cxlrt::testing::TempDir dir;
  const std::string uri = ::cxlrt::testing::PoolUri(dir, "", "64M");
  ::cxlrt::testing::TestHostOptions o;
  o.create_pool = true;
  auto h0 = ::cxlrt::testing::AttachTestHost(uri, o);
  ASSERT_TRUE(h0.ok()) << h0.status();
  auto h1 = ::cxlrt::testing::AttachTestHost(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(h1.ok()) << h1.status();
  auto pool = runtime::Pool::Open(::cxlrt::testing::OpenUri(uri));
  ASSERT_TRUE(pool.ok()) << pool.status();
  metrics::PoolMetricsReader reader(**pool);
  TopModel model;

  // Attached, nobody publishing: hosts shown, the rest unknown.
  auto m = reader.Read(absl::Milliseconds(500));
  ASSERT_TRUE(m.ok()) << m.status();
  TopFrame f = model.Update(m);
  EXPECT_EQ(f.hosts.size(), 2u);
  EXPECT_EQ(f.alive, 2u);
  std::string text = Text(f);
  EXPECT_NE(text.find("unknown: no host has published its metrics"), std::string::npos) << text;

  metrics::PublisherOptions po;
  po.period = absl::ZeroDuration();
  metrics::MetricsPublisher p0(*h0->pool, *h0->membership, *h0->alloc, po);
  metrics::MetricsPublisher p1(*h1->pool, *h1->membership, *h1->alloc, po);
  ASSERT_TRUE(p0.PublishNow().ok());
  ASSERT_TRUE(p1.PublishNow().ok());
  auto block = h1->alloc->Find(metrics::kMetricsBlockName);
  ASSERT_TRUE(block.ok()) << block.status();
  const runtime::PoolOffset rec = block->offset + h1->alloc->slot() * metrics::kMetricsSlotStride;
  metrics::MetricsSlotLayout r;
  h1->pool->coherence().Fetch(&r, rec, sizeof(r));
  // Garbage in the area, under a record that is itself right.
  std::string junk(r.blob_size, '\xA5');
  h1->pool->coherence().Publish(r.area, junk.data(), junk.size());
  m = reader.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  f = model.Update(m);
  EXPECT_EQ(f.publishing, 1u);
  ASSERT_EQ(f.arenas.size(), 2u);  // from the pool's arenas, not only published metrics
  EXPECT_TRUE(f.arenas[0].attached && f.arenas[1].attached);
  EXPECT_GT(*f.heap_free, 0);
  text = Text(f);
  EXPECT_NE(text.find(absl::StrCat("slot ", h1->alloc->slot(),
                                   ": metrics unknown: its area's "
                                   "checksum is wrong")),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace cxlrt::tools
