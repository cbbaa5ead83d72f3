#include "cxlrt/collectives/comm_metrics.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace cxlrt::collectives_internal {

using collectives::CollKind;

namespace {

const runtime::MetricInfo kCalls{"collective.calls", "calls",
                                 "Collective calls that returned OK, per communicator, "
                                 "collective and size bucket (nccl-tests' size)."};
const runtime::MetricInfo kBytes{"collective.bytes", "bytes",
                                 "nccl-tests' size of each call (the larger of its send and "
                                 "receive bytes), summed."};
const runtime::MetricInfo kTime{"collective.time", "ns",
                                "Time in calls, estimated from the sampled calls "
                                "(CXLRT_METRICS_SAMPLE): each counts for the calls beside it."};
const runtime::MetricInfo kBusBytes{"collective.bus_bytes", "bytes",
                                    "Bytes times nccl-tests' bus factor, of the sampled calls, "
                                    "weighted as the time is: busbw = rate(bus_bytes)/rate(time)."};
const runtime::MetricInfo kBusbw{"collective.busbw_gbs", "GB/s",
                                 "Bus bandwidth (nccl-tests' busbw) of the calls so far: "
                                 "bus_bytes / time (NCCL Inspector's nccl_bus_bandwidth_gbs)."};

const char* KindLabel(int k) {
  if (k == CommMetrics::kSend) return "send";
  if (k == CommMetrics::kRecv) return "recv";
  switch (static_cast<CollKind>(k)) {
    case CollKind::kAllReduce:
      return "allreduce";
    case CollKind::kReduceScatter:
      return "reducescatter";
    case CollKind::kAllGather:
      return "allgather";
    case CollKind::kBroadcast:
      return "broadcast";
    case CollKind::kReduce:
      return "reduce";
    case CollKind::kGather:
      return "gather";
    case CollKind::kScatter:
      return "scatter";
    case CollKind::kAllToAll:
      return "alltoall";
    case CollKind::kBarrier:
      return "barrier";
    case CollKind::kAllToAllV:
      return "alltoallv";
  }
  return "?";
}

}  // namespace

const char* CommMetrics::SizeBucketName(int b) {
  static const char* const kNames[kSizeBuckets] = {"64B",  "1KiB",  "16KiB", "256KiB",
                                                   "4MiB", "64MiB", "inf"};
  return kNames[b];
}

int CommMetrics::SizeBucketOf(uint64_t bytes) {
  int b = 0;
  for (uint64_t edge = 64; b < kSizeBuckets - 1 && bytes > edge; edge <<= 4) ++b;
  return b;
}

uint64_t CommMetrics::CallBytes(CollKind kind, size_t count, collectives::DataType type,
                                int nranks) {
  const uint64_t es = collectives::SizeOf(type);
  switch (kind) {
    case CollKind::kAllGather:
    case CollKind::kGather:
    case CollKind::kReduceScatter:
    case CollKind::kScatter:
    case CollKind::kAllToAll:
      return uint64_t{count} * es * static_cast<uint64_t>(nranks);
    default:
      return uint64_t{count} * es;
  }
}

double CommMetrics::BusFactor(CollKind kind, int n) {
  switch (kind) {
    case CollKind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return 1;
    case CollKind::kBarrier:
      return 0;
    default:
      return static_cast<double>(n - 1) / n;
  }
}

int64_t CommMetrics::Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

CommMetrics::CommMetrics(std::string name, int rank, int nranks, uint32_t slot)
    : name_(std::move(name)), rank_(rank), nranks_(nranks), slot_(slot) {
  for (int k = 1; k < kSend; ++k) bus_factor_[k] = BusFactor(static_cast<CollKind>(k), nranks_);
  bus_factor_[kSend] = bus_factor_[kRecv] = 1;
  collector_ = std::make_unique<runtime::MetricsCollector>(
      [this](std::vector<runtime::Sample>* out) { Collect(out); });
}

CommMetrics::~CommMetrics() { collector_.reset(); }

void CommMetrics::Collect(std::vector<runtime::Sample>* out) const {
  for (int k = 1; k < kKinds; ++k) {
    for (int b = 0; b < kSizeBuckets; ++b) {
      const Cell& c = cells_[k][b];
      const uint64_t calls = c.calls.load(std::memory_order_relaxed);
      if (calls == 0) continue;
      runtime::Labels l = {{"slot", absl::StrCat(slot_)},
                           {"communicator", name_},
                           {"rank", absl::StrCat(rank_)},
                           {"collective", KindLabel(k)},
                           {"size_bucket", SizeBucketName(b)}};
      const uint64_t ns = c.time_ns.load(std::memory_order_relaxed);
      const uint64_t bus = c.timed_bus_bytes.load(std::memory_order_relaxed);
      out->push_back(runtime::CounterSample(kCalls, l, calls));
      out->push_back(runtime::CounterSample(kBytes, l, c.bytes.load(std::memory_order_relaxed)));
      out->push_back(runtime::CounterSample(kTime, l, ns));
      out->push_back(runtime::CounterSample(kBusBytes, l, bus));
      out->push_back(
          runtime::GaugeSample(kBusbw, l, ns == 0 ? 0.0 : static_cast<double>(bus) / ns));
    }
  }
}

}  // namespace cxlrt::collectives_internal
