// TLS and mTLS end to end: the client library's credentials (client/channel_security.cc)
// against real servers on loopback serving certificates made at test time with openssl
// (tests/testing/test_pki.h). Plaintext against TLS, the wrong CA, mTLS without a client
// certificate, with another CA's or an expired one: all refused; the right ones compress a
// golden case bit for bit; a rotated server certificate is served without a restart.
#include "client/channel_security.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "centroidkv/client/client.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/testing/golden.h"
#include "tests/testing/test_pki.h"

namespace centroidkv::client {
namespace {

namespace fs = std::filesystem;

class ChannelSecurityTest : public test::TestPkiSuite {
 protected:
  // A server on 127.0.0.1:0 with the server certificate `cert` (files in the PKI folder)
  // and, when `client_ca` is not empty, mTLS against it.
  static std::unique_ptr<service::Server> StartTlsServer(const std::string& cert_pem,
                                                         const std::string& key,
                                                         const std::string& client_ca = "") {
    service::ServerOptions options = testutil::TestServerOptions("127.0.0.1:0");
    options.security.tls_cert = cert_pem;
    options.security.tls_key = key;
    options.security.tls_client_ca = client_ca;
    options.security.tls_refresh_seconds = 1;
    auto server = service::Server::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // Options for the server: TLS trusting `ca` (empty: plaintext), checking "localhost".
  static ClientOptions TlsOptions(const service::Server& server, const std::string& ca) {
    ClientOptions options;
    options.target = server.target();
    options.connect_timeout = std::chrono::milliseconds(0);  // calls report the failure
    options.tls_ca = ca;
    if (!ca.empty()) options.tls_server_name = "localhost";
    return options;
  }

  // GetInfo through a fresh channel with `options`.
  static absl::Status Call(const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) return client.status();
    return (*client)->GetInfo().status();
  }
};

// The real-KV golden case through `options`: EXPECTs the golden result, and the reference
// engine's bit for bit.
void ExpectGoldenThrough(const ClientOptions& options) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase("stories260K_layer2");
  ASSERT_TRUE(golden.ok()) << golden.status();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const LayerJob job = testutil::GoldenJob(*golden);
  absl::StatusOr<std::vector<LayerResult>> results = (*client)->CompressLayers({job});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[0].status.ok()) << (*results)[0].status;
  test::ExpectMatchesGolden(*golden, testutil::AsEngineResult((*results)[0]));
  testutil::ExpectSameAsEngine(testutil::EngineResult(job), DType::kFloat32, (*results)[0]);
}

TEST_F(ChannelSecurityTest, TlsServerRefusesPlaintextAndTheWrongCa) {
  auto server = StartTlsServer(pki_->Pem("server"), pki_->Key("server"));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(TlsOptions(*server, "")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Call(TlsOptions(*server, pki_->Pem("other-ca"))).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Call(TlsOptions(*server, pki_->Pem("ca"))).ok());
  // The certificate carries IP:127.0.0.1 too: no server-name override needed.
  ClientOptions by_ip = TlsOptions(*server, pki_->Pem("ca"));
  by_ip.tls_server_name.clear();
  EXPECT_TRUE(Call(by_ip).ok());
  // A name the certificate does not carry is refused.
  ClientOptions wrong_name = TlsOptions(*server, pki_->Pem("ca"));
  wrong_name.tls_server_name = "not-the-server.example";
  EXPECT_EQ(Call(wrong_name).code(), absl::StatusCode::kUnavailable);
  ExpectGoldenThrough(TlsOptions(*server, pki_->Pem("ca")));
}

TEST_F(ChannelSecurityTest, MutualTlsNeedsAValidClientCertificateOfItsCa) {
  auto server = StartTlsServer(pki_->Pem("server"), pki_->Key("server"), pki_->Pem("ca"));
  ASSERT_NE(server, nullptr);
  ClientOptions options = TlsOptions(*server, pki_->Pem("ca"));
  EXPECT_EQ(Call(options).code(), absl::StatusCode::kUnavailable) << "no client certificate";
  for (const char* refused : {"intruder", "expired"}) {
    options.tls_cert = pki_->Pem(refused);
    options.tls_key = pki_->Key(refused);
    EXPECT_EQ(Call(options).code(), absl::StatusCode::kUnavailable) << refused;
  }
  for (const char* accepted : {"worker-a", "worker-b"}) {
    options.tls_cert = pki_->Pem(accepted);
    options.tls_key = pki_->Key(accepted);
    EXPECT_TRUE(Call(options).ok()) << accepted;
  }
  options.tls_cert = pki_->Pem("worker-a");
  options.tls_key = pki_->Key("worker-a");
  ExpectGoldenThrough(options);
  // The certificate's common name is the caller's identity.
  const std::string text = server->context().metrics.Render();
  EXPECT_NE(text.find("centroidkv_caller_requests_total{caller=\"worker-a\",rpc=\"Compress\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("caller=\"worker-b\",rpc=\"GetInfo\"} 1"), std::string::npos);
}

TEST_F(ChannelSecurityTest, RotatedServerCertificateIsServedWithoutARestart) {
  // The server reads its certificate from files that are replaced while it runs, as a
  // Kubernetes secret volume is.
  const fs::path dir = fs::path(pki_->dir()) / "rotating";
  fs::create_directories(dir);
  const std::string cert = (dir / "tls.crt").string();
  const std::string key = (dir / "tls.key").string();
  fs::copy_file(pki_->Pem("server"), cert, fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Key("server"), key, fs::copy_options::overwrite_existing);
  auto server = StartTlsServer(cert, key);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(Call(TlsOptions(*server, pki_->Pem("ca"))).ok());
  ASSERT_FALSE(Call(TlsOptions(*server, pki_->Pem("other-ca"))).ok());
  // The new certificate comes from the other CA: only a client trusting that CA accepts it.
  fs::copy_file(pki_->Key("server-other"), key, fs::copy_options::overwrite_existing);
  fs::copy_file(pki_->Pem("server-other"), cert, fs::copy_options::overwrite_existing);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  absl::Status rotated;
  while (!(rotated = Call(TlsOptions(*server, pki_->Pem("other-ca")))).ok() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(rotated.ok()) << "the rotated certificate was not served: " << rotated;
  EXPECT_EQ(Call(TlsOptions(*server, pki_->Pem("ca"))).code(), absl::StatusCode::kUnavailable);
  ExpectGoldenThrough(TlsOptions(*server, pki_->Pem("other-ca")));
}

TEST_F(ChannelSecurityTest, OptionErrorsNameTheOption) {
  ClientOptions options;
  options.tls_cert = pki_->Pem("worker-a");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(credentials.status().message().find("tls_key"), std::string::npos);
  options = ClientOptions{};
  options.tls_ca = pki_->dir() + "/missing.pem";
  credentials = MakeChannelCredentials(options);
  EXPECT_NE(credentials.status().message().find("tls_ca"), std::string::npos);
  options = ClientOptions{};
  options.tls_server_name = "localhost";
  EXPECT_FALSE(MakeChannelCredentials(options).ok());
}

}  // namespace
}  // namespace centroidkv::client
