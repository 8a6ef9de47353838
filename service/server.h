// A running CentroidKV server: the gRPC server with the CentroidKV service, the standard
// health service and server reflection, the /metrics endpoint, TLS / tokens / per-caller
// limits (service/security/), and graceful shutdown. Construct with Start().
// Thread-safe: Shutdown() may be called from any thread (e.g. a signal watcher), once.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "service/centroidkv_service.h"
#include "service/metrics_http.h"
#include "service/security/unix_peer_listener.h"
#include "service/server_options.h"
#include "service/service_context.h"
#include "service/stream_watchdog.h"

namespace centroidkv::service {

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  // The port actually bound (useful with "127.0.0.1:0"); 0 for unix sockets.
  int port() const { return port_; }
  // The /metrics HTTP port actually bound; 0 when metrics are off.
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : 0; }
  // A target a client can dial: "127.0.0.1:PORT" or "unix:///path".
  std::string target() const;
  const ServiceContext& context() const { return *context_; }

  // Re-reads --auth-tokens-file (SIGHUP): removed tokens are refused from the next call
  // on. On error (unreadable, malformed) the previous tokens stay in force.
  absl::Status ReloadTokens();

  // Graceful shutdown: health goes NOT_SERVING, new jobs are refused with UNAVAILABLE,
  // jobs in flight get until the grace period to finish, then remaining streams are
  // cancelled and the pool is drained. /metrics answers until the end. Idempotent.
  void Shutdown();
  // Blocks until the gRPC server has shut down.
  void Wait();

 private:
  Server() = default;

  std::unique_ptr<ServiceContext> context_;
  std::unique_ptr<CentroidKVService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // null when metrics are off
  std::unique_ptr<UnixPeerListener> peer_listener_;  // only with --allow-uids
  std::unique_ptr<StreamWatchdog> watchdog_;  // stopped before the streams' context goes
  std::string listen_address_;
  int port_ = 0;
  std::once_flag shutdown_once_;
};

}  // namespace centroidkv::service
