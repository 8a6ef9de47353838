// /metrics of a real server on loopback (ServiceMetrics, MetricsHttpServer): scraped over
// HTTP while and after jobs run, every scrape parses strictly, and the counters move by
// exactly what the jobs sent, computed and returned.
#include "service/service_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "centroidkv/client/client.h"
#include "tests/service/prometheus_text.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

using Families = std::map<std::string, PromFamily>;

Families Scrape(const Server& server) {
  absl::StatusOr<std::string> text = ScrapeMetrics(server.metrics_port());
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  auto families = ParsePrometheusText(*text);
  EXPECT_TRUE(families.ok()) << families.status() << "\n" << *text;
  return families.ok() ? *families : Families{};
}

double Value(const Families& families, const std::string& family, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  absl::StatusOr<double> value = SampleValue(families, family, name, labels);
  EXPECT_TRUE(value.ok()) << value.status();
  return value.ok() ? *value : -1;
}

ServerOptions MetricsOn() {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  options.worker_threads = 1;  // jobs queue behind each other: queue depth and wait move
  return options;
}

TEST(ServiceMetricsTest, MetricsAreOffUnlessAsked) {
  auto server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->metrics_port(), 0);
}

TEST(ServiceMetricsTest, DescribesEveryFamilyBeforeAnyJob) {
  auto server = StartLoopbackServer(MetricsOn());
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->metrics_port(), 0);
  const Families families = Scrape(*server);
  for (const char* name :
       {"centroidkv_build_info", "centroidkv_draining", "centroidkv_streams_open",
        "centroidkv_streams_total", "centroidkv_jobs_total", "centroidkv_tokens_total",
        "centroidkv_entries_total", "centroidkv_received_bytes_total",
        "centroidkv_sent_bytes_total", "centroidkv_clustering_seconds", kQueueDepthMetric,
        "centroidkv_jobs_in_flight", "centroidkv_queue_wait_seconds",
        "centroidkv_buffered_bytes", "centroidkv_result_pool_idle_bytes",
        "centroidkv_result_pool_idle_results", "centroidkv_result_pool_leased_results",
        "centroidkv_errors_total"}) {
    ASSERT_EQ(families.count(name), 1u) << name;
    EXPECT_FALSE(families.at(name).help.empty()) << name;
    const std::string& type = families.at(name).type;
    const std::string n = name;
    if (type == "counter") {
      EXPECT_EQ(n.substr(n.size() - 6), "_total") << name;
    } else if (type == "histogram") {
      EXPECT_EQ(n.substr(n.size() - 8), "_seconds") << name;
    }
  }
  const PromFamily& build = families.at("centroidkv_build_info");
  ASSERT_EQ(build.samples.size(), 1u);
  EXPECT_EQ(build.samples[0].value, 1);
  EXPECT_FALSE(build.samples[0].labels.at("version").empty());
  EXPECT_FALSE(build.samples[0].labels.at("git_commit").empty());
  EXPECT_NE(build.samples[0].labels.at("backends").find("reference"), std::string::npos);
  EXPECT_EQ(Value(families, kQueueDepthMetric, kQueueDepthMetric), 0);
  EXPECT_EQ(Value(families, "centroidkv_draining", "centroidkv_draining"), 0);
  EXPECT_EQ(Value(families, "centroidkv_streams_total", "centroidkv_streams_total"), 0);
}

TEST(ServiceMetricsTest, CountersMoveWithJobsWhileAndAfterTheyRun) {
  auto server = StartLoopbackServer(MetricsOn());
  ASSERT_NE(server, nullptr);
  constexpr int kJobs = 12;
  std::vector<test::RandomLayer> layers;
  std::vector<client::LayerJob> jobs;
  int64_t tokens = 0;
  uint64_t input_bytes = 0;
  for (int j = 0; j < kJobs; ++j) {
    test::RandomLayerSpec spec;
    spec.num_heads = 1 + j % 3;
    spec.num_tokens = 300 + 50 * j;
    spec.key_dim = 32;
    spec.value_dim = 32;
    spec.prototypes = 6;
    spec.seed = static_cast<uint64_t>(j + 1);
    layers.push_back(test::RandomLayer::Generate(spec));
    tokens += int64_t{spec.num_heads} * spec.num_tokens;
  }
  for (int j = 0; j < kJobs; ++j) {
    client::LayerJob job;
    job.layer_index = static_cast<uint32_t>(j);
    job.layer = layers[j].view();
    job.options.chunk_size = 64;
    job.backend = BackendKind::kReference;  // slow enough to be scraped mid-run
    jobs.push_back(job);
    input_bytes += KeyBytes(job.layer) + ValueBytes(job.layer);
  }

  // Scrape continuously while the jobs run: every scrape parses, counters never go back.
  std::atomic<bool> running{true};
  int scrapes_during = 0;
  double last_jobs = 0, last_in = 0, max_depth = 0, max_in_flight = 0;
  bool monotone = true;
  std::thread scraper([&] {
    while (running.load()) {
      const Families families = Scrape(*server);
      if (families.empty()) break;
      ++scrapes_during;
      const double jobs_now =
          families.at("centroidkv_jobs_total").samples.empty()
              ? 0
              : Value(families, "centroidkv_jobs_total", "centroidkv_jobs_total");
      const double in_now =
          Value(families, "centroidkv_received_bytes_total", "centroidkv_received_bytes_total");
      monotone = monotone && jobs_now >= last_jobs && in_now >= last_in;
      last_jobs = jobs_now;
      last_in = in_now;
      max_depth = std::max(max_depth, Value(families, kQueueDepthMetric, kQueueDepthMetric));
      max_in_flight = std::max(
          max_in_flight, Value(families, "centroidkv_jobs_in_flight", "centroidkv_jobs_in_flight"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  client::ClientOptions client_options;
  client_options.target = server->target();
  auto client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto results = (*client)->CompressLayers(jobs);
  running = false;
  scraper.join();
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_GT(scrapes_during, 0);
  EXPECT_TRUE(monotone);
  // With one thread and twelve pipelined jobs (~0.5 s on the reference backend) some
  // scrape lands while jobs are in the pool.
  EXPECT_GT(max_in_flight, 0) << "no scrape saw a job in flight";
  std::cout << "scrapes while running: " << scrapes_during << ", max queue depth seen "
            << max_depth << ", max jobs in flight " << max_in_flight << "\n";

  int64_t entries = 0;
  uint64_t output_bytes = 0;
  for (const client::LayerResult& result : *results) {
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_EQ(result.backend, "reference");
    entries += result.total_entries();
    output_bytes += result.keys.size() + result.values.size() + 4 * result.counts.size() +
                    4 * result.assignment.size();
  }
  // Streams end (OnDone) just after the client sees the final status, and a pool task
  // returns (jobs_in_flight drops) just after it hands its result to the stream: wait for
  // both before reading the final values.
  Families after = Scrape(*server);
  for (int i = 0;
       i < 200 && (Value(after, "centroidkv_streams_open", "centroidkv_streams_open") != 0 ||
                   Value(after, "centroidkv_jobs_in_flight", "centroidkv_jobs_in_flight") != 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    after = Scrape(*server);
  }
  const std::map<std::string, std::string> reference = {{"backend", "reference"}};
  EXPECT_EQ(Value(after, "centroidkv_jobs_total", "centroidkv_jobs_total", reference), kJobs);
  EXPECT_EQ(Value(after, "centroidkv_tokens_total", "centroidkv_tokens_total", reference), tokens);
  for (const auto& [outcome, count] : std::map<std::string, int>{
           {"completed", kJobs}, {"failed", 0}, {"dropped", 0}}) {
    EXPECT_EQ(Value(after, "centroidkv_job_outcomes_total", "centroidkv_job_outcomes_total",
                    {{"outcome", outcome}}),
              count)
        << outcome;
  }
  EXPECT_EQ(Value(after, "centroidkv_entries_total", "centroidkv_entries_total", reference),
            entries);
  // Wire bytes: the tensors plus message framing (a few bytes per slab and header).
  const double in = Value(after, "centroidkv_received_bytes_total", "centroidkv_received_bytes_total");
  const double out = Value(after, "centroidkv_sent_bytes_total", "centroidkv_sent_bytes_total");
  EXPECT_GE(in, static_cast<double>(input_bytes));
  EXPECT_LT(in, 1.05 * static_cast<double>(input_bytes));
  EXPECT_GE(out, static_cast<double>(output_bytes));
  EXPECT_LT(out, 1.05 * static_cast<double>(output_bytes) + 4096);
  EXPECT_EQ(Value(after, "centroidkv_clustering_seconds", "centroidkv_clustering_seconds_count",
                  reference),
            kJobs);
  EXPECT_GT(Value(after, "centroidkv_clustering_seconds", "centroidkv_clustering_seconds_sum",
                  reference),
            0);
  EXPECT_EQ(Value(after, "centroidkv_queue_wait_seconds", "centroidkv_queue_wait_seconds_count"),
            kJobs);
  EXPECT_EQ(Value(after, kQueueDepthMetric, kQueueDepthMetric), 0);
  EXPECT_EQ(Value(after, "centroidkv_jobs_in_flight", "centroidkv_jobs_in_flight"), 0);
  EXPECT_EQ(Value(after, "centroidkv_buffered_bytes", "centroidkv_buffered_bytes"), 0);
  // Every job's result buffer is back in the pool, and the gauges say what it keeps.
  const ResultPool::Stats pool = server->context().results->stats();
  EXPECT_EQ(Value(after, "centroidkv_result_pool_leased_results",
                  "centroidkv_result_pool_leased_results"),
            0);
  EXPECT_GE(pool.idle_results, 1);
  EXPECT_EQ(Value(after, "centroidkv_result_pool_idle_results",
                  "centroidkv_result_pool_idle_results"),
            static_cast<double>(pool.idle_results));
  EXPECT_EQ(Value(after, "centroidkv_result_pool_idle_bytes", "centroidkv_result_pool_idle_bytes"),
            static_cast<double>(pool.idle_bytes));
  EXPECT_EQ(Value(after, "centroidkv_streams_total", "centroidkv_streams_total"),
            static_cast<double>(server->context().metrics.streams_opened()));
  EXPECT_EQ(Value(after, "centroidkv_streams_open", "centroidkv_streams_open"), 0);
  EXPECT_TRUE(after.at("centroidkv_errors_total").samples.empty())
      << "no job failed, so no error is counted";
}

TEST(ServiceMetricsTest, ErrorsAreCountedByStatusCode) {
  auto server = StartLoopbackServer(MetricsOn());
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  for (int i = 0; i < 2; ++i) {
    RawStream stream(stub.get());
    stream.Write(v1::CompressRequest());  // neither start_job, slab nor cancel_job
    EXPECT_EQ(stream.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  const Families families = Scrape(*server);
  EXPECT_EQ(Value(families, "centroidkv_errors_total", "centroidkv_errors_total",
                  {{"code", "INVALID_ARGUMENT"}, {"scope", "stream"}}),
            2);
  EXPECT_EQ(families.at("centroidkv_errors_total").samples.size(), 1u);
  EXPECT_EQ(Value(families, "centroidkv_streams_total", "centroidkv_streams_total"), 2);
}

TEST(ServiceMetricsTest, BusyMetricsPortFailsStart) {
  auto first = StartLoopbackServer(MetricsOn());
  ASSERT_NE(first, nullptr);
  ServerOptions options = MetricsOn();
  options.listen_address = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:" + std::to_string(first->metrics_port());
  auto second = Server::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("metrics_listen"), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace centroidkv::service::testing
