#include "cxlrt/metrics/pool_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/prometheus.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::metrics {

using runtime::Label;
using runtime::Labels;
using runtime::MetricType;
using runtime::Sample;

namespace {

const runtime::Knob<uint32_t> kPublishMs(
    {"CXLRT_METRICS_PUBLISH_MS", "1000",
     "How often a host publishes its metrics into the pool for pool-wide export, in ms "
     "(0: never)."},
    1000, runtime::UintIn(0, 3600000));

constexpr uint32_t kMagic = 0x534D5843;  // "CXMS"
constexpr uint32_t kFormat = 1;
constexpr uint16_t kSameHelp = 0xFFFF;
constexpr uint64_t kMinArea = 16 << 10;
// A reader gives up on a record that keeps changing under it.
constexpr int kReadAttempts = 8;

void Put(std::string* out, const void* p, size_t n) { out->append(static_cast<const char*>(p), n); }
template <typename T>
void PutInt(std::string* out, T v) {
  Put(out, &v, sizeof(v));
}
void PutText(std::string* out, const std::string& s) {
  Put(out, s.data(), std::min<size_t>(s.size(), 0xFFFE));
}

class Cursor {
 public:
  explicit Cursor(const std::string& s) : s_(s) {}
  template <typename T>
  absl::StatusOr<T> Int(const char* what) {
    T v;
    if (s_.size() - pos_ < sizeof(T)) return Short(what);
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string> Text(size_t n, const char* what) {
    if (s_.size() - pos_ < n) return Short(what);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  absl::Status Short(const char* what) const {
    return absl::DataLossError(
        absl::StrCat("metrics blob of ", s_.size(), " bytes ends at ", pos_, " inside ", what));
  }
  const std::string& s_;
  size_t pos_ = 0;
};

int64_t MonoNs() { return runtime::NowNs(); }

int64_t UnixNs() { return absl::ToUnixNanos(absl::Now()); }

}  // namespace

uint32_t MetricsSlotChecksum(const MetricsSlotLayout& r) {
  return runtime::Crc32c(reinterpret_cast<const uint8_t*>(&r) + 8,
                         offsetof(MetricsSlotLayout, checksum) - 8);
}

std::string EncodeSamples(const std::vector<Sample>& samples) {
  std::string out;
  PutInt<uint32_t>(&out, kMagic);
  PutInt<uint32_t>(&out, kFormat);
  PutInt<uint32_t>(&out, static_cast<uint32_t>(samples.size()));
  const Sample* prev = nullptr;
  for (const Sample& s : samples) {
    PutInt<uint8_t>(&out, static_cast<uint8_t>(s.type));
    PutInt<uint8_t>(&out, static_cast<uint8_t>(std::min<size_t>(s.labels.size(), 255)));
    const bool same_help = prev != nullptr && prev->name == s.name && prev->help == s.help;
    PutInt<uint16_t>(&out, static_cast<uint16_t>(std::min<size_t>(s.name.size(), 0xFFFE)));
    PutInt<uint16_t>(&out, static_cast<uint16_t>(std::min<size_t>(s.unit.size(), 0xFFFE)));
    PutInt<uint16_t>(&out, same_help
                               ? kSameHelp
                               : static_cast<uint16_t>(std::min<size_t>(s.help.size(), 0xFFFE)));
    PutText(&out, s.name);
    PutText(&out, s.unit);
    if (!same_help) PutText(&out, s.help);
    for (size_t i = 0; i < s.labels.size() && i < 255; ++i) {
      const Label& l = s.labels[i];
      PutInt<uint16_t>(&out, static_cast<uint16_t>(std::min<size_t>(l.name.size(), 0xFFFE)));
      PutInt<uint16_t>(&out, static_cast<uint16_t>(std::min<size_t>(l.value.size(), 0xFFFE)));
      PutText(&out, l.name);
      PutText(&out, l.value);
    }
    switch (s.type) {
      case MetricType::kCounter:
        PutInt<uint64_t>(&out, s.count);
        break;
      case MetricType::kGauge:
        PutInt<double>(&out, s.gauge);
        break;
      case MetricType::kHistogram: {
        PutInt<uint64_t>(&out, s.hist.count);
        PutInt<uint64_t>(&out, s.hist.sum);
        uint8_t nonzero = 0;
        for (uint64_t b : s.hist.buckets) nonzero += b != 0;
        PutInt<uint8_t>(&out, nonzero);
        for (size_t i = 0; i < s.hist.buckets.size(); ++i) {
          if (s.hist.buckets[i] == 0) continue;
          PutInt<uint8_t>(&out, static_cast<uint8_t>(i));
          PutInt<uint64_t>(&out, s.hist.buckets[i]);
        }
        break;
      }
    }
    prev = &s;
  }
  return out;
}

absl::StatusOr<std::vector<Sample>> DecodeSamples(const std::string& blob) {
  Cursor c(blob);
  CXLRT_ASSIGN_OR_RETURN(uint32_t magic, c.Int<uint32_t>("the header"));
  CXLRT_ASSIGN_OR_RETURN(uint32_t format, c.Int<uint32_t>("the header"));
  CXLRT_ASSIGN_OR_RETURN(uint32_t n, c.Int<uint32_t>("the header"));
  if (magic != kMagic || format != kFormat) {
    return absl::DataLossError(absl::StrCat("metrics blob has magic 0x", absl::Hex(magic),
                                            " format ", format, " (expected 0x", absl::Hex(kMagic),
                                            " format ", kFormat, ")"));
  }
  // Each sample takes at least 16 bytes: a count beyond that is corrupt.
  if (n > blob.size() / 16) {
    return absl::DataLossError(
        absl::StrCat("metrics blob of ", blob.size(), " bytes claims ", n, " samples"));
  }
  std::vector<Sample> out;
  out.reserve(n);
  for (uint32_t k = 0; k < n; ++k) {
    Sample s;
    CXLRT_ASSIGN_OR_RETURN(uint8_t type, c.Int<uint8_t>("a sample"));
    if (type < 1 || type > 3) {
      return absl::DataLossError(absl::StrCat("metrics sample ", k, " has type ", type));
    }
    s.type = static_cast<MetricType>(type);
    CXLRT_ASSIGN_OR_RETURN(uint8_t nlabels, c.Int<uint8_t>("a sample"));
    CXLRT_ASSIGN_OR_RETURN(uint16_t name_len, c.Int<uint16_t>("a sample"));
    CXLRT_ASSIGN_OR_RETURN(uint16_t unit_len, c.Int<uint16_t>("a sample"));
    CXLRT_ASSIGN_OR_RETURN(uint16_t help_len, c.Int<uint16_t>("a sample"));
    CXLRT_ASSIGN_OR_RETURN(s.name, c.Text(name_len, "a name"));
    if (s.name.empty())
      return absl::DataLossError(absl::StrCat("metrics sample ", k, " has no name"));
    CXLRT_ASSIGN_OR_RETURN(s.unit, c.Text(unit_len, "a unit"));
    if (help_len == kSameHelp) {
      if (out.empty() || out.back().name != s.name) {
        return absl::DataLossError(
            absl::StrCat("metrics sample ", k, " (", s.name, ") borrows a help text it has not"));
      }
      s.help = out.back().help;
    } else {
      CXLRT_ASSIGN_OR_RETURN(s.help, c.Text(help_len, "a help text"));
    }
    for (int i = 0; i < nlabels; ++i) {
      CXLRT_ASSIGN_OR_RETURN(uint16_t kl, c.Int<uint16_t>("a label"));
      CXLRT_ASSIGN_OR_RETURN(uint16_t vl, c.Int<uint16_t>("a label"));
      Label l;
      CXLRT_ASSIGN_OR_RETURN(l.name, c.Text(kl, "a label"));
      CXLRT_ASSIGN_OR_RETURN(l.value, c.Text(vl, "a label"));
      if (l.name.empty()) {
        return absl::DataLossError(
            absl::StrCat("metrics sample ", k, " (", s.name, ") has a label without a name"));
      }
      s.labels.push_back(std::move(l));
    }
    switch (s.type) {
      case MetricType::kCounter: {
        CXLRT_ASSIGN_OR_RETURN(s.count, c.Int<uint64_t>("a value"));
        break;
      }
      case MetricType::kGauge: {
        CXLRT_ASSIGN_OR_RETURN(s.gauge, c.Int<double>("a value"));
        break;
      }
      case MetricType::kHistogram: {
        CXLRT_ASSIGN_OR_RETURN(s.hist.count, c.Int<uint64_t>("a histogram"));
        CXLRT_ASSIGN_OR_RETURN(s.hist.sum, c.Int<uint64_t>("a histogram"));
        CXLRT_ASSIGN_OR_RETURN(uint8_t nb, c.Int<uint8_t>("a histogram"));
        for (int i = 0; i < nb; ++i) {
          CXLRT_ASSIGN_OR_RETURN(uint8_t idx, c.Int<uint8_t>("a histogram"));
          CXLRT_ASSIGN_OR_RETURN(uint64_t v, c.Int<uint64_t>("a histogram"));
          if (idx >= runtime::Histogram::kBuckets) {
            return absl::DataLossError(
                absl::StrCat("metrics histogram ", s.name, " names bucket ", idx));
          }
          s.hist.buckets[idx] = v;
        }
        // A writer's count is its buckets' sum (runtime::Histogram::Read
        // takes it from the same loads), so a consistent snapshot never
        // has more in its buckets than its count.
        uint64_t in_buckets = 0;
        for (uint64_t b : s.hist.buckets) in_buckets += b;
        if (in_buckets > s.hist.count) {
          return absl::DataLossError(absl::StrCat("metrics histogram ", s.name, " holds ",
                                                  in_buckets,
                                                  " observations in its buckets but "
                                                  "counts ",
                                                  s.hist.count));
        }
        break;
      }
    }
    out.push_back(std::move(s));
  }
  if (!c.done()) {
    return absl::DataLossError(absl::StrCat("metrics blob of ", blob.size(),
                                            " bytes has bytes after its ", n, " samples"));
  }
  return out;
}

// --- Publisher ---

MetricsPublisher::MetricsPublisher(runtime::Pool& pool, runtime::Membership& membership,
                                   allocator::Allocator& alloc, const PublisherOptions& options)
    : pool_(pool),
      membership_(membership),
      alloc_(alloc),
      period_(options.period.value_or(absl::Milliseconds(kPublishMs.Get()))) {
  if (period_ > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

MetricsPublisher::~MetricsPublisher() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MetricsPublisher::Loop() {
  const auto period = absl::ToChronoNanoseconds(period_);
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_) {
    lock.unlock();
    absl::Status s = PublishNow();
    if (!s.ok() && !absl::IsAborted(s)) {
      CXLRT_LOG(kWarning) << "publishing metrics into " << pool_.name() << ": " << s;
    }
    lock.lock();
    stop_cv_.wait_for(lock, period, [this] { return stop_; });
  }
}

absl::StatusOr<PoolOffset> MetricsPublisher::Index() {
  if (index_ != 0) return index_;
  const uint64_t size = uint64_t{pool_.host_slots()} * kMetricsSlotStride;
  auto found = alloc_.Find(kMetricsBlockName);
  if (absl::IsNotFound(found.status())) {
    // The first host to publish makes it; another may race (kAlreadyExists).
    // Nobody zeroes it: each host writes only its own record, and a reader
    // ignores a record whose checksum or epoch is not right.
    auto made = alloc_.AllocateNamed(kMetricsBlockName, size);
    if (!made.ok() && !absl::IsAlreadyExists(made.status())) return made.status();
    found = alloc_.Find(kMetricsBlockName);
  }
  if (!found.ok()) return found.status();
  if (found->size < size) {
    return absl::DataLossError(absl::StrCat("the block ", kMetricsBlockName, " of ", pool_.name(),
                                            " is ", found->size, " bytes; ", pool_.host_slots(),
                                            " host records need ", size));
  }
  index_ = found->offset;
  return index_;
}

absl::Status MetricsPublisher::PublishNow() {
  // This host's samples: those of its slot (without the label: readers
  // label each area with its host), and the process's unslotted ones.
  const std::string me = absl::StrCat(membership_.slot());
  std::vector<Sample> mine;
  for (Sample& s : runtime::CollectMetrics()) {
    auto slot = std::find_if(s.labels.begin(), s.labels.end(),
                             [](const Label& l) { return l.name == "slot"; });
    if (slot != s.labels.end()) {
      if (slot->value != me) continue;
      s.labels.erase(slot);
    }
    mine.push_back(std::move(s));
  }
  const std::string blob = EncodeSamples(mine);
  std::lock_guard<std::mutex> lock(mu_);
  // Writes to the pool need the lease (docs/membership.md).
  CXLRT_RETURN_IF_ERROR(membership_.CheckLease());
  CXLRT_ASSIGN_OR_RETURN(PoolOffset index, Index());
  runtime::Coherence& c = pool_.coherence();
  const PoolOffset rec_off = index + uint64_t{membership_.slot()} * kMetricsSlotStride;
  PoolOffset old_area = 0;
  if (blob.size() > area_size_) {
    uint64_t size = kMinArea;
    while (size < blob.size() + blob.size() / 2) size *= 2;
    size = std::min(size, kMaxMetricsArea);
    if (blob.size() > size) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this process's metrics encode to ", blob.size(), " bytes, more than the ",
                       kMaxMetricsArea, " a host's metrics area may hold: not published"));
    }
    CXLRT_ASSIGN_OR_RETURN(PoolOffset area, alloc_.Allocate(size));
    old_area = area_;
    area_ = area;
    area_size_ = size;
  }
  if (version_ == 0) {
    // A previous incarnation of this slot may have left a higher version:
    // the version only grows, so start above it.
    version_ = c.LoadFlag(rec_off) | 1;
    version_ += 1;
  }
  // Odd: readers that see it, or see it change, retry.
  c.StoreFlag(rec_off, ++version_);
  c.Publish(area_, blob.data(), blob.size());
  MetricsSlotLayout r = {};
  r.epoch = membership_.epoch();
  r.area = area_;
  r.area_size = area_size_;
  r.blob_size = blob.size();
  r.published_unix_ns = static_cast<uint64_t>(UnixNs());
  r.blob_crc = runtime::Crc32c(blob.data(), blob.size());
  r.pid = static_cast<uint32_t>(getpid());
  r.period_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(period_));
  r.checksum = MetricsSlotChecksum(r);
  c.Publish(rec_off + 8, reinterpret_cast<const uint8_t*>(&r) + 8, sizeof(r) - 8);
  c.StoreFlag(rec_off, ++version_);  // even: consistent
  if (old_area != 0) (void)alloc_.Free(old_area);
  return absl::OkStatus();
}

// --- Reader ---

PoolMetricsReader::PoolMetricsReader(const runtime::Pool& pool) : pool_(pool) {}

void PoolMetricsReader::Observe() { (void)ObserveOnce(); }

bool PoolMetricsReader::ObserveOnce() {
  const int64_t now = MonoNs();
  bool all_moved = true;
  for (uint32_t i = 0; i < pool_.host_slots(); ++i) {
    auto r = pool_.ReadHost(i);
    if (!r.ok() || r->state == runtime::SlotState::kFree) {
      seen_.erase(i);
      continue;
    }
    auto it = seen_.find(i);
    if (it == seen_.end() || it->second.epoch != r->epoch) {
      seen_[i] = Seen{r->epoch, r->heartbeat, now, 0};
      if (r->state == runtime::SlotState::kAttached) all_moved = false;
      continue;
    }
    Seen& s = it->second;
    if (r->heartbeat != s.heartbeat) {
      s.heartbeat = r->heartbeat;
      s.changed_ns = now;
    }
    if (s.changed_ns == 0 && r->state == runtime::SlotState::kAttached) all_moved = false;
  }
  return all_moved;
}

absl::StatusOr<PoolMetrics> PoolMetricsReader::Read(absl::Duration observe) {
  const absl::Time until = absl::Now() + observe;
  while (!ObserveOnce() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  const int64_t now = MonoNs();
  const int64_t now_unix = UnixNs();
  runtime::Coherence& c = pool_.coherence();
  std::optional<runtime::RegionInfo> index;
  if (auto r = pool_.FindRegion(kMetricsBlockName); r.ok()) {
    if (r->size >= uint64_t{pool_.host_slots()} * kMetricsSlotStride) index = *r;
  } else if (!absl::IsNotFound(r.status())) {
    return r.status();
  }

  PoolMetrics out;
  out.metrics_block = index.has_value();
  uint32_t attached = 0, fenced = 0, alive = 0;
  for (uint32_t i = 0; i < pool_.host_slots(); ++i) {
    auto r = pool_.ReadHost(i);
    if (!r.ok()) return r.status();
    if (r->state == runtime::SlotState::kFree) continue;
    HostMetrics h;
    h.slot = i;
    h.state = r->state;
    h.hostname = r->hostname;
    h.pid = r->owner_current ? r->pid : r->owner_pid;
    const absl::Duration lease = absl::Milliseconds(r->lease_ms > 0 ? r->lease_ms : 1);
    if (auto it = seen_.find(i); it != seen_.end()) {
      const int64_t since =
          it->second.changed_ns != 0 ? it->second.changed_ns : it->second.first_ns;
      h.heartbeat_age = absl::Nanoseconds(now - since);
      h.alive = r->state == runtime::SlotState::kAttached && r->owner_current &&
                it->second.changed_ns != 0 && h.heartbeat_age <= runtime::DeadAfter(lease);
    }
    h.lease_margin = runtime::DeadAfter(lease) - h.heartbeat_age;
    attached += r->state == runtime::SlotState::kAttached;
    fenced += r->state == runtime::SlotState::kFenced;
    alive += h.alive;
    // Its area: only a current incarnation's record is believed.
    if (!index) {
      h.problem = "the pool has no metrics block (no host has published)";
    } else if (!r->owner_current || r->state != runtime::SlotState::kAttached) {
      h.problem = "not attached with a current owner line";
    } else {
      const PoolOffset rec_off = index->offset + uint64_t{i} * kMetricsSlotStride;
      for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
        const uint64_t v1 = c.LoadFlag(rec_off);
        if (v1 == 0) {
          h.problem = "has not published";
          break;
        }
        if (v1 % 2 == 1) {
          absl::SleepFor(absl::Microseconds(50));
          h.problem = "its record stayed busy";
          continue;
        }
        MetricsSlotLayout rec;
        c.Fetch(&rec, rec_off, sizeof(rec));
        if (rec.checksum != MetricsSlotChecksum(rec) || rec.epoch != r->epoch) {
          h.problem = rec.epoch != r->epoch ? "its record is of an earlier incarnation"
                                            : "its record's checksum is wrong";
          if (c.LoadFlag(rec_off) != v1) continue;
          break;
        }
        // Bounds before use: a corrupt record never reads outside the pool.
        if (rec.area < pool_.header().heap_offset || rec.area_size > kMaxMetricsArea ||
            rec.area > pool_.size() - rec.area_size || rec.blob_size > rec.area_size) {
          h.problem = absl::StrCat(
              "its record names area [0x", absl::Hex(rec.area), ", +", rec.area_size, ") holding ",
              rec.blob_size, " bytes: outside the heap, or larger than a metrics area may be");
          break;
        }
        std::string blob(rec.blob_size, '\0');
        c.Fetch(blob.data(), rec.area, blob.size());
        if (c.LoadFlag(rec_off) != v1) continue;  // rewritten meanwhile
        if (runtime::Crc32c(blob.data(), blob.size()) != rec.blob_crc) {
          // The version stood still over the read (above): corrupt, and
          // rereading will not mend it.
          h.problem = "its area's checksum is wrong";
          break;
        }
        auto samples = DecodeSamples(blob);
        if (!samples.ok()) {
          h.problem = std::string(samples.status().message());
          break;
        }
        h.samples = *std::move(samples);
        h.published = true;
        h.published_unix_ns = static_cast<int64_t>(rec.published_unix_ns);
        h.published_age = absl::Nanoseconds(now_unix - h.published_unix_ns);
        h.problem.clear();
        break;
      }
    }
    out.hosts.push_back(std::move(h));
  }

  // The pool's gauges, then every host's samples labelled with its slot.
  auto gauge = [&](const char* name, const char* unit, const char* help, Labels l, double v) {
    out.samples.push_back(runtime::GaugeSample({name, unit, help}, std::move(l), v));
  };
  gauge("pool.hosts", "hosts", "Host slots in use, by state (attached, fenced).",
        {{"state", "attached"}}, attached);
  gauge("pool.hosts", "hosts", "Host slots in use, by state (attached, fenced).",
        {{"state", "fenced"}}, fenced);
  gauge("pool.hosts_alive", "hosts",
        "Attached hosts whose heartbeat moved within their lease, as this exporter saw.", {},
        alive);
  for (const HostMetrics& h : out.hosts) {
    const std::string slot = absl::StrCat(h.slot);
    gauge("pool.host_info", "", "One per host slot in use, labelled with its name and pid.",
          {{"host", slot},
           {"hostname", h.hostname},
           {"pid", absl::StrCat(h.pid)},
           {"state", h.state == runtime::SlotState::kFenced ? "fenced" : "attached"}},
          1);
    gauge("pool.host_alive", "", "1 when the host's heartbeat moved within its lease.",
          {{"host", slot}}, h.alive ? 1 : 0);
    gauge("pool.host_heartbeat_age", "ns",
          "Since this exporter saw the host's heartbeat move (since it first looked, when it "
          "has not).",
          {{"host", slot}}, static_cast<double>(absl::ToInt64Nanoseconds(h.heartbeat_age)));
    gauge("pool.host_lease_margin", "ns",
          "Time left before survivors may declare the host dead: DeadAfter(lease) - heartbeat "
          "age (negative: past it).",
          {{"host", slot}}, static_cast<double>(absl::ToInt64Nanoseconds(h.lease_margin)));
    gauge("pool.host_metrics_published", "", "1 when the host's metrics area was read.",
          {{"host", slot}}, h.published ? 1 : 0);
    if (h.published) {
      gauge("pool.host_metrics_age", "ns",
            "Age of the host's published metrics, by its wall clock against this exporter's.",
            {{"host", slot}}, static_cast<double>(absl::ToInt64Nanoseconds(h.published_age)));
    }
  }
  if (allocator::HasAllocator(pool_)) {
    if (auto st = allocator::ReadStats(pool_); st.ok()) {
      for (const allocator::HostStats& a : st->hosts) {
        gauge("allocator.arena_bytes_in_use", "bytes",
              "Bytes held by callers in each arena, as the arena last published them (arenas "
              "of departed hosts included).",
              {{"host", absl::StrCat(a.slot)}}, static_cast<double>(a.bytes_in_use));
      }
      gauge("allocator.free_bytes", "bytes", "Free bytes of the pool's heap.", {},
            static_cast<double>(st->free_bytes));
    }
  }
  for (const HostMetrics& h : out.hosts) {
    for (Sample s : h.samples) {
      s.labels.insert(s.labels.begin(), Label{"host", absl::StrCat(h.slot)});
      out.samples.push_back(std::move(s));
    }
  }
  return out;
}

absl::Duration FirstReadWindow(const runtime::Pool& pool) {
  uint32_t longest = 10;
  for (uint32_t i = 0; i < pool.host_slots(); ++i) {
    auto r = pool.ReadHost(i);
    if (r.ok() && r->owner_current && r->state == runtime::SlotState::kAttached) {
      longest = std::max(longest, std::min(r->heartbeat_ms, runtime::kMaxSampledHeartbeatMs));
    }
  }
  return absl::Milliseconds(2 * longest);
}

std::string PoolPrometheusText(const PoolMetrics& m) { return runtime::PrometheusText(m.samples); }

}  // namespace cxlrt::metrics
