// The /metrics server (service/metrics_http.cc) on a real loopback port, scraped by
// cpp-httplib's client and by raw sockets: 200 half-open connections do not delay a scrape
// and are closed at their deadline; past the connection bound the oldest makes room;
// pipelined requests are answered in order and what is not served is named; a busy port
// and a bad address are refused.
#include "service/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "tests/service/prometheus_text.h"

namespace centroidkv::service {
namespace {

using Clock = std::chrono::steady_clock;

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes (or `limit` passes).
std::string ReadUntilClosed(int fd, std::chrono::milliseconds limit) {
  std::string got;
  const auto give_up = Clock::now() + limit;
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

// Whether the server closed `fd` within `limit` (EOF or a reset, after any bytes).
bool ClosedWithin(int fd, std::chrono::milliseconds limit) {
  const auto give_up = Clock::now() + limit;
  char buffer[256];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    if (read(fd, buffer, sizeof(buffer)) <= 0) return true;
  }
}

TEST(MetricsHttpTest, TwoHundredHalfOpenConnectionsDoNotDelayAScrape) {
  MetricsHttpLimits limits;
  limits.request_timeout = std::chrono::milliseconds(1500);
  auto server =
      MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); }, {}, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kHalfOpen = 200;
  std::vector<int> slow;
  for (int i = 0; i < kHalfOpen; ++i) {
    const int fd = ConnectLoopback((*server)->port());
    ASSERT_GE(fd, 0);
    // Half of them a partial request line, half nothing at all.
    if (i % 2 == 0) {
      ASSERT_EQ(write(fd, "GET /met", 8), 8);
    }
    slow.push_back(fd);
  }
  for (int scrape = 0; scrape < 3; ++scrape) {
    const auto start = Clock::now();
    auto scraped = testing::ScrapeMetrics((*server)->port());
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ASSERT_TRUE(scraped.ok()) << scraped.status();
    EXPECT_EQ(*scraped, "up 1\n");
    EXPECT_LT(seconds, 1.0) << "a scrape waited behind the half-open connections";
  }
  // Each is closed at its deadline (1.5 s after its accept), not held for ever.
  for (int fd : slow) {
    EXPECT_TRUE(ClosedWithin(fd, std::chrono::milliseconds(5000)))
        << "a half-open connection outlived its deadline";
    close(fd);
  }
}

TEST(MetricsHttpTest, PastMaxConnectionsTheOldestMakeRoom) {
  MetricsHttpLimits limits;
  limits.max_connections = 8;
  limits.request_timeout = std::chrono::seconds(60);
  auto server =
      MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); }, {}, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> idle;
  for (int i = 0; i < limits.max_connections; ++i) {
    idle.push_back(ConnectLoopback((*server)->port()));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all accepted, in order
  auto scraped = testing::ScrapeMetrics((*server)->port());
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  EXPECT_EQ(*scraped, "up 1\n");
  // The scrape's connection took the place of the first idle one, long before its deadline.
  EXPECT_TRUE(ClosedWithin(idle[0], std::chrono::milliseconds(2000)));
  EXPECT_FALSE(ClosedWithin(idle.back(), std::chrono::milliseconds(200)));
  for (int fd : idle) close(fd);
}

TEST(MetricsHttpTest, AnswersPipelinedRequestsAndNamesWhatItDoesNotServe) {
  int renders = 0;
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [&renders] {
    ++renders;
    return std::string("up 1\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  const std::string requests =
      "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"
      "GET /other HTTP/1.1\r\nHost: a\r\n\r\n"
      "DELETE /metrics HTTP/1.1\r\nHost: a\r\n\r\n"
      "HEAD /metrics?x=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
      "GET /metrics HTTP/1.1\r\n\r\n";  // after Connection: close, never answered
  ASSERT_EQ(write(fd, requests.data(), requests.size()), static_cast<ssize_t>(requests.size()));
  const std::string got = ReadUntilClosed(fd, std::chrono::seconds(5));
  close(fd);
  const size_t ok = got.find("HTTP/1.1 200 OK\r\n");
  const size_t not_found = got.find("HTTP/1.1 404 Not Found\r\n");
  const size_t not_allowed = got.find("HTTP/1.1 405 Method Not Allowed\r\n");
  const size_t head = got.rfind("HTTP/1.1 200 OK\r\n");
  ASSERT_NE(ok, std::string::npos) << got;
  ASSERT_NE(not_found, std::string::npos) << got;
  ASSERT_NE(not_allowed, std::string::npos) << got;
  EXPECT_LT(ok, not_found);
  EXPECT_LT(not_found, not_allowed);
  EXPECT_LT(not_allowed, head);
  EXPECT_NE(got.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n\r\nup 1\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Allow: GET, HEAD\r\n"), std::string::npos) << got;
  // HEAD: the headers (with GET's length) and no body; then the connection closes.
  EXPECT_TRUE(absl::EndsWith(got, "Connection: close\r\n\r\n")) << got;
  EXPECT_EQ(renders, 2);

  const int big = ConnectLoopback((*server)->port());
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a');
  ASSERT_EQ(write(big, huge.data(), huge.size()), static_cast<ssize_t>(huge.size()));
  EXPECT_NE(ReadUntilClosed(big, std::chrono::seconds(5))
                .find("HTTP/1.1 431 Request Header Fields Too Large"),
            std::string::npos);
  close(big);

  const int bad = ConnectLoopback((*server)->port());
  const std::string garbage = "NONSENSE\r\n\r\n";
  ASSERT_EQ(write(bad, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  EXPECT_NE(ReadUntilClosed(bad, std::chrono::seconds(5)).find("HTTP/1.1 400 Bad Request"),
            std::string::npos);
  close(bad);
}

TEST(MetricsHttpTest, ABusyPortAndABadAddressAreRefused) {
  auto first = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsHttpServer::Start(taken, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("metrics_listen"), std::string::npos);
  auto bad = MetricsHttpServer::Start("127.0.0.1", [] { return std::string(); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();

  const int port = (*first)->port();
  (*first)->Stop();
  EXPECT_LT(ConnectLoopback(port), 0) << "the port stayed open after Stop()";
}

}  // namespace
}  // namespace centroidkv::service
