#include "cxlrt/metrics/http_exporter.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/metrics.h"
#include "cxlrt/runtime/prometheus.h"

namespace cxlrt::metrics {
namespace {

const runtime::Knob<uint32_t> kMetricsPort(
    {"CXLRT_METRICS_PORT", "0",
     "A process that opens a host (cxlrt::Host, the Python Host) serves its own metrics on this "
     "port at /metrics (0: none)."},
    0, runtime::UintIn(0, 65535));
const runtime::Knob<std::string> kMetricsAddr(
    {"CXLRT_METRICS_ADDR", "127.0.0.1",
     "The address CXLRT_METRICS_PORT's server listens on (0.0.0.0: every interface)."},
    "127.0.0.1", runtime::AnyText());

constexpr char kPrometheusType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, int port, TextFn metrics, HealthFn health) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->metrics_ = std::move(metrics);
  s->health_ = std::move(health);
  s->server_ = std::make_unique<httplib::Server>();
  MetricsHttpServer* self = s.get();
  // GET (and HEAD) only: any other method is told so (405 with Allow), not
  // left to a default answer.
  s->server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD")
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content(absl::StrCat(req.method, " is not served here: GET /metrics or /health\n"),
                    "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  s->server_->Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(self->mu_);
    absl::StatusOr<std::string> text = self->metrics_();
    if (text.ok()) {
      res.set_content(*text, kPrometheusType);
    } else {
      res.status = 500;
      res.set_content(absl::StrCat(text.status().ToString(), "\n"), "text/plain");
    }
  });
  s->server_->Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(self->mu_);
    absl::Status h = self->health_ ? self->health_() : absl::OkStatus();
    res.status = h.ok() ? 200 : 503;
    res.set_content(h.ok() ? "ok\n" : absl::StrCat(h.ToString(), "\n"), "text/plain");
  });
  if (port == 0) {
    s->port_ = s->server_->bind_to_any_port(address);
  } else {
    s->port_ = s->server_->bind_to_port(address, port) ? port : -1;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ":", port,
                                               " for metrics (in use, or no such address)"));
  }
  s->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::Status ServeProcessMetricsFromEnvironment() {
  static std::mutex mu;
  static MetricsHttpServer* server = nullptr;  // lives for the process
  std::lock_guard<std::mutex> lock(mu);
  if (server != nullptr || kMetricsPort.Get() == 0) return absl::OkStatus();
  auto s = MetricsHttpServer::Start(
      kMetricsAddr.Get(), static_cast<int>(kMetricsPort.Get()),
      []() -> absl::StatusOr<std::string> {
        return runtime::PrometheusText(runtime::CollectMetrics());
      },
      nullptr);
  if (!s.ok()) return s.status();
  CXLRT_LOG(kInfo) << "serving this process's metrics on " << kMetricsAddr.Get() << ":"
                   << (*s)->port() << "/metrics";
  server = s->release();
  return absl::OkStatus();
}

}  // namespace cxlrt::metrics
