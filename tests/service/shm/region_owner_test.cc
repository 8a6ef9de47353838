// Shared memory regions and their owner's life (service/shm/region_table.h), against the real
// centroidkv-server binary on a unix socket: a client process that dies holding regions (it
// had the server read them, so their pages count in the server's RSS) has them unmapped by
// the server, and the server's RSS falls back. The client is this test binary run again
// (fork + exec of /proc/self/exe with --gtest_filter on RegionOwnerChild, which does
// nothing unless CKV_SHM_CHILD_TARGET is set), so it is a clean process of its own.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "centroidkv/client/client.h"
#include "centroidkv/client/shm_region.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

using centroidkv::testing::ServerProcess;

constexpr int32_t kHeads = 8;
constexpr int32_t kTokens = 8192;
constexpr int32_t kDim = 128;
// keys + values of one layer: 64 MiB of float32.
constexpr uint64_t kInputBytes = uint64_t{2} * kHeads * kTokens * kDim * sizeof(float);

// The child: registers a region for one layer, has the server read it (a job by reference),
// reports the region's name on `ready`, then waits to be killed without unregistering.
[[noreturn]] void RunDyingClient(const std::string& target, int ready) {
  client::ClientOptions options;
  options.target = target;
  options.connect_timeout = std::chrono::seconds(10);
  auto connected = client::Client::Connect(options);
  if (!connected.ok()) _exit(2);
  test::RandomLayerSpec spec = test::Spec(kHeads, kTokens, kDim, kDim, 5);
  spec.prototypes = 16;
  const test::RandomLayer layer = test::RandomLayer::Generate(spec);
  CompressOptions compress;
  auto stack = client::ShmLayerStack::Create(connected->get(), layer.view(), 1, compress);
  if (!stack.ok()) _exit(3);
  (*stack)->Fill(0, layer.view());
  client::LayerJob job = (*stack)->Job(0);
  job.backend = BackendKind::kIdentity;  // reads every input byte: the copy-free floor
  job.options.target_ratio = 1.0;
  auto results = (*connected)->CompressLayers({job});
  if (!results.ok() || !(*results)[0].status.ok()) _exit(4);
  const std::string name = (*stack)->region().name();
  (void)!write(ready, name.data(), name.size());
  close(ready);
  while (true) pause();  // SIGKILLed holding its region (the file stays until unlinked)
}

TEST(RegionOwnerTest, ServerUnmapsTheRegionsOfAClientThatDied) {
  const std::string socket = "/tmp/ckv-shm-owner-" + std::to_string(getpid()) + ".sock";
  std::filesystem::remove(socket);
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--listen", "unix://" + socket, "--threads", "2",
                            "--grace-period", "1"}))
      << server.Log();
  const uint64_t idle_rss = server.RssBytes();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    setenv("CKV_SHM_CHILD_TARGET", server.target().c_str(), 1);
    setenv("CKV_SHM_CHILD_FD", std::to_string(pipe_fds[1]).c_str(), 1);
    execl("/proc/self/exe", "ckv_service_test",
          "--gtest_filter=RegionOwnerChild.HoldsARegionUntilKilled", nullptr);
    _exit(127);
  }
  close(pipe_fds[1]);
  char name[256] = {};
  const ssize_t got = read(pipe_fds[0], name, sizeof(name) - 1);
  close(pipe_fds[0]);
  if (got <= 0) {
    int status = 0;
    waitpid(child, &status, 0);
    FAIL() << "the client failed before it held a region (exit status " << status << ")\n"
           << server.Log();
  }
  // The server read the whole input in place: those shared pages are in its RSS.
  const uint64_t holding_rss = server.RssBytes();
  EXPECT_GT(holding_rss, idle_rss + kInputBytes / 2)
      << "idle " << idle_rss << " holding " << holding_rss;

  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  // The pidfd watcher drops the dead owner's regions; RSS falls by the mapping.
  uint64_t after_rss = server.RssBytes();
  for (int i = 0; i < 200 && after_rss + kInputBytes / 2 > holding_rss; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    after_rss = server.RssBytes();
  }
  EXPECT_LT(after_rss + kInputBytes / 2, holding_rss)
      << "idle " << idle_rss << " holding " << holding_rss << " after " << after_rss;
  RecordProperty("server_rss_idle", std::to_string(idle_rss));
  RecordProperty("server_rss_holding", std::to_string(holding_rss));
  RecordProperty("server_rss_after_owner_died", std::to_string(after_rss));
  std::filesystem::remove(std::string("/dev/shm") + name);
  server.Signal(SIGTERM);
  EXPECT_TRUE(server.WaitExit(std::chrono::seconds(10)));
  std::filesystem::remove(socket);
}

// The child's part of the test above; skipped when run on its own.
TEST(RegionOwnerChild, HoldsARegionUntilKilled) {
  const char* target = getenv("CKV_SHM_CHILD_TARGET");
  const char* fd = getenv("CKV_SHM_CHILD_FD");
  if (target == nullptr || fd == nullptr) {
    GTEST_SKIP() << "the child process of ServerUnmapsTheRegionsOfAClientThatDied";
  }
  RunDyingClient(target, std::stoi(fd));
}

}  // namespace
}  // namespace centroidkv::service::testing
