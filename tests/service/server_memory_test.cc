// The server's memory bound (service/server.cc): many streams on a few
// connections, and many connections, each stream pushing a 4 MiB job at once, against a
// centroidkv-server process with a 32 MiB budget. The process's RSS (sampled from /proc)
// stays within its idle RSS plus the configured budgets (jobs, idle inputs, pooled results,
// transport quota) plus a stated fixed overhead, instead of growing with the streams (it
// reached 4.9 GB before), and the streams beyond --max-streams get RESOURCE_EXHAUSTED.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/server_process.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

using centroidkv::testing::ServerProcess;

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20;

struct AttackResult {
  uint64_t idle_rss = 0;
  uint64_t peak_rss = 0;
  int refused = 0;  // streams ended with RESOURCE_EXHAUSTED
  bool server_alive = false;
};

// `connections` channels (a TCP connection each), `streams_per_connection` streams on each,
// every stream pushing a 4 MiB job at once, for 4 s, against a server with a 32 MiB job
// budget, 16 MiB of pooled results, a 64 MiB transport quota and at most `max_streams`
// streams. The server's RSS is sampled every 20 ms.
AttackResult RunAttack(int connections, int streams_per_connection, int max_streams) {
  AttackResult out;
  ServerProcess server;
  EXPECT_TRUE(server.Start({"--listen", "127.0.0.1:0", "--threads", "2", "--max-total-bytes",
                            "32MiB", "--max-stream-bytes", "16MiB", "--max-pooled-result-bytes",
                            "16MiB", "--max-transport-bytes", "64MiB", "--max-streams",
                            std::to_string(max_streams)}))
      << server.Log();
  if (server.pid() <= 0) return out;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  out.idle_rss = server.RssBytes();

  // 2 heads x 4096 tokens x (64 + 64) float32: 4 MiB in, ~8 MiB of footprint each.
  static const test::RandomLayer layer =
      test::RandomLayer::Generate(test::Spec(2, 4096, 64, 64, 8));
  CompressOptions options;
  options.target_ratio = 0.5;
  std::vector<std::unique_ptr<v1::CentroidKV::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("ckv.test.connection", c);  // a channel (and connection) of its own
    stubs.push_back(v1::CentroidKV::NewStub(grpc::CreateCustomChannel(
        server.target(), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<RawStream>> streams;
  for (int i = 0; i < connections * streams_per_connection; ++i) {
    streams.push_back(std::make_unique<RawStream>(stubs[i % connections].get()));
  }
  std::atomic<int> refused{0};
  std::vector<std::thread> clients;
  for (auto& stream : streams) {
    clients.emplace_back([&, s = stream.get()] {
      // Sends (blocking under flow control while the budget is full), then reads until the
      // stream ends: at the server's refusal (our max_streams, or gRPC's ENHANCE_YOUR_CALM
      // under the transport quota), or at our cancel.
      s->SendJob(1, layer.view(), options, 256 << 10);
      v1::CompressResponse response;
      while (s->Read(&response)) {
      }
      if (s->Finish().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) refused++;
    });
  }
  const auto until = Clock::now() + std::chrono::seconds(4);
  while (Clock::now() < until) {
    out.peak_rss = std::max(out.peak_rss, server.RssBytes());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& stream : streams) stream->context().TryCancel();
  for (std::thread& client : clients) client.join();
  out.refused = refused.load();
  out.server_alive = !server.WaitExit(std::chrono::milliseconds(0));
  return out;
}

// The bound --max-transport-bytes documents: the idle process, plus the job budget (inputs
// being received or computed, results not yet written), plus idle freed inputs (at most one
// budget's worth), plus the pooled results, plus the transport quota, plus a fixed overhead
// for what none of them counts (gRPC's per-connection and per-stream state, thread stacks,
// the engine's per-thread scratch, heap slack).
constexpr uint64_t kBudget = 32 * kMiB, kPooled = 16 * kMiB, kTransport = 64 * kMiB;
constexpr uint64_t kFixedOverhead = 64 * kMiB;

void ExpectWithinBound(const AttackResult& attack, const char* what) {
  const uint64_t bound = attack.idle_rss + 2 * kBudget + kPooled + kTransport + kFixedOverhead;
  std::cout << what << ": idle RSS " << attack.idle_rss / kMiB << " MiB, peak "
            << attack.peak_rss / kMiB << " MiB, bound " << bound / kMiB << " MiB, refused "
            << attack.refused << "\n";
  EXPECT_LE(attack.peak_rss, bound) << what;
  EXPECT_TRUE(attack.server_alive) << what;
}

// Many streams on a few connections: 128 streams on 4 connections, 96 allowed.
TEST(ServerMemoryTest, ManyUnreadStreamsStayWithinTheBudgetAndExtraOnesAreRefused) {
  const AttackResult attack = RunAttack(4, 32, 96);
  ExpectWithinBound(attack, "128 streams on 4 connections");
  EXPECT_GE(attack.refused, 128 - 96);
}

// Many connections: 96 connections with 2 streams each, 160 streams allowed.
TEST(ServerMemoryTest, ManyConnectionsStayWithinTheBudgetAndExtraStreamsAreRefused) {
  const AttackResult attack = RunAttack(96, 2, 160);
  ExpectWithinBound(attack, "192 streams on 96 connections");
  EXPECT_GE(attack.refused, 192 - 160);
}

}  // namespace
}  // namespace centroidkv::service::testing
