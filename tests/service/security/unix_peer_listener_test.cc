// --allow-uids on a unix socket: the server's own accept loop reads each peer's uid
// (SO_PEERCRED) and refuses those not listed. The tests run as one uid, so the refusal is
// shown by allowing only another uid (12345); allowing our own uid serves the callback
// service over the handed-over connections, with "uid:N" as the caller.
#include "service/security/unix_peer_listener.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "centroidkv/client/client.h"
#include "service/server.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::service {
namespace {

std::string SocketPath(const char* tag) {
  return "/tmp/ckv-peer-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

std::unique_ptr<Server> StartUnixServer(const std::string& path, std::vector<uint32_t> uids) {
  ServerOptions options;
  options.listen_address = "unix://" + path;
  options.worker_threads = 2;
  options.security.allow_uids = std::move(uids);
  auto server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(UnixPeerListenerTest, RefusesAUidNotAllowed) {
  ASSERT_NE(getuid(), 12345u) << "the test needs to run as a uid other than 12345";
  auto server = StartUnixServer(SocketPath("refused"), {12345});
  ASSERT_NE(server, nullptr);
  client::ClientOptions options;
  options.target = server->target();
  options.connect_timeout = std::chrono::milliseconds(0);
  auto client = client::Client::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->GetInfo().status().code(), absl::StatusCode::kUnavailable);
  // The accept loop counts the refusal after closing the connection, so the client may hear
  // of it first: wait (boundedly) for the count.
  const std::string rejection = "centroidkv_caller_rejections_total{caller=\"uid:" +
                                std::to_string(getuid()) + "\",reason=\"uid_not_allowed\"}";
  std::string text = server->context().metrics.Render();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (text.find(rejection) == std::string::npos && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    text = server->context().metrics.Render();
  }
  EXPECT_NE(text.find(rejection), std::string::npos) << text;
  EXPECT_EQ(server->context().metrics.streams_opened(), 0);
}

TEST(UnixPeerListenerTest, AllowedUidIsServedAndNamedAsTheCaller) {
  auto server = StartUnixServer(SocketPath("allowed"), {12345, getuid()});
  ASSERT_NE(server, nullptr);
  client::ClientOptions options;
  options.target = server->target();
  auto client = client::Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->GetInfo().ok());
  test::RandomLayer layer = test::RandomLayer::Generate(test::Spec(2, 128, 16, 16, 3));
  client::LayerJob job;
  job.layer = layer.view();
  job.options.target_ratio = 0.5;
  job.options.chunk_size = 32;
  job.backend = BackendKind::kReference;
  job.output_dtype = DType::kFloat32;
  auto results = (*client)->CompressLayers({job, job});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[1].status.ok());
  const std::string text = server->context().metrics.Render();
  EXPECT_NE(text.find("centroidkv_caller_requests_total{caller=\"uid:" +
                      std::to_string(getuid()) + "\",rpc=\"Compress\"} 1"),
            std::string::npos)
      << text;
}

TEST(UnixPeerListenerTest, AllowUidsNeedAUnixListener) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.security.allow_uids = {0};
  auto server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("allow_uids"), std::string::npos);
}

TEST(UnixPeerListenerTest, UidOfPeerReadsOnlyFdNames) {
  // Nothing connects to this listener (so it never needs a gRPC server): no fd is known,
  // and names of other kinds of peer never match.
  auto listener = UnixPeerListener::Start(SocketPath("names"), {1}, nullptr, nullptr);
  ASSERT_TRUE(listener.ok());
  EXPECT_FALSE((*listener)->UidOfPeer("fd:3").has_value());
  EXPECT_FALSE((*listener)->UidOfPeer("ipv4:127.0.0.1:5").has_value());
  EXPECT_FALSE((*listener)->UidOfPeer("fd:x").has_value());
}

}  // namespace
}  // namespace centroidkv::service
