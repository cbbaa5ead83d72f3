// Serves metrics over HTTP, as a Prometheus server scrapes them: GET
// /metrics answers the text format (version 0.0.4), GET /health "ok" (200)
// or why not (503), anything else 404. cpp-httplib from Debian, its own
// threads; nothing else of cxlrt serves HTTP.
//
// Thread-safety: the callbacks run on the server's threads, one request at
// a time (a scrape is rare and the readers are not reentrant).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace cxlrt::metrics {

class MetricsHttpServer {
 public:
  using TextFn = std::function<absl::StatusOr<std::string>()>;
  using HealthFn = std::function<absl::Status()>;

  // Listens on `address`:`port` (0: a free port; see port()). kUnavailable
  // when it cannot bind (the message names the address and port).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                  int port, TextFn metrics,
                                                                  HealthFn health);
  // Stops listening and joins the server's thread.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::mutex mu_;  // one request at a time
  TextFn metrics_;
  HealthFn health_;
  int port_ = 0;
  std::thread thread_;
};

// Serves this process's own metrics (the registry) when CXLRT_METRICS_PORT
// is set (on CXLRT_METRICS_ADDR). The server is made once per process, by
// the first caller (cxlrt::Host::Open, the Python Host, which log an error
// and go on without it); later calls return OK. kUnavailable when the port
// cannot be had (another process of the machine has it).
absl::Status ServeProcessMetricsFromEnvironment();

}  // namespace cxlrt::metrics
