// Losing replicas loses no work: three real centroidkv-server processes on
// loopback, a ReplicaPool over all three with many layer jobs in flight; one replica is
// killed with SIGKILL and another sent SIGTERM mid-run, each while it has jobs in flight.
// Every job's result must arrive exactly once and equal, bit for bit (counts, assignment,
// keys, values), what the engine gives in-process, i.e. what a run without failures gives.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/client/replica_pool.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "tests/client/client_testing.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/server_process.h"

namespace centroidkv::client {
namespace {

using Clock = std::chrono::steady_clock;

using centroidkv::testing::ServerProcess;

// Each replica: one oneTBB thread, a grace period long enough to drain what it holds.
bool StartReplica(ServerProcess& server) {
  return server.Start({"--listen", "127.0.0.1:0", "--threads", "1", "--grace-period", "10"});
}

std::string PeerOf(const ServerProcess& server) { return "ipv4:" + server.target(); }

// Jobs of modest size (a few ms each on the cpu backend), all different: kLayers random
// layers, each compressed with count / kLayers different parameter sets.
struct Workload {
  std::vector<test::RandomLayer> layers;
  std::vector<LayerJob> jobs;
};

Workload MakeWorkload(int count) {
  constexpr int kLayers = 24;
  Workload workload;
  for (int i = 0; i < kLayers; ++i) {
    test::RandomLayerSpec spec;
    spec.num_heads = 4;
    spec.num_tokens = 512 + 64 * (i % 5);
    spec.key_dim = 64;
    spec.value_dim = 64;
    spec.dtype = i % 2 == 0 ? DType::kFloat16 : DType::kFloat32;
    spec.with_counts = i % 3 == 0;
    spec.prototypes = 16;
    spec.noise = 0.2;
    spec.seed = 9000 + static_cast<uint64_t>(i);
    workload.layers.push_back(test::RandomLayer::Generate(spec));
  }
  for (int i = 0; i < count; ++i) {
    const int variant = i / kLayers;
    LayerJob job;
    job.layer_index = static_cast<uint32_t>(i);
    job.layer = workload.layers[static_cast<size_t>(i % kLayers)].view();
    job.options.target_ratio = 0.15 + 0.05 * (variant % 5);
    job.options.chunk_size = variant / 5 % 2 == 0 ? 128 : 64;
    job.options.sink_tokens = 4;
    job.options.recent_tokens = 16;
    job.options.compute_assignment = true;
    job.output_dtype = DType::kFloat32;
    job.backend = BackendKind::kCpu;
    workload.jobs.push_back(job);
  }
  return workload;
}

// Polls `condition` every millisecond for up to `timeout`.
template <typename F>
bool WaitFor(F condition, std::chrono::seconds timeout) {
  const auto give_up = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

int64_t Get(const PoolStats& stats, const std::string& peer, int64_t ReplicaStats::*field) {
  const auto it = stats.replicas.find(peer);
  return it == stats.replicas.end() ? 0 : it->second.*field;
}

TEST(ReplicaFailoverTest, KilledAndDrainedReplicasLoseNoJobAndDuplicateNone) {
  constexpr int kJobs = 240;
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::string target;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>());
    ASSERT_TRUE(StartReplica(*servers.back())) << "server " << i << " did not start:\n"
                                          << servers.back()->Log();
    target += (target.empty() ? "" : ",") + servers.back()->target();
  }
  const Workload workload = MakeWorkload(kJobs);

  PoolOptions options;
  options.client.target = target;
  options.client.connect_timeout = std::chrono::seconds(10);
  options.jobs_per_stream = 4;
  options.stream_job_limit = 16;
  options.retry.initial_backoff = std::chrono::milliseconds(20);
  options.retry.max_backoff = std::chrono::milliseconds(200);
  options.retry.max_attempts = 8;
  absl::StatusOr<std::unique_ptr<ReplicaPool>> pool = ReplicaPool::Connect(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::unique_ptr<CompressStream> stream = (*pool)->OpenStream();
  std::map<uint64_t, size_t> index_of;
  for (size_t i = 0; i < workload.jobs.size(); ++i) {
    absl::StatusOr<uint64_t> id = stream->Submit(workload.jobs[i]);
    ASSERT_TRUE(id.ok()) << id.status();
    index_of[*id] = i;
  }

  // The controller: once every replica has answered, SIGKILL the busiest; 20 results later,
  // SIGTERM the busiest of the other two. Each must have jobs in flight when signalled.
  ServerProcess* killed = nullptr;
  ServerProcess* drained = nullptr;
  int64_t in_flight_at_kill = 0, in_flight_at_term = 0;
  bool every_replica_answered = false, run_went_on = false;
  std::thread controller([&] {
    ReplicaPool& p = **pool;
    every_replica_answered = WaitFor(
        [&] {
          const PoolStats stats = p.stats();
          for (const auto& server : servers) {
            if (Get(stats, PeerOf(*server), &ReplicaStats::results) < 2) return false;
          }
          return true;
        },
        std::chrono::seconds(30));
    if (!every_replica_answered) return;
    auto busiest = [&](ServerProcess* other, int64_t* in_flight) {
      ServerProcess* chosen = nullptr;
      const PoolStats stats = p.stats();
      for (const auto& server : servers) {
        const int64_t n = Get(stats, PeerOf(*server), &ReplicaStats::in_flight);
        if (server.get() != other && (chosen == nullptr || n > *in_flight)) {
          chosen = server.get();
          *in_flight = n;
        }
      }
      return chosen;
    };
    killed = busiest(nullptr, &in_flight_at_kill);
    killed->Signal(SIGKILL);
    const int64_t answered = p.stats().returned_ok;
    run_went_on = WaitFor([&] { return p.stats().returned_ok >= answered + 20; },
                          std::chrono::seconds(30));
    if (!run_went_on) return;
    drained = busiest(killed, &in_flight_at_term);
    drained->Signal(SIGTERM);
  });

  std::vector<int> answers(workload.jobs.size(), 0);
  std::vector<LayerResult> results(workload.jobs.size());
  for (int received = 0; received < kJobs; ++received) {
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    auto it = index_of.find(result->job_id);
    ASSERT_NE(it, index_of.end()) << "result for unknown job id " << result->job_id;
    ++answers[it->second];
    results[it->second] = *std::move(result);
  }
  controller.join();
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Close().ok());

  ASSERT_TRUE(every_replica_answered) << "some replica never got work";
  ASSERT_TRUE(run_went_on) << "the run stalled after the SIGKILL";
  ASSERT_NE(killed, nullptr);
  ASSERT_NE(drained, nullptr);
  EXPECT_GT(in_flight_at_kill, 0) << "the killed replica had no work in flight";
  EXPECT_GT(in_flight_at_term, 0) << "the drained replica had no work in flight";

  // Exactly once, and each result what the engine gives in-process.
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kCpu);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (size_t i = 0; i < workload.jobs.size(); ++i) {
    SCOPED_TRACE("job " + std::to_string(i));
    ASSERT_EQ(answers[i], 1) << "job " << i;
    EXPECT_EQ(results[i].layer_index, workload.jobs[i].layer_index);
    absl::StatusOr<CompressResult> expected =
        (*engine)->Compress(workload.jobs[i].layer, workload.jobs[i].options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    testutil::ExpectSameAsEngine(*expected, DType::kFloat32, results[i]);
  }

  const PoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.submitted, kJobs);
  EXPECT_EQ(stats.returned_ok, kJobs);
  EXPECT_EQ(stats.returned_error, 0);
  EXPECT_GT(stats.retries, 0);
  EXPECT_GT(Get(stats, PeerOf(*killed), &ReplicaStats::resent), 0)
      << "no job was taken back from the killed replica";
  EXPECT_GT(Get(stats, PeerOf(*drained), &ReplicaStats::results), 0);
  EXPECT_EQ(stats.gave_up, 0);

  // The drained replica finished its jobs and exited cleanly within its grace period.
  ASSERT_TRUE(drained->WaitExit(std::chrono::seconds(15))) << drained->Log();
  const int status = drained->exit_status();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << drained->Log();
  std::cerr << "failover: " << stats.retries << " resends (" << stats.job_unavailable
            << " per-job UNAVAILABLE, " << stats.streams_broken << " broken streams), "
            << stats.streams_opened << " streams opened; in flight when signalled: SIGKILL "
            << in_flight_at_kill << ", SIGTERM " << in_flight_at_term << "\n";
}

}  // namespace
}  // namespace centroidkv::client
