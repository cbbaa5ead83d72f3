// `cxlrt metrics` and `cxlrt serve-metrics`: the pool-wide metrics
// (cxlrt/metrics/pool_metrics.h) in the Prometheus text format, printed
// once or served over HTTP. Neither attaches to the pool.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/metrics/http_exporter.h"
#include "cxlrt/metrics/pool_metrics.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/uri.h"
#include "tools/commands.h"

namespace cxlrt::tools {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

}  // namespace

int Metrics(const std::string& uri) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) {
    std::fprintf(stderr, "cxlrt metrics: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  metrics::PoolMetricsReader reader(**pool);
  auto m = reader.Read(metrics::FirstReadWindow(**pool));
  if (!m.ok()) {
    std::fprintf(stderr, "cxlrt metrics: %s: %s\n", uri.c_str(),
                 std::string(m.status().message()).c_str());
    return 1;
  }
  const std::string text = metrics::PoolPrometheusText(*m);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int ServeMetrics(const std::string& uri, const std::string& address, int port, double seconds) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) {
    std::fprintf(stderr, "cxlrt serve-metrics: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  // One reader, watched between scrapes by a thread of its own, so that a
  // scrape answers at once with heartbeat ages measured all along.
  std::mutex mu;
  metrics::PoolMetricsReader reader(**pool);
  // The URI `still_there` opens at every scrape: without prefaulting (its
  // page tables would be mapped for the whole pool each time) or a model.
  std::string probe_uri = uri;
  if (auto parsed = runtime::ParsePoolUri(uri); parsed.ok()) {
    parsed->prefault = false;
    parsed->model.reset();
    parsed->latency_ns.reset();
    parsed->bw_gbps.reset();
    probe_uri = parsed->ToString();
  }
  // Whether the pool is still there: it reads, its header is what Open
  // validated, and its URI still opens this pool (a pool destroyed, or made
  // anew under its name, keeps this mapping alive but is gone: its hosts
  // are not the ones under that name now). Called under `mu`.
  auto still_there = [&]() -> absl::Status {
    CXLRT_RETURN_IF_ERROR((*pool)->Check());
    auto again = runtime::Pool::Open(probe_uri);
    if (!again.ok()) {
      return absl::UnavailableError(
          absl::StrCat(uri, " no longer opens: ", again.status().message()));
    }
    if ((*again)->header().creation_id != (*pool)->header().creation_id) {
      return absl::UnavailableError(
          absl::StrCat(uri, " is now another pool (made anew after this one was destroyed)"));
    }
    return absl::OkStatus();
  };
  auto server = metrics::MetricsHttpServer::Start(
      address, port,
      [&]() -> absl::StatusOr<std::string> {
        std::lock_guard<std::mutex> lock(mu);
        // A gone pool's metrics are not served as if current: the scrape
        // fails (Prometheus's `up` goes to 0) rather than report the old
        // mapping's hosts under the name.
        CXLRT_RETURN_IF_ERROR(still_there());
        auto m = reader.Read();
        if (!m.ok()) return m.status();
        return metrics::PoolPrometheusText(*m);
      },
      [&]() -> absl::Status {
        std::lock_guard<std::mutex> lock(mu);
        return still_there();
      });
  if (!server.ok()) {
    std::fprintf(stderr, "cxlrt serve-metrics: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("serving the metrics of %s on http://%s:%d/metrics (and /health)\n", uri.c_str(),
              address.c_str(), (*server)->port());
  std::fflush(stdout);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  const absl::Time end =
      seconds > 0 ? absl::Now() + absl::Seconds(seconds) : absl::InfiniteFuture();
  while (!g_stop.load() && absl::Now() < end) {
    {
      std::lock_guard<std::mutex> lock(mu);
      reader.Observe();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return 0;
}

}  // namespace cxlrt::tools
