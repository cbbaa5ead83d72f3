#include "tools/top_view.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlrt::tools {

using runtime::MetricType;
using runtime::Sample;

namespace {

// One counter of one host: its name and labels.
std::string CounterKey(const Sample& s) {
  std::string k = s.name;
  for (const runtime::Label& l : s.labels) absl::StrAppend(&k, "\x1f", l.name, "=", l.value);
  return k;
}

const std::string* LabelOf(const Sample& s, const char* name) {
  for (const runtime::Label& l : s.labels) {
    if (l.name == name) return &l.value;
  }
  return nullptr;
}

void AddRate(std::optional<double>& acc, std::optional<double> r) {
  if (r) acc = acc.value_or(0) + *r;
}

// Size buckets in their order (comm_metrics.cc); unknown names last.
int BucketRank(const std::string& b) {
  static const char* const kOrder[] = {"64B", "1KiB", "16KiB", "256KiB", "4MiB", "64MiB", "inf"};
  for (int i = 0; i < 7; ++i) {
    if (b == kOrder[i]) return i;
  }
  return 7;
}

// A cell cut to `width` (the last kept character becomes '~'). Names come
// from callers and other hosts: bytes outside printable ASCII (control
// characters would drive the terminal; others would break the columns)
// are shown as '?'.
std::string Cut(const std::string& raw, size_t width) {
  std::string s = raw;
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (s.size() <= width) return s;
  return s.substr(0, width - 1) + "~";
}

std::string Opt(const std::optional<double>& v, std::string (*f)(double)) {
  return v ? f(*v) : "-";
}

std::string Percent(double ratio) { return absl::StrFormat("%.1f", 100 * ratio); }

std::string GBs(double v) {
  if (v >= 100) return absl::StrFormat("%.0f", v);
  if (v >= 0.001 || v == 0) return absl::StrFormat("%.3f", v);
  return absl::StrFormat("%.1e", v);
}

}  // namespace

std::string TopBytes(double bytes) {
  static const char* const kUnits[] = {"", "K", "M", "G", "T", "P"};
  if (bytes < 1024) return absl::StrFormat("%.0f", bytes);
  int u = 0;
  while (u < 5 && bytes >= 1024) {
    bytes /= 1024;
    ++u;
  }
  if (bytes < 100) return absl::StrFormat("%.1f%s", bytes, kUnits[u]);
  return absl::StrFormat("%.0f%s", bytes, kUnits[u]);
}

std::string TopDuration(absl::Duration d) {
  const std::string sign = d < absl::ZeroDuration() ? "-" : "";
  d = absl::AbsDuration(d);
  if (d < absl::Milliseconds(1)) return absl::StrCat(sign, absl::ToInt64Microseconds(d), "us");
  if (d < absl::Seconds(1)) return absl::StrCat(sign, absl::ToInt64Milliseconds(d), "ms");
  if (d < absl::Seconds(100)) return absl::StrFormat("%s%.2fs", sign, absl::ToDoubleSeconds(d));
  if (d < absl::Hours(2)) return absl::StrFormat("%s%.0fm", sign, absl::ToDoubleMinutes(d));
  return absl::StrFormat("%s%.0fh", sign, absl::ToDoubleHours(d));
}

std::string TopRate(double per_s) {
  if (per_s < 10000) return absl::StrFormat("%.1f", per_s);
  if (per_s < 1e7) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.1fM", per_s / 1e6);
}

TopFrame TopModel::Update(const absl::StatusOr<metrics::PoolMetrics>& read) {
  TopFrame f;
  if (!read.ok()) {
    f.error = std::string(read.status().message());
    history_.clear();  // the next good read starts the rates afresh
    return f;
  }
  const metrics::PoolMetrics& m = *read;

  // Each host's counters against its previous publication.
  std::set<uint32_t> present;
  for (const metrics::HostMetrics& h : m.hosts) {
    present.insert(h.slot);
    if (!h.published) continue;
    History& hist = history_[h.slot];
    if (hist.pid != h.pid || h.published_unix_ns < hist.published_unix_ns) {
      hist = History{};  // another process, or its clock went back: start again
      hist.pid = h.pid;
    }
    if (h.published_unix_ns == hist.published_unix_ns) continue;  // no new publication
    std::map<std::string, uint64_t> values;
    for (const Sample& s : h.samples) {
      if (s.type == MetricType::kCounter) values[CounterKey(s)] = s.count;
    }
    if (hist.published_unix_ns != 0) {
      const absl::Duration dt = absl::Nanoseconds(h.published_unix_ns - hist.published_unix_ns);
      const double secs = absl::ToDoubleSeconds(dt);
      hist.rates.clear();
      for (const auto& [k, v] : values) {
        auto it = hist.values.find(k);
        // A counter below its last value was reset (its owner made it
        // anew): it counted from zero since, as Prometheus's rate() has it.
        const uint64_t before = it == hist.values.end() || it->second > v ? 0 : it->second;
        hist.rates[k] = static_cast<double>(v - before) / secs;
      }
      hist.interval = dt;
      hist.rated = true;
    }
    hist.values = std::move(values);
    hist.published_unix_ns = h.published_unix_ns;
  }
  for (auto it = history_.begin(); it != history_.end();) {
    it = present.count(it->first) ? std::next(it) : history_.erase(it);
  }
  // The rate of one counter of host `h`: unset while not known.
  auto rate = [&](const metrics::HostMetrics& h, const Sample& s) -> std::optional<double> {
    auto it = history_.find(h.slot);
    if (it == history_.end() || !it->second.rated) return std::nullopt;
    if (h.published_age > std::max(kStaleRates, 3 * it->second.interval)) return 0.0;
    auto r = it->second.rates.find(CounterKey(s));
    return r == it->second.rates.end() ? 0.0 : r->second;
  };

  // Hosts.
  for (const metrics::HostMetrics& h : m.hosts) {
    TopHostRow r;
    r.slot = h.slot;
    r.hostname = h.hostname;
    r.pid = h.pid;
    r.heartbeat_age = h.heartbeat_age;
    r.lease_margin = h.lease_margin;
    if (h.state == runtime::SlotState::kFenced) {
      r.state = "fenced";
      ++f.fenced;
    } else {
      ++f.attached;
      r.state = h.alive ? "alive" : h.lease_margin <= absl::ZeroDuration() ? "dead" : "unseen";
    }
    f.alive += h.alive;
    if (h.published) {
      r.metrics_age = h.published_age;
      ++f.publishing;
      for (const Sample& s : h.samples) {
        if (s.name == "kv.pins_held") r.pins = r.pins.value_or(0) + s.gauge;
      }
    } else {
      r.problem = h.problem;
    }
    f.hosts.push_back(std::move(r));
  }
  f.metrics_block = m.metrics_block;

  // KV namespaces and communicators, over every host that published.
  std::map<std::string, TopNamespaceRow> ns;
  struct Coll {
    TopCollectiveRow row;
    std::set<std::string> ranks, rated_ranks;
    double bus = 0, time = 0;
    std::optional<double> bus_rate, time_rate, calls_rate;
  };
  std::map<std::tuple<std::string, std::string, int, std::string>, Coll> colls;
  std::map<uint32_t, TopArenaRow> arenas;
  for (const metrics::HostMetrics& h : m.hosts) {
    for (const Sample& s : h.samples) {
      if (s.name.rfind("kv.", 0) == 0) {
        const std::string* name = LabelOf(s, "namespace");
        if (name == nullptr) continue;
        TopNamespaceRow& r = ns[*name];
        r.name = *name;
        if (s.name == "kv.entries") {
          r.entries += s.gauge;
        } else if (s.name == "kv.stored_bytes") {
          r.bytes += s.gauge;
        } else if (s.name == "kv.quota_bytes") {
          r.quota = std::max(r.quota, s.gauge);
        } else if (s.name == "kv.quota_use") {
          r.quota_use = std::max(r.quota_use, s.gauge);
        } else if (s.name == "kv.hits") {
          r.hits += s.count;
          AddRate(r.hits_per_s, rate(h, s));
        } else if (s.name == "kv.misses") {
          r.misses += s.count;
          AddRate(r.misses_per_s, rate(h, s));
        } else if (s.name == "kv.puts") {
          AddRate(r.puts_per_s, rate(h, s));
        } else if (s.name == "kv.evictions") {
          AddRate(r.evictions_per_s, rate(h, s));
        }
      } else if (s.name.rfind("collective.", 0) == 0) {
        const std::string* comm = LabelOf(s, "communicator");
        const std::string* coll = LabelOf(s, "collective");
        const std::string* bucket = LabelOf(s, "size_bucket");
        const std::string* rank = LabelOf(s, "rank");
        if (!comm || !coll || !bucket || !rank || s.type != MetricType::kCounter) continue;
        Coll& c = colls[{*comm, *coll, BucketRank(*bucket), *bucket}];
        c.row.communicator = *comm;
        c.row.collective = *coll;
        c.row.size_bucket = *bucket;
        const std::optional<double> r = rate(h, s);
        if (s.name == "collective.calls") {
          c.ranks.insert(*rank);
          c.row.calls = std::max(c.row.calls, s.count);
          if (r) c.rated_ranks.insert(*rank);
          AddRate(c.calls_rate, r);
        } else if (s.name == "collective.bus_bytes") {
          c.bus += static_cast<double>(s.count);
          AddRate(c.bus_rate, r);
        } else if (s.name == "collective.time") {
          c.time += static_cast<double>(s.count);
          AddRate(c.time_rate, r);
        }
      } else if (s.name.rfind("allocator.", 0) == 0) {
        TopArenaRow& a = arenas[h.slot];
        a.slot = h.slot;
        if (s.name == "allocator.bytes_cached") a.cached = s.gauge;
        if (s.name == "allocator.segments") a.segments = s.gauge;
        if (s.name == "allocator.remote_frees") a.remote_frees_per_s = rate(h, s);
        if (s.name == "allocator.recovered_arenas") a.recovered_arenas = s.count;
      }
    }
  }
  for (auto& [name, r] : ns) {
    if (r.hits + r.misses > 0) r.hit_rate = static_cast<double>(r.hits) / (r.hits + r.misses);
    f.namespaces.push_back(std::move(r));
  }
  for (auto& [key, c] : colls) {
    c.row.ranks = static_cast<int>(c.ranks.size());
    if (c.calls_rate && !c.rated_ranks.empty()) {
      c.row.calls_per_s = *c.calls_rate / static_cast<double>(c.rated_ranks.size());
    }
    // Bytes per ns: GB/s.
    if (c.time > 0) c.row.busbw_avg = c.bus / c.time;
    if (c.time_rate && c.bus_rate && *c.time_rate > 0) c.row.busbw_now = *c.bus_rate / *c.time_rate;
    f.collectives.push_back(std::move(c.row));
  }

  // Allocator: every arena the pool has (departed hosts' too), with what
  // its process published.
  for (const Sample& s : m.samples) {
    if (s.name == "allocator.free_bytes") f.heap_free = s.gauge;
    if (s.name != "allocator.arena_bytes_in_use") continue;
    const std::string* host = LabelOf(s, "host");
    uint32_t slot = 0;
    if (host == nullptr || !absl::SimpleAtoi(*host, &slot)) continue;
    TopArenaRow& a = arenas[slot];
    a.slot = slot;
    a.bytes_in_use = s.gauge;
    f.heap_in_use += s.gauge;
  }
  for (auto& [slot, a] : arenas) {
    a.attached = present.count(slot) != 0;
    f.arenas.push_back(a);
  }
  return f;
}

std::vector<TopLine> RenderTop(const TopFrame& f, const TopHeader& h) {
  std::vector<TopLine> out;
  auto line = [&](std::string text, TopStyle style = TopStyle::kPlain) {
    out.push_back({std::move(text), style});
  };
  line(absl::StrCat("cxlrt top  ", h.uri, "  ",
                    absl::FormatTime("%H:%M:%S", h.now, absl::UTCTimeZone()), " UTC  every ",
                    TopDuration(h.period), h.live ? "  (q quit, r refresh, j/k scroll)" : ""),
       TopStyle::kTitle);
  if (!f.error.empty()) {
    line(absl::StrCat("cannot read the pool's metrics: ", f.error), TopStyle::kWarning);
    return out;
  }
  line(absl::StrCat(
      "hosts: ", f.attached, " attached, ", f.alive, " alive, ", f.fenced,
      " fenced;  metrics from ", f.publishing, " of ", f.hosts.size(), " hosts;  heap: ",
      f.heap_free
          ? absl::StrCat(TopBytes(f.heap_in_use), " in use, ", TopBytes(*f.heap_free), " free")
          : "no allocator"));

  // Hosts.
  line("");
  line("HOSTS", TopStyle::kHeading);
  line(absl::StrFormat("%4s %-16s %8s %-7s %10s %10s %8s %6s", "SLOT", "HOSTNAME", "PID", "STATE",
                       "HEARTBEAT", "LEASE-LEFT", "METRICS", "PINS"),
       TopStyle::kColumns);
  if (f.hosts.empty()) line("  (no host is attached)");
  std::vector<std::string> problems;
  for (const TopHostRow& r : f.hosts) {
    // A fenced incarnation's heartbeat and lease mean nothing any more.
    const bool fenced = r.state == "fenced";
    line(absl::StrFormat("%4d %-16s %8d %-7s %10s %10s %8s %6s", r.slot, Cut(r.hostname, 16), r.pid,
                         r.state, fenced ? "-" : TopDuration(r.heartbeat_age),
                         fenced ? "-" : TopDuration(r.lease_margin),
                         r.metrics_age ? TopDuration(*r.metrics_age) : "-",
                         r.pins ? absl::StrCat(static_cast<int64_t>(*r.pins)) : "-"),
         r.state == "alive" ? TopStyle::kPlain : TopStyle::kWarning);
    if (!r.metrics_age && f.metrics_block) {
      problems.push_back(absl::StrCat("  slot ", r.slot, ": metrics unknown: ", r.problem));
    }
  }
  for (std::string& p : problems) line(std::move(p), TopStyle::kWarning);
  // KV and collectives are known only from the hosts whose metrics were read.
  const bool none = f.publishing == 0;
  const std::string unknown = !f.metrics_block
                                  ? "  (unknown: no host has published its metrics into this pool)"
                                  : "  (unknown: no attached host's metrics could be read)";

  // KV.
  line("");
  line("KV NAMESPACES", TopStyle::kHeading);
  line(absl::StrFormat("%-20s %8s %8s %7s %6s %8s %8s %8s %8s", "NAMESPACE", "ENTRIES", "BYTES",
                       "QUOTA%", "HIT%", "HITS/s", "MISSES/s", "PUTS/s", "EVICT/s"),
       TopStyle::kColumns);
  if (none) line(unknown, TopStyle::kWarning);
  if (!none && f.namespaces.empty()) line("  (no namespace has been used)");
  for (const TopNamespaceRow& r : f.namespaces) {
    line(absl::StrFormat("%-20s %8.0f %8s %7s %6s %8s %8s %8s %8s", Cut(r.name, 20), r.entries,
                         TopBytes(r.bytes), r.quota > 0 ? Percent(r.quota_use) : "-",
                         r.hit_rate ? Percent(*r.hit_rate) : "-", Opt(r.hits_per_s, TopRate),
                         Opt(r.misses_per_s, TopRate), Opt(r.puts_per_s, TopRate),
                         Opt(r.evictions_per_s, TopRate)));
  }

  // Communicators.
  line("");
  line("COMMUNICATORS", TopStyle::kHeading);
  line(absl::StrFormat("%-16s %5s %-13s %6s %10s %9s %10s %10s", "COMMUNICATOR", "RANKS",
                       "COLLECTIVE", "SIZE<=", "CALLS", "CALLS/s", "BUSBW-NOW", "BUSBW-AVG"),
       TopStyle::kColumns);
  if (none) line(unknown, TopStyle::kWarning);
  if (!none && f.collectives.empty()) line("  (no collective call yet)");
  for (const TopCollectiveRow& r : f.collectives) {
    line(absl::StrFormat("%-16s %5d %-13s %6s %10d %9s %10s %10s", Cut(r.communicator, 16), r.ranks,
                         Cut(r.collective, 13), r.size_bucket, r.calls, Opt(r.calls_per_s, TopRate),
                         Opt(r.busbw_now, GBs), Opt(r.busbw_avg, GBs)));
  }

  // Allocator.
  line("");
  line("ALLOCATOR", TopStyle::kHeading);
  line(absl::StrFormat("%5s %-9s %10s %10s %9s %14s %10s", "ARENA", "HOST", "IN-USE", "CACHED",
                       "SEGMENTS", "REMOTE-FREE/s", "RECOVERED"),
       TopStyle::kColumns);
  if (!f.heap_free) line("  (the pool has no allocator yet)");
  for (const TopArenaRow& a : f.arenas) {
    auto num = [](const std::optional<double>& v) {
      return v ? absl::StrCat(static_cast<int64_t>(*v)) : std::string("-");
    };
    line(absl::StrFormat("%5d %-9s %10s %10s %9s %14s %10s", a.slot,
                         a.attached ? "attached" : "departed", TopBytes(a.bytes_in_use),
                         a.cached ? TopBytes(*a.cached) : "-", num(a.segments),
                         Opt(a.remote_frees_per_s, TopRate),
                         a.recovered_arenas ? absl::StrCat(*a.recovered_arenas) : "-"));
  }
  return out;
}

}  // namespace cxlrt::tools
