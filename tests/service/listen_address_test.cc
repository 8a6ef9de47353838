// Two servers never share an address: a second server on a unix path that a
// live server holds, or on a TCP port already bound, refuses to start, and the first keeps
// serving; a stale socket file left by a dead server is taken over.
#include "service/listen_address.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "service/server.h"
#include "tests/service/service_test_util.h"

namespace centroidkv::service {
namespace {

std::string SocketPath(const char* name) {
  return absl::StrCat("/tmp/ckv-listen-", getpid(), "-", name, ".sock");
}

// GetInfo answers: the server behind `target` serves.
bool Serves(const std::string& target) {
  auto stub = testing::MakeStub(target);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetInfoResponse info;
  return stub->GetInfo(&context, v1::GetInfoRequest(), &info).ok();
}

TEST(ListenAddressTest, SecondServerOnALiveUnixPathRefusesToStart) {
  const std::string path = SocketPath("live");
  unlink(path.c_str());
  ServerOptions options;
  options.listen_address = "unix://" + path;
  auto first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Server::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(path), std::string::npos) << second.status();
  EXPECT_TRUE(Serves((*first)->target()));
  (*first)->Shutdown();
  unlink(path.c_str());
}

TEST(ListenAddressTest, StaleSocketFileIsTakenOver) {
  const std::string path = SocketPath("stale");
  unlink(path.c_str());
  // A socket file bound and closed without listening: nobody accepts on it.
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
  EXPECT_TRUE(CheckUnixPathNotServed("unix://" + path).ok());
  ServerOptions options;
  options.listen_address = "unix://" + path;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Serves((*server)->target()));
  (*server)->Shutdown();
  unlink(path.c_str());
}

TEST(ListenAddressTest, SecondServerOnABoundTcpPortRefusesToStart) {
  auto first = testing::StartLoopbackServer();
  ASSERT_NE(first, nullptr);
  ServerOptions options;
  options.listen_address = absl::StrCat("127.0.0.1:", first->port());
  auto second = Server::Start(options);
  EXPECT_FALSE(second.ok()) << "two servers share port " << first->port();
  EXPECT_TRUE(Serves(first->target()));
}

TEST(ListenAddressTest, TcpAddressesAreNotChecked) {
  EXPECT_TRUE(CheckUnixPathNotServed("127.0.0.1:0").ok());
  EXPECT_TRUE(CheckUnixPathNotServed("unix:///nonexistent/dir/x.sock").ok());
}

}  // namespace
}  // namespace centroidkv::service
