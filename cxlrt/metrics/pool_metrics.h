// Pool-wide metrics: every host publishes its process's metrics (the
// registry of cxlrt/runtime/metrics.h) into its own area of the pool, and
// any process, attached or not, reads every host's at once and adds the
// pool's own gauges (hosts, heartbeats, arenas). One exporter serves a
// whole pool; no host needs an HTTP server. docs/metrics.md has the format
// and says when to read this view and when a process's own.
//
// In the pool: a durable named block "cxlrt.metrics" of one 128-byte record
// per host slot (MetricsSlotLayout); record i is written only by the host
// holding slot i, and points at that host's area, a private block of its
// allocator holding the encoded samples. The record's first word is a
// seqlock version (odd while the host rewrites its area, only grows);
// readers take a consistent snapshot by reading the version, the record and
// the area, and the version again, and check both checksums.
//
// Thread-safety: a MetricsPublisher is thread-safe (its own thread, and
// PublishNow from any); a PoolMetricsReader is one thread's at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/metrics.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::metrics {

using runtime::PoolOffset;

inline constexpr char kMetricsBlockName[] = "cxlrt.metrics";
inline constexpr size_t kMetricsSlotStride = 128;
// The largest area a host publishes (its samples encoded): a reader
// refuses a record naming a larger one, so that a corrupt record cannot
// make it allocate and read up to the pool's size.
inline constexpr uint64_t kMaxMetricsArea = uint64_t{16} << 20;

// One host's record (one cache line; 128 B apart from the next host's).
struct MetricsSlotLayout {
  uint64_t version;  // seqlock: odd while the area is rewritten; only grows
  uint64_t epoch;    // the writer's control epoch (records of old incarnations are ignored)
  uint64_t area;     // pool offset of the area; 0: none yet
  uint64_t area_size;
  uint64_t blob_size;          // bytes of encoded samples at `area`
  uint64_t published_unix_ns;  // writer's clock (information)
  uint32_t blob_crc;           // CRC-32C of the blob
  uint32_t pid;
  uint32_t period_ms;  // how often the host publishes
  uint32_t checksum;   // CRC-32C of bytes [8, 60)
};
static_assert(sizeof(MetricsSlotLayout) == 64);

// The checksum a record carries: CRC-32C of bytes [8, 60).
uint32_t MetricsSlotChecksum(const MetricsSlotLayout& r);

// The encoded form of samples (little-endian; docs/metrics.md).
std::string EncodeSamples(const std::vector<runtime::Sample>& samples);
// kDataLoss naming what is wrong when `blob` is not a valid encoding.
absl::StatusOr<std::vector<runtime::Sample>> DecodeSamples(const std::string& blob);

struct PublisherOptions {
  // How often the thread publishes; nullopt: CXLRT_METRICS_PUBLISH_MS
  // (0: no thread; PublishNow only).
  std::optional<absl::Duration> period;
};

class MetricsPublisher {
 public:
  // Starts publishing this process's metrics as the host `membership`
  // holds, in blocks of `alloc`. REQUIRES: the three outlive it.
  MetricsPublisher(runtime::Pool& pool, runtime::Membership& membership,
                   allocator::Allocator& alloc, const PublisherOptions& options = {});
  // Stops the thread; the area stays until the allocator reclaims it.
  ~MetricsPublisher();
  MetricsPublisher(const MetricsPublisher&) = delete;
  MetricsPublisher& operator=(const MetricsPublisher&) = delete;

  // Publishes now. kAborted when this host lost its lease or was fenced;
  // kResourceExhausted when the pool has no room for the area.
  absl::Status PublishNow();
  absl::Duration period() const { return period_; }

 private:
  void Loop();
  absl::StatusOr<PoolOffset> Index();

  runtime::Pool& pool_;
  runtime::Membership& membership_;
  allocator::Allocator& alloc_;
  absl::Duration period_;
  std::mutex mu_;           // one publish at a time
  PoolOffset index_ = 0;    // guarded by mu_
  PoolOffset area_ = 0;     // guarded by mu_
  uint64_t area_size_ = 0;  // guarded by mu_
  uint64_t version_ = 0;    // guarded by mu_
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by stop_mu_
  std::thread thread_;
};

// One host slot as the reader sees it.
struct HostMetrics {
  uint32_t slot = 0;
  runtime::SlotState state = runtime::SlotState::kFree;
  std::string hostname;
  uint32_t pid = 0;
  bool alive = false;                    // heartbeat moved within DeadAfter(lease), seen here
  absl::Duration heartbeat_age;          // since this reader saw the heartbeat move
  absl::Duration lease_margin;           // DeadAfter(lease) - heartbeat_age (negative: dead)
  bool published = false;                // its area was read
  absl::Duration published_age;          // by the writer's wall clock against this reader's
  int64_t published_unix_ns = 0;         // by its wall clock; another: a new publication
  std::string problem;                   // why its area was not read, when it has one
  std::vector<runtime::Sample> samples;  // its process's metrics, as published
};

struct PoolMetrics {
  bool metrics_block = false;      // the pool has the block (some host has published)
  std::vector<HostMetrics> hosts;  // slots in use
  // Every sample: each host's with a "host" label, and the pool's gauges.
  std::vector<runtime::Sample> samples;
};

class PoolMetricsReader {
 public:
  // REQUIRES: `pool` outlives the reader.
  explicit PoolMetricsReader(const runtime::Pool& pool);

  // Reads every host. Heartbeat ages come from this reader's observations:
  // it watches the host table for up to `observe` (ending early once every
  // attached host's heartbeat has moved), so a reader made just before
  // (`cxlrt metrics`) passes about two heartbeat periods and one that reads
  // every second (`cxlrt serve-metrics`) passes zero.
  absl::StatusOr<PoolMetrics> Read(absl::Duration observe = absl::ZeroDuration());
  // Samples the host table once (for a thread that watches between reads).
  void Observe();

 private:
  struct Seen {
    uint64_t epoch = 0;
    uint64_t heartbeat = 0;
    int64_t first_ns = 0;    // when this reader first saw this incarnation
    int64_t changed_ns = 0;  // when it saw the heartbeat move; 0: not yet
  };
  // Returns whether every attached host's heartbeat has been seen to move.
  bool ObserveOnce();

  const runtime::Pool& pool_;
  std::map<uint32_t, Seen> seen_;
};

// How long a reader made now should watch before its first Read: two
// heartbeat periods of the slowest attached host (at least 20 ms, at most
// 2 x 2 s), long enough to see every live host beat once.
absl::Duration FirstReadWindow(const runtime::Pool& pool);

// The Prometheus text of the whole pool (cxlrt/runtime/prometheus.h).
std::string PoolPrometheusText(const PoolMetrics& m);

}  // namespace cxlrt::metrics
