// Bindings of metrics (docs/metrics.md): Pool.metrics(), the whole pool's
// as every host published them, and process_metrics(), this process's own;
// each as Prometheus text or as a dict for Python readers (the framework
// connectors, `cxlrt top`).
#include "cxlrt/runtime/metrics.h"

#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <vector>

#include "cxlrt/metrics/pool_metrics.h"
#include "cxlrt/runtime/prometheus.h"
#include "python/csrc/bindings.h"
#include "python/csrc/pool.h"

namespace cxlrt::python {
namespace {

py::dict SampleDict(const runtime::Sample& s) {
  py::dict d;
  d["name"] = runtime::PrometheusName(s);
  d["metric"] = s.name;
  d["type"] = runtime::MetricTypeName(s.type);
  d["unit"] = s.unit;
  py::dict labels;
  // Label values come from callers and other hosts' areas: any bytes.
  for (const runtime::Label& l : s.labels) {
    labels[py::str(runtime::PrintableUtf8(l.name))] = py::str(runtime::PrintableUtf8(l.value));
  }
  d["labels"] = labels;
  const double div = s.unit == "ns" ? 1e9 : 1.0;  // seconds, as exposed
  switch (s.type) {
    case runtime::MetricType::kCounter:
      if (div == 1.0) {
        d["value"] = s.count;
      } else {
        d["value"] = static_cast<double>(s.count) / div;
      }
      break;
    case runtime::MetricType::kGauge:
      d["value"] = s.gauge / div;
      break;
    case runtime::MetricType::kHistogram: {
      d["count"] = s.hist.count;
      d["sum"] = static_cast<double>(s.hist.sum) / div;
      // Upper bound (inclusive, as Prometheus's le, in the exposed unit) -> count in the bucket.
      py::list buckets;
      for (size_t i = 0; i < s.hist.buckets.size(); ++i) {
        if (s.hist.buckets[i] == 0) continue;
        buckets.append(
            py::make_tuple(std::ldexp(1.0, static_cast<int>(i)) / div, s.hist.buckets[i]));
      }
      d["buckets"] = buckets;
      break;
    }
  }
  return d;
}

py::object Format(const std::vector<runtime::Sample>& samples, const std::string& format,
                  py::list* hosts) {
  if (format == "text") return py::str(runtime::PrometheusText(samples));
  if (format != "dict") {
    throw py::value_error("format must be 'dict' or 'text', not '" + format + "'");
  }
  py::dict out;
  py::list list;
  for (const runtime::Sample& s : samples) list.append(SampleDict(s));
  out["samples"] = list;
  if (hosts != nullptr) out["hosts"] = *hosts;
  return out;
}

}  // namespace

py::object PoolMetrics(const PyPool& p, const std::string& format) {
  absl::StatusOr<metrics::PoolMetrics> m;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(p.metrics->mu);
    absl::Duration observe = absl::ZeroDuration();
    if (!p.metrics->reader) {
      p.metrics->reader = std::make_unique<metrics::PoolMetricsReader>(*p.pool);
      observe = metrics::FirstReadWindow(*p.pool);
    }
    m = p.metrics->reader->Read(observe);
  }
  Check(m.status());
  py::list hosts;
  for (const metrics::HostMetrics& h : m->hosts) {
    py::dict d;
    d["slot"] = h.slot;
    d["state"] = h.state == runtime::SlotState::kFenced ? "fenced" : "attached";
    d["hostname"] = h.hostname;
    d["pid"] = h.pid;
    d["alive"] = h.alive;
    d["heartbeat_age_s"] = absl::ToDoubleSeconds(h.heartbeat_age);
    d["lease_margin_s"] = absl::ToDoubleSeconds(h.lease_margin);
    d["published"] = h.published;
    d["problem"] = h.problem;
    hosts.append(d);
  }
  return Format(m->samples, format, &hosts);
}

void BindMetrics(py::module_& m) {
  m.def(
      "process_metrics",
      [](const std::string& format) { return Format(runtime::CollectMetrics(), format, nullptr); },
      py::arg("format") = "dict",
      "This process's metrics (every host it opened): a dict {'samples': [...]}, or the "
      "Prometheus text with format='text'.");
}

}  // namespace cxlrt::python
