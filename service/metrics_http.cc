// MetricsHttpServer: cpp-httplib serving /metrics on its own port.
#include "service/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace centroidkv::service {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// Each connection holds a thread while httplib reads its request, so slow or half-open
// connections (a scanner, a stuck client) could starve the scrapes with a small pool: the
// pool is larger than any sane number of concurrent scrapers, and every read, write and
// idle keep-alive times out soon (a connection holds a thread for at most ~kIoTimeout).
constexpr int kHttpThreads = 32;
constexpr time_t kIoTimeoutSeconds = 2;
constexpr size_t kKeepAliveRequests = 16;

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::function<std::string()> render,
    const std::optional<MetricsTlsFiles>& tls) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  if (tls.has_value()) {
    absl::StatusOr<std::unique_ptr<httplib::Server>> https = MakeTlsMetricsHttpServer(*tls);
    if (!https.ok()) return https.status();
    server->http_ = *std::move(https);
  } else {
    server->http_ = std::make_unique<httplib::Server>();
  }
  server->http_->new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // server share a busy port silently and split the scrapes between the two.
  server->http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->http_->set_read_timeout(kIoTimeoutSeconds, 0);
  server->http_->set_write_timeout(kIoTimeoutSeconds, 0);
  server->http_->set_keep_alive_timeout(kIoTimeoutSeconds);
  server->http_->set_keep_alive_max_count(kKeepAliveRequests);
  server->http_->set_payload_max_length(1 << 16);
  server->http_->Get("/metrics", [render = std::move(render)](const httplib::Request&,
                                                             httplib::Response& response) {
    response.set_content(render(), kContentType);
  });
  const bool bound = port == 0
                         ? (port = server->http_->bind_to_any_port(host)) > 0
                         : server->http_->bind_to_port(host, port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat(
        "metrics_listen: cannot listen on '", address, "' (address in use or bad address)"));
  }
  server->port_ = port;
  httplib::Server* http = server->http_.get();
  server->thread_ = std::thread([http] { http->listen_after_bind(); });
  // httplib's stop() does nothing before the listening loop runs: wait for it.
  for (int i = 0; i < 5000 && !http->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace centroidkv::service
