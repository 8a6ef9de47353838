// The /metrics endpoint: a small embedded HTTP server (cpp-httplib, Debian's
// libcpp-httplib-dev) on its own port, answering GET /metrics with a render function's
// text in the Prometheus exposition format. Kept off the gRPC port so that scrapers and
// probes never compete with Compress streams.
// Thread-safe: the server runs on its own threads until Stop() or destruction.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "service/metrics_tls.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace centroidkv::service {

class MetricsHttpServer {
 public:
  // Listens on `address` ("HOST:PORT", port 0 picks a free one; "[::]:PORT" for IPv6) and
  // serves render() at /metrics, over HTTPS when `tls` is given (service/metrics_tls.h).
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::function<std::string()> render,
      const std::optional<MetricsTlsFiles>& tls = std::nullopt);
  ~MetricsHttpServer();

  int port() const { return port_; }
  // Stops listening and waits for the serving thread. Idempotent.
  void Stop();

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace centroidkv::service
