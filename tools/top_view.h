// What `cxlrt top` shows (docs/metrics.md, "cxlrt top"): successive reads
// of the pool-wide metrics (cxlrt/metrics/pool_metrics.h) folded into rows
// of hosts, KV namespaces, communicators and allocator arenas, with rates
// from the deltas between each host's own publications, and a frame laid
// out as lines of text. No terminal code here: the live view
// (top_command.cc) draws these lines with ncurses; --once prints them.
//
// Rates are per host over the interval between two of its publications
// (by its clock), so a view refreshed every second stays right whatever
// period the hosts publish at. A host's first publication seen gives no
// rate yet ("-"); a host whose metrics are older than kStaleRates counts
// as idle.
//
// Thread-compatible: a TopModel is one thread's at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/metrics/pool_metrics.h"

namespace cxlrt::tools {

// A host's rates count while its latest metrics are younger than this (or
// than three of its publication intervals, when that is longer).
inline constexpr absl::Duration kStaleRates = absl::Seconds(5);

struct TopHostRow {
  uint32_t slot = 0;
  std::string hostname;
  uint32_t pid = 0;
  // "alive": heartbeat moved within its lease; "dead": still past
  // DeadAfter(lease) (survivors may fence it); "unseen": not yet seen to
  // move (margin still positive); "fenced".
  std::string state;
  absl::Duration heartbeat_age;
  absl::Duration lease_margin;
  std::optional<absl::Duration> metrics_age;  // unset: its area was not read
  std::string problem;                        // why not, when it was not
  std::optional<double> pins;                 // KV pins its process holds
};

struct TopNamespaceRow {
  std::string name;
  double entries = 0;  // over every host's partition
  double bytes = 0;    // value bytes
  double quota = 0;    // 0: none
  double quota_use = 0;
  uint64_t hits = 0, misses = 0;
  std::optional<double> hit_rate;  // hits / (hits + misses); unset: no gets yet
  // Summed over hosts; unset until a host published twice.
  std::optional<double> hits_per_s, misses_per_s, puts_per_s, evictions_per_s;
};

struct TopCollectiveRow {
  std::string communicator, collective, size_bucket;
  int ranks = 0;                      // ranks that reported calls
  uint64_t calls = 0;                 // of the rank furthest ahead
  std::optional<double> calls_per_s;  // per rank (the mean)
  std::optional<double> busbw_now;    // GB/s over the ranks' last intervals (timed calls in them)
  std::optional<double> busbw_avg;    // GB/s since the communicators started
};

struct TopArenaRow {
  uint32_t slot = 0;
  bool attached = false;  // a host holds the slot now (else a departed host's arena)
  double bytes_in_use = 0;
  std::optional<double> cached, segments;  // from its process's metrics
  std::optional<double> remote_frees_per_s;
  std::optional<uint64_t> recovered_arenas;
};

struct TopFrame {
  std::string error;           // the pool could not be read (everything else empty)
  bool metrics_block = false;  // some host has published (the pool has the block)
  uint32_t attached = 0, alive = 0, fenced = 0, publishing = 0;
  std::optional<double> heap_free;  // unset: no allocator in the pool
  double heap_in_use = 0;
  std::vector<TopHostRow> hosts;
  std::vector<TopNamespaceRow> namespaces;
  std::vector<TopCollectiveRow> collectives;
  std::vector<TopArenaRow> arenas;
};

class TopModel {
 public:
  // Folds in one read (an error gives a frame that says it) and returns
  // the frame to show.
  TopFrame Update(const absl::StatusOr<metrics::PoolMetrics>& read);

 private:
  struct History {
    uint32_t pid = 0;
    int64_t published_unix_ns = 0;
    absl::Duration interval;                 // between its last two publications
    std::map<std::string, uint64_t> values;  // counters, by CounterKey
    std::map<std::string, double> rates;     // per second; empty: not known yet
    bool rated = false;
  };
  std::map<uint32_t, History> history_;  // by slot
};

enum class TopStyle { kPlain, kTitle, kHeading, kColumns, kWarning };
struct TopLine {
  std::string text;
  TopStyle style = TopStyle::kPlain;
};

struct TopHeader {
  std::string uri;
  absl::Time now;
  absl::Duration period;
  bool live = false;  // name the keys
};

// The frame as lines: two title lines, then the sections. Columns are
// fixed; names longer than theirs are cut with '~'.
std::vector<TopLine> RenderTop(const TopFrame& f, const TopHeader& h);

// Compact figures for the columns: "40.0K", "1.50M" (binary units); "2.48s",
// "18ms", "-1.2s"; "49.8", "1.2k".
std::string TopBytes(double bytes);
std::string TopDuration(absl::Duration d);
std::string TopRate(double per_s);

}  // namespace cxlrt::tools
