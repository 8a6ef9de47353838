// MetricsHttpServer: one poll(2) thread serving /metrics over non-blocking sockets, plain
// or TLS, with a deadline per request and a bound on the connections.
#include "service/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace centroidkv::service {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// What one read or write on a connection came to.
enum class Io { kDone, kWantRead, kWantWrite, kClosed, kFailed };

struct Connection {
  int fd = -1;
  SSL* ssl = nullptr;  // null: plain HTTP
  std::string in;      // bytes read and not yet answered
  std::string out;     // the response being written
  size_t sent = 0;     // of `out`
  int served = 0;      // responses written in full
  bool close_after = false;
  bool peer_closed = false;
  short events = POLLIN;  // what the last read or write waits for
  Clock::time_point deadline;

  ~Connection() {
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) close(fd);
  }
};

Io TlsResult(SSL* ssl, int result) {
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    default:
      ERR_clear_error();  // the queue is per thread: leave it empty for the next connection
      return Io::kFailed;
  }
}

// Reads what is there into `buffer`; *bytes the count when kDone.
Io Receive(Connection& c, char* buffer, size_t size, size_t* bytes) {
  if (c.ssl != nullptr) {
    const int got = SSL_read(c.ssl, buffer, static_cast<int>(size));
    if (got > 0) {
      *bytes = static_cast<size_t>(got);
      return Io::kDone;
    }
    return TlsResult(c.ssl, got);
  }
  const ssize_t got = recv(c.fd, buffer, size, 0);
  if (got > 0) {
    *bytes = static_cast<size_t>(got);
    return Io::kDone;
  }
  if (got == 0) return Io::kClosed;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Io::kWantRead;
  return Io::kFailed;
}

Io Send(Connection& c, const char* data, size_t size, size_t* bytes) {
  if (c.ssl != nullptr) {
    const int put = SSL_write(c.ssl, data, static_cast<int>(size));
    if (put > 0) {
      *bytes = static_cast<size_t>(put);
      return Io::kDone;
    }
    return TlsResult(c.ssl, put);
  }
  const ssize_t put = send(c.fd, data, size, MSG_NOSIGNAL);
  if (put >= 0) {
    *bytes = static_cast<size_t>(put);
    return Io::kDone;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Io::kWantWrite;
  return Io::kFailed;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, bool with_body, bool close_after,
                     absl::string_view extra_header = "") {
  std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\n", extra_header,
                   close_after ? "Connection: close\r\n" : "", "\r\n");
  if (with_body) absl::StrAppend(&response, body);
  return response;
}

// Binds and listens on HOST:PORT; the socket, or an error.
absl::StatusOr<int> Listen(const std::string& address, int* port_out) {
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
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const auto unavailable = [&address] {
    return absl::UnavailableError(absl::StrCat(
        "metrics_listen: cannot listen on '", address, "' (address in use or bad address)"));
  };
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return unavailable();
  }
  int listening = -1;
  for (addrinfo* a = found; a != nullptr && listening < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: SO_REUSEPORT would let a second server share a busy port silently
    // and split the scrapes between the two.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listening = fd;
    } else {
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listening < 0) return unavailable();
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(listening, reinterpret_cast<sockaddr*>(&bound), &length);
  *port_out = bound.ss_family == AF_INET6
                  ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                  : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return listening;
}

}  // namespace

class MetricsHttpServer::Loop {
 public:
  Loop(int listening, std::function<std::string()> render,
       std::unique_ptr<MetricsTlsContext> tls, const MetricsHttpLimits& limits)
      : listening_(listening),
        wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        render_(std::move(render)),
        tls_(std::move(tls)),
        limits_(limits) {}
  ~Loop() {
    connections_.clear();
    if (listening_ >= 0) close(listening_);
    if (wake_ >= 0) close(wake_);
  }

  bool ok() const { return wake_ >= 0; }

  void Run() {
    // OpenSSL writes to its sockets with write(2): a peer gone away must not raise SIGPIPE.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    std::vector<pollfd> polled;
    while (!stopping_.load()) {
      polled.clear();
      polled.push_back({wake_, POLLIN, 0});
      polled.push_back({listening_, POLLIN, 0});
      Clock::time_point next = Clock::now() + std::chrono::seconds(1);
      for (const auto& c : connections_) {
        polled.push_back({c->fd, c->events, 0});
        next = std::min(next, c->deadline);
      }
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
      const int ready = poll(polled.data(), polled.size(),
                             static_cast<int>(std::max<int64_t>(0, wait.count())));
      if (ready < 0 && errno != EINTR) break;
      if (stopping_.load()) break;
      // Connections first (the indices of `polled` follow connections_ until it changes).
      for (size_t i = 0; i < connections_.size(); ++i) {
        const short revents = polled[i + 2].revents;
        if (revents == 0) continue;
        if (!Pump(*connections_[i])) connections_[i].reset();
      }
      std::erase(connections_, nullptr);
      if ((polled[1].revents & POLLIN) != 0) AcceptAll();
      const Clock::time_point now = Clock::now();
      std::erase_if(connections_, [now](const auto& c) { return c->deadline <= now; });
    }
    connections_.clear();
    close(listening_);
    listening_ = -1;
  }

  void Stop() {
    stopping_.store(true);
    const uint64_t one = 1;
    if (write(wake_, &one, sizeof(one)) < 0) {
      // The eventfd's counter cannot overflow from Stop() alone; nothing to do.
    }
  }

 private:
  void AcceptAll() {
    for (;;) {
      const int fd = accept4(listening_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or a connection reset before it was accepted
      if (static_cast<int>(connections_.size()) >= limits_.max_connections) {
        connections_.erase(connections_.begin());  // the oldest makes room
      }
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->deadline = Clock::now() + limits_.request_timeout;
      if (tls_ != nullptr) {
        c->ssl = tls_->NewConnection(fd);
        if (c->ssl == nullptr) continue;  // closed by ~Connection
      }
      // Bytes may already be there (a request sent with the handshake's last flight).
      if (Pump(*c)) connections_.push_back(std::move(c));
    }
  }

  // Moves `c` on as far as its socket allows: writes the pending response, answers the
  // next buffered request, reads more. False when the connection is done with.
  bool Pump(Connection& c) {
    for (;;) {
      while (c.sent < c.out.size()) {
        size_t bytes = 0;
        const Io io = Send(c, c.out.data() + c.sent, c.out.size() - c.sent, &bytes);
        if (io == Io::kDone) {
          c.sent += bytes;
          continue;
        }
        if (io != Io::kWantRead && io != Io::kWantWrite) return false;
        c.events = io == Io::kWantRead ? POLLIN : POLLOUT;
        return true;
      }
      if (!c.out.empty()) {  // a response written in full
        c.out.clear();
        c.sent = 0;
        if (c.close_after || ++c.served >= limits_.max_requests_per_connection) return false;
        c.deadline = Clock::now() + limits_.request_timeout;
      }
      if (Answer(c)) continue;
      if (c.peer_closed) return false;  // nothing complete left to answer
      char buffer[4096];
      size_t bytes = 0;
      const Io io = Receive(c, buffer, sizeof(buffer), &bytes);
      if (io == Io::kDone) {
        c.in.append(buffer, bytes);
      } else if (io == Io::kClosed) {
        c.peer_closed = true;  // answer what is buffered, then close
      } else if (io == Io::kWantRead || io == Io::kWantWrite) {
        c.events = io == Io::kWantRead ? POLLIN : POLLOUT;
        return true;
      } else {
        return false;
      }
    }
  }

  // When `c.in` starts with a complete request (or with more bytes than one may hold):
  // its response into `c.out`, the request consumed; true. False when more must be read.
  bool Answer(Connection& c) {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos || end + 4 > limits_.max_request_bytes) {
      if (c.in.size() <= limits_.max_request_bytes) return false;
      c.close_after = true;
      c.out = Response("431 Request Header Fields Too Large", "text/plain",
                       "request headers too large\n", true, true);
      c.in.clear();
      return true;
    }
    const std::string head = c.in.substr(0, end);
    c.in.erase(0, end + 4);
    std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
    std::vector<absl::string_view> request_line = absl::StrSplit(lines[0], ' ');
    const bool well_formed = request_line.size() == 3 &&
                             (request_line[2] == "HTTP/1.1" || request_line[2] == "HTTP/1.0");
    bool keep_alive = well_formed && request_line[2] == "HTTP/1.1";
    bool has_body = false;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      const std::string value =
          absl::AsciiStrToLower(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      if (name == "connection") {
        if (absl::StrContains(value, "close")) keep_alive = false;
        if (absl::StrContains(value, "keep-alive") && well_formed) keep_alive = true;
      }
      if ((name == "content-length" && value != "0") || name == "transfer-encoding") {
        has_body = true;
      }
    }
    if (!well_formed || has_body) {
      // No bodies are read: the rest of the stream cannot be framed, so it is closed.
      c.close_after = true;
      c.out = Response("400 Bad Request", "text/plain",
                       well_formed ? "a request body is not accepted\n" : "bad request line\n",
                       true, true);
      return true;
    }
    c.close_after = !keep_alive;
    const absl::string_view method = request_line[0];
    absl::string_view path = request_line[1];
    path = path.substr(0, path.find('?'));
    if (method != "GET" && method != "HEAD") {
      c.out = Response("405 Method Not Allowed", "text/plain", "only GET and HEAD\n", true,
                       c.close_after, "Allow: GET, HEAD\r\n");
    } else if (path != "/metrics") {
      c.out = Response("404 Not Found", "text/plain", "only /metrics is served here\n",
                       method == "GET", c.close_after);
    } else {
      c.out = Response("200 OK", kContentType, render_(), method == "GET", c.close_after);
    }
    return true;
  }

  int listening_;
  const int wake_;
  const std::function<std::string()> render_;
  const std::unique_ptr<MetricsTlsContext> tls_;
  const MetricsHttpLimits limits_;
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Connection>> connections_;  // in accept order
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::function<std::string()> render,
    const std::optional<MetricsTlsFiles>& tls, const MetricsHttpLimits& limits) {
  std::unique_ptr<MetricsTlsContext> context;
  if (tls.has_value()) {
    absl::StatusOr<std::unique_ptr<MetricsTlsContext>> made = MetricsTlsContext::Create(*tls);
    if (!made.ok()) return made.status();
    context = *std::move(made);
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  absl::StatusOr<int> listening = Listen(address, &server->port_);
  if (!listening.ok()) return listening.status();
  server->loop_ =
      std::make_unique<Loop>(*listening, std::move(render), std::move(context), limits);
  if (!server->loop_->ok()) return absl::InternalError("metrics_listen: eventfd failed");
  server->thread_ = std::thread([loop = server->loop_.get()] { loop->Run(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (loop_ != nullptr) loop_->Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace centroidkv::service
