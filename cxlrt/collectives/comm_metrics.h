// The metrics of one communicator (docs/metrics.md): calls, bytes, bus
// bytes and time per collective and message size bucket, the busbw they
// give, as NCCL's Inspector plugin labels them (communicator, collective,
// size bucket; and the rank).
//
// Thread-safety: one thread at a time runs a communicator's calls (the
// caller, or the asynchronous proxy after Quiesce), so the cells have one
// writer: plain relaxed loads and stores, no read-modify-write on the call
// path. The registry's collector reads them from any thread; a value it
// reads may lag by the call in progress.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cxlrt/collectives/types.h"
#include "cxlrt/runtime/metrics.h"

namespace cxlrt::collectives_internal {

class CommMetrics {
 public:
  // Size buckets by nccl-tests' size of a call: up to 64 B, 1 KiB, 16 KiB,
  // 256 KiB, 4 MiB, 64 MiB, and larger.
  static constexpr int kSizeBuckets = 7;
  static const char* SizeBucketName(int b);
  static int SizeBucketOf(uint64_t bytes);
  // nccl-tests' size of a call (max of its send and receive bytes) and its
  // bus factor.
  static uint64_t CallBytes(collectives::CollKind kind, size_t count, collectives::DataType type,
                            int nranks);
  static double BusFactor(collectives::CollKind kind, int nranks);

  // Registers the collector. `name` is the user's name of the communicator;
  // `slot` the host slot of the rank's allocator.
  CommMetrics(std::string name, int rank, int nranks, uint32_t slot);
  ~CommMetrics();

  // The start of a call: which cell it counts in and, for a call the
  // sampling picks, when it started.
  struct Probe {
    int kind = 0;
    int bucket = 0;
    uint64_t bytes = 0;
    uint32_t weight = 0;  // 0: not timed
    int64_t start_ns = 0;
  };
  // Point-to-point calls count beside the collectives, as NCCL's
  // Inspector counts its send and recv (bus factor 1).
  static constexpr int kSend = 11, kRecv = 12;
  Probe Begin(collectives::CollKind kind, uint64_t bytes) {
    return Begin(static_cast<int>(kind), bytes);
  }
  Probe Begin(int kind, uint64_t bytes) {
    Probe p;
    p.kind = kind;
    p.bucket = SizeBucketOf(bytes);
    p.bytes = bytes;
    // The first `period` calls of a cell are each timed (weight 1), then
    // one in `period` stands for the calls up to the next (weight period).
    Cell& c = cells_[p.kind][p.bucket];
    if (c.until_sample != 0) {
      --c.until_sample;
    } else if (const uint32_t period = runtime::MetricsSamplePeriod(); period != 0) {
      if (c.started < period) {
        p.weight = 1;
      } else {
        p.weight = period;
        c.until_sample = period - 1;
      }
      p.start_ns = Now();
    }
    ++c.started;
    return p;
  }
  // The end of a call that returned OK.
  void End(const Probe& p) {
    Cell& c = cells_[p.kind][p.bucket];
    Bump(c.calls, 1);
    Bump(c.bytes, p.bytes);
    if (p.weight != 0) {
      Bump(c.time_ns, static_cast<uint64_t>(Now() - p.start_ns) * p.weight);
      Bump(c.timed_bus_bytes, static_cast<uint64_t>(p.bytes * bus_factor_[p.kind]) * p.weight);
    }
  }

 private:
  static constexpr int kKinds = 13;  // CollKind values 1..10, by value; kSend, kRecv
  struct Cell {
    std::atomic<uint64_t> calls{0}, bytes{0};
    // Of the timed calls, each times its weight: estimates of every call's.
    std::atomic<uint64_t> time_ns{0}, timed_bus_bytes{0};
    uint32_t until_sample = 0;  // calls before the next timed one; writer only
    uint64_t started = 0;       // calls begun; writer only
  };
  static void Bump(std::atomic<uint64_t>& v, uint64_t n) {
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  static int64_t Now();
  void Collect(std::vector<runtime::Sample>* out) const;

  const std::string name_;
  const int rank_, nranks_;
  const uint32_t slot_;
  std::array<double, kKinds> bus_factor_{};
  std::array<std::array<Cell, kSizeBuckets>, kKinds> cells_;
  std::unique_ptr<runtime::MetricsCollector> collector_;  // last: it reads the cells
};

}  // namespace cxlrt::collectives_internal
