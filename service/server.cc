// Server assembly (credentials, callers, builder, health, reflection, message limits,
// /metrics, the --allow-uids unix listener) and graceful shutdown.
#include "service/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "centroidkv/common/tsan_annotations.h"
#include "service/listen_address.h"
#include "service/metrics_tls.h"
#include "service/security/server_credentials.h"
#include "service/security/token_table.h"

namespace centroidkv::service {
namespace {
constexpr char kServiceName[] = "centroidkv.v1.CentroidKV";
constexpr std::chrono::milliseconds kLinger{300};
}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (absl::Status status = CheckUnixPathNotServed(options.listen_address); !status.ok()) {
    return status;
  }
  std::unique_ptr<Server> server(new Server());
  server->context_ = std::make_unique<ServiceContext>(options);
  server->service_ = std::make_unique<CentroidKVService>(server->context_.get());
  server->listen_address_ = options.listen_address;
  const SecurityOptions& security = options.security;
  const bool unix_listener = absl::StartsWith(options.listen_address, "unix:");
  if (!security.allow_uids.empty() && !unix_listener) {
    return absl::InvalidArgumentError(
        "allow_uids: peer uids can only be checked on a unix:// listener");
  }
  if (!security.allow_uids.empty() && UsesTls(security)) {
    return absl::InvalidArgumentError(
        "allow_uids: a unix listener with --allow-uids serves plaintext; drop --tls-cert");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(security);
  if (!credentials.ok()) return credentials.status();
  if (!security.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenTable>> tokens =
        TokenTable::Load(security.auth_tokens_file);
    if (!tokens.ok()) return tokens.status();
    server->context_->callers.SetTokens(*std::move(tokens));
  }

  // /metrics first: if its port is taken, fail before the gRPC port opens at all.
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::optional<MetricsTlsFiles>> metrics_tls = MetricsTlsFor(options);
    if (!metrics_tls.ok()) return metrics_tls.status();
    ServiceContext* context = server->context_.get();
    auto metrics = MetricsHttpServer::Start(
        options.metrics_listen, [context] { return context->metrics.Render(); }, *metrics_tls);
    if (!metrics.ok()) return metrics.status();
    server->metrics_http_ = std::move(*metrics);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // With --allow-uids, or shared memory on a unix socket, the server accepts on the unix
  // socket itself (UnixPeerListener) to read each peer's SO_PEERCRED.
  const bool check_peers =
      !security.allow_uids.empty() ||
      (options.shared_memory.enabled && unix_listener && !UsesTls(security));
  if (!check_peers) {
    builder.AddListeningPort(options.listen_address, *credentials, &server->port_);
  }
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive: notice dead peers on long-lived worker streams.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  // Transport memory (ServerOptions): one quota, bounded streams and windows.
  grpc::ResourceQuota quota("centroidkv-transport");
  quota.Resize(static_cast<size_t>(options.max_transport_bytes));
  builder.SetResourceQuota(quota);
  // (No GRPC_ARG_MAX_CONCURRENT_STREAMS: with gRPC 1.51's builder it made every message
  // over the stream limit's value in bytes fail as "larger than max"; max_streams bounds
  // the streams instead.)
  // BDP probing off: windows stay at stream_window_bytes. With it on, windows grew under
  // load until the transport quota refused healthy streams (RST_STREAM ENHANCE_YOUR_CALM:
  // 74 RESOURCE_EXHAUSTED in a 15 s bench/soak.sh); off costs little throughput against
  // more than it gains (docs/results/service-bench.md: the server without these bounds moved
  // ~15% more through a single client's streams).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
  // No SO_REUSEPORT (gRPC's default on Linux): a second server on a bound port must fail
  // to start instead of sharing the port and splitting the connections between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot listen on '", options.listen_address,
                     "' (address in use, bad address, or no permission)"));
  }
  if (check_peers) {
    std::string path = options.listen_address.substr(std::string("unix:").size());
    if (absl::StartsWith(path, "//")) path = path.substr(2);
    ServiceMetrics* metrics = &server->context_->metrics;
    auto listener = UnixPeerListener::Start(
        path, security.allow_uids, server->grpc_server_.get(), [metrics](uint32_t uid) {
          metrics->CallerRejected(absl::StrCat("uid:", uid), "uid_not_allowed");
        });
    if (!listener.ok()) {
      server->grpc_server_->Shutdown();
      return listener.status();
    }
    server->peer_listener_ = std::move(*listener);
    UnixPeerListener* raw = server->peer_listener_.get();
    if (!security.allow_uids.empty()) {
      server->context_->callers.SetPeerUidLookup(
          [raw](const std::string& peer) { return raw->UidOfPeer(peer); });
    }
    server->context_->regions.SetPeerLookup(
        [raw](const std::string& peer) { return raw->CredentialsOfPeer(peer); });
  }
  MemoryBudget* budget = &server->context_->budget;
  server->watchdog_ = std::make_unique<StreamWatchdog>(
      &server->context_->streams,
      StreamWatchdog::TickFor(options.incomplete_job_timeout, options.idle_stream_timeout),
      [budget] { return budget->HasWaiters(); });
  grpc::HealthCheckServiceInterface* health = server->grpc_server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  return server;
}

Server::~Server() { Shutdown(); }

absl::Status Server::ReloadTokens() { return context_->callers.ReloadTokens(); }

std::string Server::target() const {
  if (absl::StartsWith(listen_address_, "unix:")) return listen_address_;
  return absl::StrCat("127.0.0.1:", port_);
}

void Server::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (grpc_server_ == nullptr) return;
    if (peer_listener_ != nullptr) peer_listener_->Stop();  // no new connections
    grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
    health->SetServingStatus(kServiceName, false);
    health->SetServingStatus(false);
    context_->draining.store(true);
    context_->streams.DrainAll();
    const auto start = std::chrono::steady_clock::now();
    const auto grace = context_->options.grace_period;
    // Let every stream finish its jobs and end by itself, then linger briefly: closing a
    // connection while its client is still reading (and acknowledging with window
    // updates) resets it, and the client would lose the last results.
    const bool all_ended = context_->streams.WaitEmpty(grace);
    if (all_ended) {
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(kLinger, grace));
    }
    // Stop accepting calls, cancel what remains at the end of the grace period. Once every
    // stream has ended nothing is left to wait for: at once, since a graceful close would
    // wait seconds on idle connections whose clients poll nothing (gRPC's GOAWAY ping).
    const auto left = grace - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start);
    grpc_server_->Shutdown(
        std::chrono::system_clock::now() +
        (all_ended ? std::chrono::milliseconds(0) : std::max(left, std::chrono::milliseconds(0))));
    TsanHappensAfter(context_.get());  // every reactor's OnDone has returned (its comment)
    // Every stream has ended (gRPC cancelled the rest, which cancelled their jobs); jobs
    // still computing belong to nobody. Cancel any left and wait: the engines check the flag
    // inside their loops, so this takes well under a second, and nothing a job touches
    // (metrics, pools, the engines) is destroyed while it runs.
    context_->jobs.CancelAll();
    context_->executor->WaitIdle(std::chrono::minutes(10));
    watchdog_.reset();
    if (metrics_http_ != nullptr) metrics_http_->Stop();
  });
}

void Server::Wait() {
  if (grpc_server_ != nullptr) grpc_server_->Wait();
}

}  // namespace centroidkv::service
