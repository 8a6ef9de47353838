// Tests of bench/service/load.cc (centroidkv-bench): argument handling, percentiles, and
// short real runs against a server on loopback.
#include "bench/service/load.h"

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "service/server.h"

namespace centroidkv::bench {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LoadArgsTest, PresetsHaveTheModelsShapes) {
  struct Case {
    const char* name;
    int32_t layers, heads, dim;
  };
  for (const Case& c : {Case{"llama3-8b", 32, 8, 128}, Case{"qwen2.5-7b", 28, 4, 128},
                        Case{"llama3-70b", 80, 8, 128}}) {
    absl::StatusOr<LoadConfig> config = ParseLoadArgs({"--preset", c.name});
    ASSERT_TRUE(config.ok()) << c.name << ": " << config.status();
    EXPECT_EQ(config->preset.layers, c.layers) << c.name;
    EXPECT_EQ(config->preset.kv_heads, c.heads) << c.name;
    EXPECT_EQ(config->preset.head_dim, c.dim) << c.name;
    EXPECT_EQ(config->jobs, c.layers) << "default: one sequence, one job per layer";
  }
}

TEST(LoadArgsTest, DefaultsAndFlags) {
  absl::StatusOr<LoadConfig> config = ParseLoadArgs(
      {"--server", "127.0.0.1:1234", "--concurrency", "3", "--jobs", "17", "--rate", "5",
       "--context", "1024", "--dtype", "bfloat16", "--backend", "identity", "--format", "csv",
       "--target-tokens", "100", "--chunk-size", "128", "--sink-tokens", "4",
       "--recent-tokens", "8", "--min-similarity", "0.5", "--max-passes", "3",
       "--passthrough-heads", "0,2", "--output-dtype", "float32", "--threads", "3",
       "--pipeline", "5", "--rounds", "3"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "127.0.0.1:1234");
  EXPECT_EQ(config->concurrency, 3);
  EXPECT_EQ(config->jobs, 17);
  EXPECT_EQ(config->rate, 5.0);
  EXPECT_EQ(config->context, 1024);
  EXPECT_EQ(config->dtype, DType::kBFloat16);
  EXPECT_EQ(config->backend, BackendKind::kIdentity);
  EXPECT_EQ(config->format, "csv");
  EXPECT_EQ(config->options.target_tokens, 100);
  EXPECT_FALSE(config->options.target_ratio.has_value());
  EXPECT_EQ(config->options.chunk_size, 128);
  EXPECT_EQ(config->options.sink_tokens, 4);
  EXPECT_EQ(config->options.recent_tokens, 8);
  EXPECT_EQ(config->options.min_similarity, 0.5);
  EXPECT_EQ(config->options.max_passes, 3);
  EXPECT_EQ(config->options.passthrough_heads, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(config->output_dtype, DType::kFloat32);
  EXPECT_EQ(config->threads, 3);
  EXPECT_EQ(config->pipeline, 5);
  EXPECT_EQ(config->rounds, 3);
  EXPECT_EQ(config->TokensPerJob(), 8 * 1024);
  EXPECT_EQ(config->BytesPerJob(), 2 * 8 * 1024 * 128 * 2);

  absl::StatusOr<LoadConfig> plain = ParseLoadArgs({});
  ASSERT_TRUE(plain.ok()) << plain.status();
  // Neither target: the engine's default ratio (CompressOptions::kDefaultTargetRatio).
  EXPECT_FALSE(plain->options.target_ratio.has_value());
  EXPECT_FALSE(plain->options.target_tokens.has_value());
  EXPECT_FALSE(plain->options.compute_assignment) << "off by default in the bench";
  EXPECT_FALSE(plain->options.min_similarity.has_value());
  EXPECT_EQ(plain->backend, BackendKind::kAuto);
  EXPECT_EQ(plain->dtype, DType::kFloat16);
  EXPECT_EQ(plain->threads, 0) << "default: the server's thread count";
}

TEST(LoadArgsTest, DurationInsteadOfJobs) {
  absl::StatusOr<LoadConfig> config = ParseLoadArgs({"--duration", "2.5"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->jobs, 0);
  EXPECT_EQ(config->duration_s, 2.5);
  absl::StatusOr<LoadConfig> both = ParseLoadArgs({"--jobs", "4", "--duration", "2"});
  ASSERT_FALSE(both.ok());
  EXPECT_TRUE(Contains(std::string(both.status().message()), "--duration"));
}

TEST(LoadArgsTest, BadValuesAreRejectedNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* expected;
  };
  const Case cases[] = {
      {{"--preset", "gpt-5"}, "--preset"},
      {{"--dtype", "int8"}, "--dtype"},
      {{"--backend", "tpu"}, "--backend"},
      {{"--format", "xml"}, "--format"},
      {{"--concurrency", "0"}, "--concurrency"},
      {{"--pipeline", "0"}, "--pipeline"},
      {{"--jobs", "-3"}, "--jobs"},
      {{"--rate", "-1"}, "--rate"},
      {{"--context", "0"}, "--context"},
      {{"--output-dtype", "int4"}, "--output-dtype"},
      {{"--slab-kib", "1"}, "--slab-kib"},
      {{"--threads", "-1"}, "--threads"},
      {{"--rounds", "0"}, "--rounds"},
      {{"--target-ratio", "0.5", "--target-tokens", "10"}, "--target-tokens"},
      {{"--chunk-size", "1"}, "chunk_size"},
      {{"--target-ratio", "1.5"}, "target_ratio"},
      {{"--concurrency", "many"}, "concurrency"},
      {{"--no-such-flag"}, "no-such-flag"},
      {{"--decode", "--compare"}, "--decode"},
      {{"--output-scale", "0.1"}, "--output-scale"},  // float16 results have no scales
      {{"--dtype", "fp8_e4m3", "--output-scale", "-1"}, "output_key_scales"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<LoadConfig> config = ParseLoadArgs(c.args);
    ASSERT_FALSE(config.ok()) << c.args[0] << " accepted";
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(config.status().message()), c.expected)) << c.args[0];
  }
}

// --decode: decode-time jobs of 256 new tokens per head unless --context says otherwise,
// on the cpu backend.
TEST(LoadConfigTest, DecodeDefaultsToSmallJobs) {
  absl::StatusOr<LoadConfig> decode = ParseLoadArgs({"--decode"});
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_TRUE(decode->decode);
  EXPECT_EQ(decode->context, 256);
  EXPECT_EQ(decode->backend, BackendKind::kCpu);
  absl::StatusOr<LoadConfig> given = ParseLoadArgs({"--decode", "--context", "512"});
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->context, 512);
  absl::StatusOr<LoadConfig> plain = ParseLoadArgs({});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->decode);
  EXPECT_EQ(plain->context, 4096);
}

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  EXPECT_EQ(Percentile({}, 0.5), 0.0);
  EXPECT_EQ(Percentile({7.0}, 0.99), 7.0);
  const std::vector<double> v = {5, 1, 4, 2, 3};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.9), 4.6);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 5.0);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(hundred, 0.99), 99.01);
}

TEST(RunStatsTest, SummarizesRecords) {
  RunStats stats;
  stats.wall_s = 2.0;
  stats.records = {{0.010, "OK", 100, 25, 1000},
                   {0.020, "OK", 100, 25, 1000},
                   {0.5, "RESOURCE_EXHAUSTED", 100, 0, 1000}};
  EXPECT_EQ(stats.jobs_ok(), 2);
  EXPECT_EQ(stats.jobs_failed(), 1);
  EXPECT_DOUBLE_EQ(stats.tokens_per_s(), 100.0);
  EXPECT_DOUBLE_EQ(stats.gb_per_s(), 1000e-9);
  EXPECT_DOUBLE_EQ(stats.compression(), 0.25);
  EXPECT_DOUBLE_EQ(stats.latency_ms(0.5), 15.0);
  EXPECT_EQ(stats.errors(), (std::map<std::string, int64_t>{{"RESOURCE_EXHAUSTED", 1}}));
}

class LoadRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.worker_threads = 2;
    absl::StatusOr<std::unique_ptr<service::Server>> server = service::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }
  LoadConfig Config(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--server", server_->target(), "--preset", "qwen2.5-7b",
                                     "--context", "256", "--distinct-layers", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<LoadConfig> config = ParseLoadArgs(args);
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? *config : LoadConfig{};
  }
  std::unique_ptr<service::Server> server_;
};

TEST_F(LoadRunTest, CompletesEveryJobWithTheTargetCompression) {
  // No sink or recent window, so that the target is reachable within the passes.
  const LoadConfig config = Config({"--jobs", "8", "--concurrency", "2", "--backend", "cpu",
                                    "--sink-tokens", "0", "--recent-tokens", "0"});
  const Dataset data = MakeDataset(config);
  int64_t last_done = -1;
  const RunStats stats = RunService(config, data, config.backend,
                                    [&](int64_t done, int64_t, double) { last_done = done; });
  EXPECT_EQ(stats.fatal, "");
  EXPECT_EQ(stats.jobs_ok(), 8);
  EXPECT_EQ(stats.jobs_failed(), 0);
  EXPECT_TRUE(stats.errors().empty());
  EXPECT_EQ(last_done, 8);
  // target_ratio 0.25 with uniform heads: every head keeps ceil(0.25 * 256) = 64 entries.
  EXPECT_NEAR(stats.compression(), 0.25, 0.01);
  EXPECT_GT(stats.tokens_per_s(), 0);
  EXPECT_GT(stats.latency_ms(0.99), 0);
  EXPECT_GE(stats.latency_ms(0.99), stats.latency_ms(0.5));
}

TEST_F(LoadRunTest, TheFloorAnswersWithARealJobsShape) {
  // The floor (identity) must move the same bytes as the real job: the same entries out.
  for (const char* dtype : {"float32", "float16"}) {
    const LoadConfig config = Config({"--jobs", "6", "--dtype", dtype, "--sink-tokens", "0",
                                      "--recent-tokens", "0", "--passthrough-heads", "1"});
    const Dataset data = MakeDataset(config);
    const RunStats floor = RunService(config, data, BackendKind::kIdentity);
    const RunStats real = RunService(config, data, BackendKind::kCpu);
    ASSERT_EQ(floor.fatal, "");
    ASSERT_EQ(real.fatal, "");
    ASSERT_EQ(floor.jobs_ok(), 6);
    ASSERT_EQ(real.jobs_ok(), 6);
    for (size_t i = 0; i < floor.records.size(); ++i) {
      EXPECT_EQ(floor.records[i].entries_out, real.records[i].entries_out) << dtype << " " << i;
    }
    // qwen2.5-7b: 4 heads of 256; head 1 passes through, the others keep 64.
    EXPECT_EQ(floor.records[0].entries_out, 3 * 64 + 256) << dtype;
    EXPECT_EQ(floor.threads, 2) << "the server's clustering threads, from GetInfo";
  }
}

// fp8 in (codes with per-head scales) and out (dynamic or static scales), through the
// service and the in-process engine: every job completes with the target compression.
TEST_F(LoadRunTest, Fp8JobsInAndOut) {
  const std::vector<std::vector<std::string>> variants = {
      {"--dtype", "fp8_e4m3"},
      {"--dtype", "fp8_e4m3", "--output-scale", "0.05"},
      {"--dtype", "fp8_e5m2", "--output-dtype", "float16"},
      {"--dtype", "float16", "--output-dtype", "fp8_e4m3", "--output-scale", "0.02"}};
  for (const std::vector<std::string>& variant : variants) {
    SCOPED_TRACE(variant[1] + " " + variant.back());
    std::vector<std::string> args = {"--jobs", "4", "--sink-tokens", "0", "--recent-tokens", "0"};
    args.insert(args.end(), variant.begin(), variant.end());
    const LoadConfig config = Config(args);
    const Dataset data = MakeDataset(config);
    const LayerView view = data.View(config, 1);
    if (IsFp8(config.dtype)) {  // codes with each head's scale from its largest magnitude
      ASSERT_EQ(view.key_scales.size(), 4u);
      ASSERT_EQ(view.value_scales.size(), 4u);
      EXPECT_GT(view.key_scales[0], 0.0f);
      EXPECT_NE(view.key_scales[0], data.View(config, 0).key_scales[0]) << "per layer";
      EXPECT_EQ(config.BytesPerJob(), 2 * 4 * 256 * 128);
    }
    const RunStats service = RunService(config, data, BackendKind::kCpu);
    const RunStats in_process = RunInProcess(config, data, BackendKind::kCpu, 1);
    for (const RunStats* stats : {&service, &in_process}) {
      EXPECT_EQ(stats->fatal, "") << stats->label;
      EXPECT_EQ(stats->jobs_ok(), 4) << stats->label;
      EXPECT_NEAR(stats->compression(), 0.25, 0.01) << stats->label;
    }
  }
}

TEST_F(LoadRunTest, InProcessRunsOnAnExecutorOfTheGivenThreads) {
  const LoadConfig config = Config({"--jobs", "6", "--concurrency", "2", "--sink-tokens", "0",
                                    "--recent-tokens", "0"});
  EXPECT_EQ(ServerThreads(config), 2);
  const RunStats stats = RunInProcess(config, MakeDataset(config), BackendKind::kCpu, 1);
  EXPECT_EQ(stats.fatal, "");
  EXPECT_EQ(stats.jobs_ok(), 6);
  EXPECT_EQ(stats.threads, 1);
  EXPECT_NEAR(stats.compression(), 0.25, 0.01);
  EXPECT_GT(stats.mean_compute_ms(), 0.0);
  EXPECT_GE(stats.mean_latency_ms(), stats.mean_compute_ms());
}

TEST_F(LoadRunTest, DurationAndRate) {
  const LoadConfig config = Config({"--duration", "0.6", "--rate", "10", "--backend", "cpu"});
  const RunStats stats = RunService(config, MakeDataset(config), config.backend);
  EXPECT_EQ(stats.fatal, "");
  EXPECT_EQ(stats.jobs_failed(), 0);
  // 10 jobs/s for 0.6 s: tickets at 0, 0.1, ..., 0.5 s.
  EXPECT_GE(stats.jobs_ok(), 4);
  EXPECT_LE(stats.jobs_ok(), 7);
  EXPECT_GE(stats.wall_s, 0.45);
}

TEST_F(LoadRunTest, UnreachableServerIsAnError) {
  LoadConfig config = Config({"--jobs", "2", "--connect-timeout", "0.5"});
  config.server = "127.0.0.1:1";
  const RunStats stats = RunService(config, MakeDataset(config), BackendKind::kCpu);
  EXPECT_NE(stats.fatal, "");
  EXPECT_EQ(stats.jobs_ok(), 0);
}

TEST_F(LoadRunTest, JsonSummary) {
  std::ostringstream out, err;
  const int rc = BenchMain({"--server", server_->target(), "--preset", "qwen2.5-7b",
                            "--context", "256", "--jobs", "4", "--format", "json", "--quiet"},
                           out, err);
  ASSERT_EQ(rc, 0) << err.str() << out.str();
  const nlohmann::json summary = nlohmann::json::parse(out.str());
  EXPECT_EQ(summary["jobs"], 4);
  EXPECT_EQ(summary["jobs_failed"], 0);
  EXPECT_TRUE(summary["errors"].empty());
  EXPECT_TRUE(summary["latency_ms"].contains("p99"));
  EXPECT_EQ(summary["threads"], 2);
  // The server reports its queue and engine time per job; both fit inside the latency.
  EXPECT_GT(summary["compute_ms_mean"].get<double>(), 0.0);
  EXPECT_LE(summary["compute_ms_mean"].get<double>() + summary["queue_ms_mean"].get<double>(),
            summary["latency_ms"]["mean"].get<double>());
}

TEST_F(LoadRunTest, CompareEndsWithOneJsonLine) {
  std::ostringstream out, err;
  const int rc = BenchMain({"--server", server_->target(), "--preset", "qwen2.5-7b",
                            "--context", "256", "--jobs", "8", "--concurrency", "2",
                            "--compare", "--rounds", "2", "--quiet"},
                           out, err);
  ASSERT_EQ(rc, 0) << err.str() << out.str();
  const std::string text = out.str();
  EXPECT_TRUE(Contains(text, "service:cpu"));
  EXPECT_TRUE(Contains(text, "service:identity"));
  EXPECT_TRUE(Contains(text, "in-process:cpu #2"));
  const size_t start = text.rfind('\n', text.size() - 2);
  const nlohmann::json line = nlohmann::json::parse(text.substr(start + 1));
  for (const char* key : {"service_tokens_per_s", "floor_tokens_per_s",
                          "in_process_tokens_per_s", "ratio_to_serial_bound"}) {
    ASSERT_TRUE(line.contains(key)) << key;
    EXPECT_GT(line[key].get<double>(), 0.0) << key;
  }
  // The in-process engine got the server's thread count; the ratio is the stated formula.
  EXPECT_EQ(line["server_threads"], 2);
  EXPECT_EQ(line["in_process_threads"], 2);
  EXPECT_EQ(line["rounds"], 2);
  EXPECT_EQ(line["ratio_per_round"].size(), 2u);
  const double f = line["floor_tokens_per_s"], p = line["in_process_tokens_per_s"];
  EXPECT_NEAR(line["ratio_to_serial_bound"].get<double>(),
              line["service_tokens_per_s"].get<double>() * (1.0 / f + 1.0 / p), 1e-3);
}

// --decode against a real server (TCP here: no shared memory legs): both load shapes, the
// in-process engine and the service over slabs, every job done, and one JSON line whose
// legs carry jobs/s, tokens/s and latencies, and whose ratios are those of the legs.
TEST_F(LoadRunTest, DecodeRunsBothShapesAndEndsWithOneJsonLine) {
  std::ostringstream out, err;
  const int rc = BenchMain({"--server", server_->target(), "--preset", "qwen2.5-7b", "--decode",
                            "--jobs", "6", "--concurrency", "2", "--pipeline", "2",
                            "--rounds", "2", "--quiet"},
                           out, err);
  ASSERT_EQ(rc, 0) << err.str() << out.str();
  const std::string text = out.str();
  EXPECT_TRUE(Contains(text, "decode 2x2 in-process:cpu #1"));
  EXPECT_TRUE(Contains(text, "decode 1x1 service:cpu #2"));
  EXPECT_TRUE(Contains(text, "concurrency 1 x 1 in flight"));
  EXPECT_FALSE(Contains(text, "+shm"));
  const size_t start = text.rfind('\n', text.size() - 2);
  const nlohmann::json line = nlohmann::json::parse(text.substr(start + 1));
  const nlohmann::json& decode = line["decode"];
  EXPECT_EQ(decode["new_tokens"], 256);
  EXPECT_EQ(decode["heads"], 4);
  EXPECT_EQ(decode["rounds"], 2);
  EXPECT_EQ(decode["server_threads"], 2);
  EXPECT_EQ(decode["throughput"]["concurrency"], 2);
  EXPECT_EQ(decode["latency"]["pipeline"], 1);
  for (const char* shape : {"throughput", "latency"}) {
    for (const char* leg : {"in_process", "slabs"}) {
      for (const char* key : {"jobs_per_s", "tokens_per_s", "p50_ms", "p99_ms"}) {
        EXPECT_GT(decode[shape][leg][key].get<double>(), 0.0) << shape << " " << leg << " " << key;
      }
      // 6 jobs of 4 heads x 256 tokens: tokens/s is 1024 x jobs/s.
      EXPECT_NEAR(decode[shape][leg]["tokens_per_s"].get<double>() /
                      decode[shape][leg]["jobs_per_s"].get<double>(),
                  1024.0, 0.5);
    }
    EXPECT_FALSE(decode[shape].contains("shm"));
    EXPECT_NEAR(decode[shape]["slabs_tokens_ratio_to_in_process"].get<double>(),
                decode[shape]["slabs"]["tokens_per_s"].get<double>() /
                    decode[shape]["in_process"]["tokens_per_s"].get<double>(),
                1e-3);
  }
}

// One leg's rounds, each a one-second run of `rate` tokens.
std::vector<RunStats> Rounds(const std::vector<double>& rates) {
  std::vector<RunStats> runs;
  for (double rate : rates) {
    RunStats run;
    run.wall_s = 1.0;
    run.records = {{0.1, "OK", static_cast<int64_t>(rate), 1, 1}};
    runs.push_back(run);
  }
  return runs;
}

TEST(CompareJsonTest, MediansOverRoundsAndTheSerialBound) {
  LoadConfig config;
  config.preset = *FindPreset("llama3-8b");
  // Three rounds; each leg's rate is its median: service 300, floor 600, in-process 300.
  const nlohmann::json line = nlohmann::json::parse(
      CompareJson(config, Rounds({100, 300, 900}), Rounds({600, 50, 700}), Rounds({300, 300, 1})));
  EXPECT_DOUBLE_EQ(line["service_tokens_per_s"].get<double>(), 300.0);
  EXPECT_DOUBLE_EQ(line["floor_tokens_per_s"].get<double>(), 600.0);
  EXPECT_DOUBLE_EQ(line["in_process_tokens_per_s"].get<double>(), 300.0);
  EXPECT_DOUBLE_EQ(line["serial_bound_tokens_per_s"].get<double>(), 200.0);
  EXPECT_DOUBLE_EQ(line["ratio_to_serial_bound"].get<double>(), 1.5);
  EXPECT_EQ(line["rounds"], 3);
  // Round 1: 100 / (1 / (1/600 + 1/300)) = 0.5.
  EXPECT_DOUBLE_EQ(line["ratio_per_round"][0].get<double>(), 0.5);
}

TEST(CompareJsonTest, SharedMemoryLegsAgainstTheEngineTheSlabsAndTheFloor) {
  LoadConfig config;
  config.preset = *FindPreset("llama3-8b");
  // Medians: slabs 400, floor 800, in-process 500, shm 450, floor over shm 1200.
  const nlohmann::json line = nlohmann::json::parse(
      CompareJson(config, Rounds({400, 400}), Rounds({800, 800}), Rounds({500, 500}),
                  Rounds({450, 450}), Rounds({1200, 1200})));
  EXPECT_DOUBLE_EQ(line["shm_tokens_per_s"].get<double>(), 450.0);
  EXPECT_DOUBLE_EQ(line["shm_ratio_to_in_process"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(line["shm_ratio_to_slabs"].get<double>(), 1.125);
  EXPECT_DOUBLE_EQ(line["shm_floor_tokens_per_s"].get<double>(), 1200.0);
  EXPECT_DOUBLE_EQ(line["shm_floor_ratio_to_floor"].get<double>(), 1.5);
  // Without --shm the fields are absent.
  const nlohmann::json plain = nlohmann::json::parse(
      CompareJson(config, Rounds({400}), Rounds({800}), Rounds({500})));
  EXPECT_FALSE(plain.contains("shm_tokens_per_s"));
  EXPECT_FALSE(plain.contains("shm_floor_tokens_per_s"));
}

TEST(BenchMainTest, BadFlagExitsWithTwo) {
  std::ostringstream out, err;
  EXPECT_EQ(BenchMain({"--preset", "nope"}, out, err), 2);
  EXPECT_TRUE(Contains(err.str(), "--preset"));
}

}  // namespace
}  // namespace centroidkv::bench
