// The /metrics endpoint: a small HTTP/1.1 server of its own on its own port, answering
// GET /metrics with a render function's text in the Prometheus exposition format. Kept off
// the gRPC port so that scrapers and probes never compete with Compress streams.
//
// One thread multiplexes every connection with poll(2) over non-blocking sockets (plain or
// TLS), so no client, however slow or half-open, holds anything another needs: each
// connection must deliver a whole request and take its whole response within
// request_timeout of its accept or previous response, or it is closed; past
// max_connections the oldest connection is closed to make room for a new one.
// Thread-safe: Stop() may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "service/metrics_tls.h"

namespace centroidkv::service {

struct MetricsHttpLimits {
  int max_connections = 512;
  std::chrono::milliseconds request_timeout{2000};
  int max_requests_per_connection = 16;  // then the connection is closed (keep-alive bound)
  size_t max_request_bytes = 8192;       // request line and headers; more: 431, closed
};

class MetricsHttpServer {
 public:
  // Listens on `address` ("HOST:PORT", port 0 picks a free one; "[::]:PORT" for IPv6) and
  // serves render() at /metrics, over HTTPS when `tls` is given (service/metrics_tls.h).
  // render() runs on the server's thread. INVALID_ARGUMENT naming metrics_listen for an
  // address that is not HOST:PORT; UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::function<std::string()> render,
      const std::optional<MetricsTlsFiles>& tls = std::nullopt,
      const MetricsHttpLimits& limits = {});
  ~MetricsHttpServer();

  int port() const { return port_; }
  // Closes the port and every connection, and waits for the serving thread. Idempotent.
  void Stop();

 private:
  class Loop;
  MetricsHttpServer() = default;

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace centroidkv::service
