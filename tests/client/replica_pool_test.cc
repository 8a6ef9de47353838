// Tests of ReplicaPool and its balanced streams (client/replica_pool.cc,
// client/balanced_stream.cc) against real in-process servers on loopback: target parsing,
// a comma list spreading jobs over three replicas, a job refused by a draining replica
// (per-job UNAVAILABLE) resent to another, non-retryable errors returned without a resend
// (and pinned on the guilty job only), capped backoff and bounded attempts, job deadlines,
// cancel, and every job answered exactly once while a replica drains mid-run. The test with
// server processes killed mid-run is replica_failover_test.cc.
#include "centroidkv/client/replica_pool.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;
using testutil::EngineResult;
using testutil::ExpectSameAsEngine;
using testutil::JobSet;
using testutil::MakeVariedJobs;
using testutil::RunPipelined;

// ---------------------------------------------------------------------------------------
// Targets.

void ExpectTarget(const std::string& target, const std::string& grpc_target, int32_t count) {
  absl::StatusOr<ReplicaTarget> parsed = ParseReplicaTarget(target);
  ASSERT_TRUE(parsed.ok()) << target << ": " << parsed.status();
  EXPECT_EQ(parsed->grpc_target, grpc_target) << target;
  EXPECT_EQ(parsed->addresses, count) << target;
}

TEST(ParseReplicaTargetTest, ListsBecomeOneGrpcTargetOfOneFamily) {
  ExpectTarget("127.0.0.1:1,127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2", 2);
  ExpectTarget("10.0.0.1:5, 10.0.0.2:5 ,10.0.0.3:5", "ipv4:10.0.0.1:5,10.0.0.2:5,10.0.0.3:5", 3);
  ExpectTarget("[::1]:1,[::1]:2", "ipv6:[::1]:1,[::1]:2", 2);
  ExpectTarget("ipv4:10.0.0.1:5,10.0.0.2:5", "ipv4:10.0.0.1:5,10.0.0.2:5", 2);
  ExpectTarget("unix:///run/a.sock,unix:///run/b.sock", "unix:/run/a.sock,/run/b.sock", 2);
  ExpectTarget("unix:/run/a.sock,/run/b.sock", "unix:/run/a.sock,/run/b.sock", 2);
  ExpectTarget("localhost:7,127.0.0.1:8", "ipv4:127.0.0.1:7,127.0.0.1:8", 2);
}

TEST(ParseReplicaTargetTest, SingleTargetsPassThrough) {
  ExpectTarget("dns:///ckv-pool.default.svc.cluster.local:50051",
               "dns:///ckv-pool.default.svc.cluster.local:50051", 0);
  ExpectTarget("10.0.0.1:50051", "10.0.0.1:50051", 1);
  ExpectTarget("unix:///run/ckv.sock", "unix:///run/ckv.sock", 1);
}

TEST(ParseReplicaTargetTest, RejectsMalformedLists) {
  for (const std::string target :
       {"", "127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,[::1]:2", "dns:///svc:1,127.0.0.1:2",
        "127.0.0.1:1,noport", "127.0.0.1:1,unix:///a.sock"}) {
    absl::StatusOr<ReplicaTarget> parsed = ParseReplicaTarget(target);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << target << "': " << parsed.status();
  }
}

TEST(ParseReplicaTargetTest, NamesReplicaSet) {
  EXPECT_TRUE(NamesReplicaSet("a:1,b:2"));
  EXPECT_TRUE(NamesReplicaSet("dns:///svc:1"));
  EXPECT_FALSE(NamesReplicaSet("127.0.0.1:1"));
  EXPECT_FALSE(NamesReplicaSet("unix:///run/ckv.sock"));
}

TEST(ReplicaPoolOptionsTest, RejectsBadOptionsNamingThem) {
  PoolOptions base;
  base.client.target = "127.0.0.1:1,127.0.0.1:2";
  base.client.connect_timeout = std::chrono::milliseconds(0);
  std::vector<PoolOptions> bad(6, base);
  bad[0].jobs_per_stream = 0;
  bad[1].retry.max_attempts = 0;
  bad[2].retry.max_backoff = std::chrono::milliseconds(1);  // below initial_backoff
  bad[3].retry.jitter = 1.5;
  bad[4].keepalive_time = std::chrono::seconds(1);
  bad[5].client.target = "127.0.0.1:1,";
  for (const PoolOptions& options : bad) {
    absl::StatusOr<std::unique_ptr<ReplicaPool>> pool = ReplicaPool::Connect(options);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << pool.status();
  }
  absl::StatusOr<std::unique_ptr<ReplicaPool>> pool = ReplicaPool::Connect(base);
  ASSERT_TRUE(pool.ok()) << pool.status();  // nothing listens, but it does not wait
  EXPECT_EQ((*pool)->options().streams, 4);
}

// ---------------------------------------------------------------------------------------
// Against in-process servers.

// `count` servers on 127.0.0.1:0 with the test options and `grace` to drain.
std::vector<std::unique_ptr<service::Server>> StartServers(
    int count, std::chrono::milliseconds grace = std::chrono::milliseconds(500)) {
  std::vector<std::unique_ptr<service::Server>> servers;
  for (int i = 0; i < count; ++i) {
    service::ServerOptions options = testutil::TestServerOptions("127.0.0.1:0");
    options.grace_period = grace;
    auto server = service::Server::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) servers.push_back(*std::move(server));
  }
  return servers;
}

std::string ListOf(const std::vector<std::unique_ptr<service::Server>>& servers) {
  std::string target;
  for (const auto& server : servers) target += (target.empty() ? "" : ",") + server->target();
  return target;
}

// Fast retries for tests.
PoolOptions TestPoolOptions(const std::string& target) {
  PoolOptions options;
  options.client.target = target;
  options.client.connect_timeout = std::chrono::seconds(5);
  options.retry.initial_backoff = std::chrono::milliseconds(10);
  options.retry.max_backoff = std::chrono::milliseconds(100);
  return options;
}

std::unique_ptr<ReplicaPool> ConnectPool(const PoolOptions& options) {
  absl::StatusOr<std::unique_ptr<ReplicaPool>> pool = ReplicaPool::Connect(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

int64_t JobsCompleted(const service::Server& server) {
  return server.context().metrics.jobs_ended(service::JobOutcome::kCompleted);
}

int64_t JobsComputing(const service::Server& server) {
  const service::ServiceMetrics& counters = server.context().metrics;
  using service::JobOutcome;
  return counters.jobs_received() - counters.jobs_ended(JobOutcome::kCompleted) -
         counters.jobs_ended(JobOutcome::kFailed) - counters.jobs_ended(JobOutcome::kDropped);
}

// A job the reference backend needs a while for (hundreds of ms), to have one in flight.
struct SlowJob {
  RandomLayer layer = RandomLayer::Generate([] {
    RandomLayerSpec spec{.num_heads = 8, .num_tokens = 2048, .key_dim = 64, .value_dim = 64,
        .seed = 77};
    return spec;
  }());
  LayerJob job = [this] {
    LayerJob slow;
    slow.layer_index = 900;
    slow.layer = layer.view();
    slow.options.target_ratio = 0.1;
    slow.options.chunk_size = 512;
    slow.options.max_passes = 8;
    slow.backend = BackendKind::kReference;
    return slow;
  }();
};

TEST(ReplicaPoolTest, CommaListSpreadsJobsOverThreeReplicas) {
  auto servers = StartServers(3);
  ASSERT_EQ(servers.size(), 3u);
  PoolOptions options = TestPoolOptions(ListOf(servers));
  options.stream_job_limit = 4;  // lanes are placed afresh often
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->options().streams, 6);  // 2 per address
  const JobSet set = MakeVariedJobs(60, 7000, 0);
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  RunPipelined(stream.get(), set.jobs, set.specs);
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.submitted, 60);
  EXPECT_EQ(stats.returned_ok, 60);
  EXPECT_EQ(stats.retries, 0);
  for (const auto& server : servers) {
    EXPECT_GT(JobsCompleted(*server), 0) << server->target();
    const auto it = stats.replicas.find("ipv4:" + server->target());
    ASSERT_NE(it, stats.replicas.end()) << server->target();
    EXPECT_EQ(it->second.results, JobsCompleted(*server));
    EXPECT_EQ(it->second.in_flight, 0);
  }
}

TEST(ReplicaPoolTest, UnixSocketListSpreadsJobsOverBothServers) {
  std::vector<std::unique_ptr<service::Server>> servers;
  std::vector<std::string> paths;
  std::string target;
  for (int i = 0; i < 2; ++i) {
    const std::string path =
        "/tmp/ckv-pool-test-" + std::to_string(getpid()) + "-" + std::to_string(i) + ".sock";
    paths.push_back(path);
    auto server = service::Server::Start(testutil::TestServerOptions("unix://" + path));
    ASSERT_TRUE(server.ok()) << server.status();
    target += (target.empty() ? "" : ",") + (*server)->target();
    servers.push_back(*std::move(server));
  }
  PoolOptions options = TestPoolOptions(target);
  options.stream_job_limit = 4;
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  const JobSet set = MakeVariedJobs(24, 7050, 0);
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  RunPipelined(stream.get(), set.jobs, set.specs);
  for (const auto& server : servers) {
    EXPECT_GT(JobsCompleted(*server), 0) << server->target();
  }
  EXPECT_EQ(pool->stats().returned_ok, 24);
  servers.clear();
  for (const std::string& path : paths) unlink(path.c_str());
}

TEST(ReplicaPoolTest, AJobRefusedByADrainingReplicaIsResentToAnother) {
  auto servers = StartServers(2, std::chrono::seconds(20));  // the slow job finishes in it
  ASSERT_EQ(servers.size(), 2u);
  PoolOptions options = TestPoolOptions(ListOf(servers));
  options.streams = 1;  // every job on one lane until that lane fails
  options.stream_job_limit = 0;
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  std::unique_ptr<CompressStream> stream = pool->OpenStream();

  // A slow job in flight on replica X (whichever the lane went to).
  const SlowJob slow;
  ASSERT_TRUE(stream->Submit(slow.job).ok());
  service::Server* draining = nullptr;
  while (draining == nullptr) {
    for (const auto& server : servers) {
      if (JobsComputing(*server) > 0) draining = server.get();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::thread shutdown([draining] { draining->Shutdown(); });
  while (!draining->context().draining.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // X refuses this one with UNAVAILABLE (its lane is still open for the slow job).
  const JobSet set = MakeVariedJobs(1, 7100, 5);
  ASSERT_TRUE(stream->Submit(set.jobs[0]).ok());
  std::vector<LayerResult> results;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    results.push_back(*std::move(result));
  }
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Close().ok());
  shutdown.join();
  for (const LayerResult& result : results) {
    const LayerJob& job = result.layer_index == slow.job.layer_index ? slow.job : set.jobs[0];
    SCOPED_TRACE(result.layer_index);
    ExpectSameAsEngine(EngineResult(job), job.output_dtype.value_or(job.layer.dtype), result);
  }
  EXPECT_NE(results[0].layer_index, results[1].layer_index);
  PoolStats stats = pool->stats();
  EXPECT_GE(stats.job_unavailable, 1);
  EXPECT_GE(stats.retries, 1);
  EXPECT_EQ(stats.returned_ok, 2);
  EXPECT_EQ(stats.replicas["ipv4:" + draining->target()].resent, 1);
  EXPECT_EQ(stats.replicas["ipv4:" + draining->target()].results, 1) << "the slow job";
  for (const auto& server : servers) {
    EXPECT_EQ(JobsCompleted(*server), 1) << server->target();
  }
}

TEST(ReplicaPoolTest, NonRetryableErrorsAreReturnedWithoutResendingOnlyToTheGuiltyJob) {
  auto servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  PoolOptions options = TestPoolOptions(servers[0]->target());
  options.streams = 1;  // the bad job shares its lane with good ones
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  JobSet set = MakeVariedJobs(6, 7200, 0);
  LayerJob bad = set.jobs[2];
  bad.layer_index = 99;
  bad.options.chunk_size = 1;  // INVALID_ARGUMENT: a JobError for that job only
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  for (size_t i = 0; i < set.jobs.size(); ++i) {
    ASSERT_TRUE(stream->Submit(set.jobs[i]).ok());
    if (i == 1) {
      ASSERT_TRUE(stream->Submit(bad).ok());
    }
  }
  int bad_seen = 0, good_seen = 0;
  for (size_t i = 0; i < set.jobs.size() + 1; ++i) {
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    if (result->layer_index == 99) {
      ++bad_seen;
      EXPECT_EQ(result->status.code(), absl::StatusCode::kInvalidArgument) << result->status;
      EXPECT_NE(result->status.message().find("chunk_size"), absl::string_view::npos)
          << result->status;
      continue;
    }
    ++good_seen;
    const LayerJob& job = set.jobs[result->layer_index];
    ExpectSameAsEngine(EngineResult(job), job.output_dtype.value_or(job.layer.dtype), *result);
  }
  EXPECT_EQ(bad_seen, 1);
  EXPECT_EQ(good_seen, 6);
  EXPECT_TRUE(stream->Close().ok());
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.retries, 0);
  EXPECT_EQ(stats.gave_up, 0);
  EXPECT_EQ(stats.returned_error, 1);
  EXPECT_EQ(stats.returned_ok, 6);
}

TEST(ReplicaPoolTest, BackoffIsCappedAndAttemptsAreBounded) {
  const int port_a = testutil::UnusedPort(), port_b = testutil::UnusedPort();
  ASSERT_NE(port_a, 0);
  ASSERT_NE(port_b, 0);
  PoolOptions options;
  options.client.target =
      "127.0.0.1:" + std::to_string(port_a) + ",127.0.0.1:" + std::to_string(port_b);
  options.client.connect_timeout = std::chrono::milliseconds(0);  // nothing listens
  options.retry.max_attempts = 4;
  options.retry.initial_backoff = std::chrono::milliseconds(20);
  options.retry.max_backoff = std::chrono::milliseconds(50);
  options.retry.multiplier = 3.0;
  options.retry.jitter = 0.2;
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  const JobSet set = MakeVariedJobs(1, 7300, 0);
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(stream->Submit(set.jobs[0]).ok());
  absl::StatusOr<LayerResult> result = stream->Next();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status.code(), absl::StatusCode::kUnavailable) << result->status;
  EXPECT_NE(result->status.message().find("gave up after 4 sends"), absl::string_view::npos)
      << result->status;
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.retries, 3);
  EXPECT_EQ(stats.gave_up, 1);
  // Backoffs 20, min(50, 60), min(50, 180) ms, each scaled by [0.8, 1].
  EXPECT_LE(stats.longest_backoff, std::chrono::milliseconds(50));
  EXPECT_GE(stats.longest_backoff, std::chrono::milliseconds(40));
  EXPECT_GE(elapsed, std::chrono::milliseconds(16 + 40 + 40));
}

TEST(ReplicaPoolTest, AnExpiredJobIsCancelledAndReturnedWithoutResending) {
  auto servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  PoolOptions options = TestPoolOptions(servers[0]->target());
  options.job_deadline = std::chrono::milliseconds(30);
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  const SlowJob slow;
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  ASSERT_TRUE(stream->Submit(slow.job).ok());
  absl::StatusOr<LayerResult> result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status.code(), absl::StatusCode::kDeadlineExceeded) << result->status;
  EXPECT_EQ(result->layer_index, slow.job.layer_index);
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Close().ok());
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.deadline_exceeded, 1);
  EXPECT_EQ(stats.retries, 0);
  // The server was told to drop it (whether it had all of it yet or not): it computes no
  // result.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (JobsComputing(*servers[0]) > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(JobsComputing(*servers[0]), 0);
  EXPECT_EQ(JobsCompleted(*servers[0]), 0);
}

TEST(ReplicaPoolTest, CancelledJobGetsNoResult) {
  auto servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  std::unique_ptr<ReplicaPool> pool = ConnectPool(TestPoolOptions(servers[0]->target()));
  ASSERT_NE(pool, nullptr);
  const SlowJob slow;
  const JobSet set = MakeVariedJobs(1, 7400, 0);
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  absl::StatusOr<uint64_t> slow_id = stream->Submit(slow.job);
  ASSERT_TRUE(slow_id.ok());
  absl::StatusOr<uint64_t> id = stream->Submit(set.jobs[0]);
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(stream->Cancel(*slow_id).ok());
  EXPECT_EQ(stream->Cancel(12345).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<LayerResult> result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->job_id, *id);
  ExpectSameAsEngine(EngineResult(set.jobs[0]), DType::kFloat32, *result);
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Close().ok());
}

// In-process version of the failover test: a replica drains (SIGTERM's path) mid-run.
TEST(ReplicaPoolTest, EveryJobIsAnsweredOnceWhileAReplicaDrainsMidRun) {
  auto servers = StartServers(2);
  ASSERT_EQ(servers.size(), 2u);
  PoolOptions options = TestPoolOptions(ListOf(servers));
  options.jobs_per_stream = 2;  // most jobs wait in the pool: some are sent after the drain
  std::unique_ptr<ReplicaPool> pool = ConnectPool(options);
  ASSERT_NE(pool, nullptr);
  const JobSet set = MakeVariedJobs(80, 7500, 0);
  std::thread shutdown;
  std::unique_ptr<CompressStream> stream = pool->OpenStream();
  RunPipelined(stream.get(), set.jobs, set.specs, [&](size_t received) {
    if (received == 10) shutdown = std::thread([&servers] { servers[0]->Shutdown(); });
  });
  ASSERT_TRUE(shutdown.joinable());
  shutdown.join();
  const PoolStats stats = pool->stats();
  EXPECT_EQ(stats.returned_ok, 80);
  EXPECT_EQ(stats.returned_error, 0);
}

}  // namespace
}  // namespace centroidkv::client
