// Tests of service/metrics_tls.cc on a real server with certificates made by `openssl`
// (tests/testing/test_pki.h): with --tls-cert, /metrics answers over HTTPS to a scraper
// trusting the test CA and to nothing else (plain HTTP, the other CA); a rotated
// certificate is served without a restart; --metrics-plaintext is refused off loopback.
#include "service/metrics_tls.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/test_pki.h"

namespace centroidkv::service {
namespace {

namespace fs = std::filesystem;

class MetricsTlsTest : public test::TestPkiSuite {
 protected:
  static ServerOptions TlsOptions(const std::string& cert, const std::string& key) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.worker_threads = 1;
    options.security.tls_cert = cert;
    options.security.tls_key = key;
    options.security.tls_refresh_seconds = 1;
    return options;
  }

  // GET /metrics over HTTPS trusting `ca`; the body, or "" when the request failed.
  static std::string ScrapeHttps(int port, const std::string& ca) {
    httplib::SSLClient client("127.0.0.1", port);
    client.set_ca_cert_path(ca.c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(std::chrono::seconds(5));
    client.set_read_timeout(std::chrono::seconds(5));
    httplib::Result result = client.Get("/metrics");
    if (!result || result->status != 200) return "";
    return result->body;
  }

  // GET /metrics over plain HTTP; true when an HTTP response came back.
  static bool PlainHttpAnswers(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(std::chrono::seconds(5));
    client.set_read_timeout(std::chrono::seconds(5));
    httplib::Result result = client.Get("/metrics");
    return static_cast<bool>(result);
  }

  // The server pair copied into `folder` (tls.crt, tls.key), files to replace while the
  // server runs, as a Kubernetes secret volume's are.
  static std::pair<std::string, std::string> RotatingPair(const std::string& folder) {
    const fs::path dir = fs::path(pki_->dir()) / folder;
    fs::create_directories(dir);
    const std::string cert = (dir / "tls.crt").string();
    const std::string key = (dir / "tls.key").string();
    fs::copy_file(pki_->Pem("server"), cert, fs::copy_options::overwrite_existing);
    fs::copy_file(pki_->Key("server"), key, fs::copy_options::overwrite_existing);
    return {cert, key};
  }
};

TEST_F(MetricsTlsTest, WithTlsMetricsAreServedOverHttpsOnly) {
  auto server = Server::Start(TlsOptions(pki_->Pem("server"), pki_->Key("server")));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  ASSERT_GT(port, 0);
  const std::string body = ScrapeHttps(port, pki_->Pem("ca"));
  EXPECT_NE(body.find("# TYPE centroidkv_queue_depth gauge"), std::string::npos) << body;
  EXPECT_FALSE(PlainHttpAnswers(port)) << "/metrics answered plain HTTP with TLS on";
  EXPECT_EQ(ScrapeHttps(port, pki_->Pem("other-ca")), "")
      << "a scraper trusting another CA accepted the certificate";
}

// 200 connections that never start their handshake (or stop half-way through the
// ClientHello) do not delay an HTTPS scrape: the handshakes run on the poll loop too.
TEST_F(MetricsTlsTest, HalfOpenConnectionsDoNotDelayAnHttpsScrape) {
  auto server = Server::Start(TlsOptions(pki_->Pem("server"), pki_->Key("server")));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  std::vector<int> half_open;
  for (int i = 0; i < 200; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
    // A TLS record header announcing a ClientHello, then nothing.
    if (i % 2 == 0) {
      ASSERT_EQ(write(fd, "\x16\x03\x01\x02\x00", 5), 5);
    }
    half_open.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string body = ScrapeHttps(port, pki_->Pem("ca"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(body.find("# TYPE centroidkv_queue_depth gauge"), std::string::npos) << body;
  EXPECT_LT(seconds, 1.0) << "an HTTPS scrape waited behind half-open connections";
  for (int fd : half_open) close(fd);
}

TEST_F(MetricsTlsTest, RotatedCertificateIsServedWithoutARestart) {
  const auto [cert, key] = RotatingPair("metrics-rotating");
  auto server = Server::Start(TlsOptions(cert, key));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  ASSERT_NE(ScrapeHttps(port, pki_->Pem("ca")), "");
  ASSERT_EQ(ScrapeHttps(port, pki_->Pem("other-ca")), "");
  // The new pair comes from the other CA: only a scraper trusting that CA accepts it.
  fs::copy_file(pki_->Key("server-other"), key, fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Pem("server-other"), cert, fs::copy_options::overwrite_existing);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string rotated;
  while ((rotated = ScrapeHttps(port, pki_->Pem("other-ca"))).empty() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_NE(rotated, "") << "the rotated certificate was not served";
  EXPECT_EQ(ScrapeHttps(port, pki_->Pem("ca")), "");
}

TEST_F(MetricsTlsTest, HalfRotatedPairKeepsThePreviousCertificate) {
  const auto [cert, key] = RotatingPair("metrics-half");
  auto server = Server::Start(TlsOptions(cert, key));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  // Only the key replaced: it does not match the certificate, so the old pair stays.
  fs::copy_file(pki_->Key("server-other"), key, fs::copy_options::overwrite_existing);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_NE(ScrapeHttps(port, pki_->Pem("ca")), "");
  EXPECT_NE(ScrapeHttps(port, pki_->Pem("ca")), "");
}

TEST_F(MetricsTlsTest, PlaintextMetricsWithTlsOnlyOnLoopback) {
  ServerOptions options = TlsOptions(pki_->Pem("server"), pki_->Key("server"));
  options.metrics_plaintext = true;
  options.metrics_listen = "0.0.0.0:0";
  auto refused = Server::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("metrics_plaintext"), std::string::npos)
      << refused.status();
  options.metrics_listen = "127.0.0.1:0";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(PlainHttpAnswers((*server)->metrics_port()));
}

TEST_F(MetricsTlsTest, BadKeyFileIsNamed) {
  auto server = Server::Start(TlsOptions(pki_->Pem("server"), pki_->Key("server-other")));
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("tls_key"), std::string::npos) << server.status();
}

TEST(IsLoopbackAddressTest, KnowsLoopbackHosts) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:9464"));
  EXPECT_TRUE(IsLoopbackAddress("127.8.0.2:0"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:9464"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:9464"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:9464"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:9464"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1:9464"));
}

}  // namespace
}  // namespace centroidkv::service
