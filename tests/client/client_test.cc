// Tests of the client library (client/client.cc) against a real in-process Server on
// loopback: the golden cases through CompressLayers, many jobs pipelined on one stream and
// several streams at once (each result identical to the in-process engine), output dtypes
// and layouts, GetInfo, connection failures, and a server on a unix socket. The stream's
// own behaviour (cancel, deadlines, failures) is in compress_stream_impl_test.cc.
#include "centroidkv/client/client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;
using testutil::AsEngineResult;
using testutil::CamelCase;
using testutil::EngineResult;
using testutil::ExpectSameAsEngine;
using testutil::JobSet;
using testutil::MakeVariedJobs;
using testutil::RunPipelined;
using testutil::UnusedPort;

class ClientTest : public testutil::ServerTest {};

// ---------------------------------------------------------------------------------------
// Golden cases.

class GoldenClientTest : public testutil::ServerTest,
                         public ::testing::WithParamInterface<std::string> {};

TEST_P(GoldenClientTest, CompressLayersMatchesGolden) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(GetParam());
  ASSERT_TRUE(golden.ok()) << golden.status();
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  LayerJob job;
  job.layer_index = 3;
  job.layer = test::GoldenLayerView(*golden);
  job.options = golden->options;
  job.options.compute_assignment = true;
  job.output_dtype = DType::kFloat32;
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers({job});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 1u);
  const LayerResult& result = (*results)[0];
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(result.layer_index, 3u);
  EXPECT_EQ(result.dtype, DType::kFloat32);
  EXPECT_FALSE(result.backend.empty());
  test::ExpectMatchesGolden(*golden, AsEngineResult(result));
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenClientTest, ::testing::ValuesIn(test::ListGoldenCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return CamelCase(info.param);
                         });

// Every golden case as one pipelined CompressLayers call: results come back in job order.
TEST_F(ClientTest, AllGoldenCasesOnOneStream) {
  const std::vector<std::string> names = test::ListGoldenCases();
  ASSERT_FALSE(names.empty()) << "no golden cases under " << test::GoldenRoot();
  std::vector<test::GoldenCase> cases;
  std::vector<LayerJob> jobs;
  for (const std::string& name : names) {
    absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    cases.push_back(*std::move(golden));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    LayerJob job;
    job.layer_index = static_cast<uint32_t>(i);
    job.layer = test::GoldenLayerView(cases[i]);
    job.options = cases[i].options;
    job.output_dtype = DType::kFloat32;
    jobs.push_back(job);
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers(jobs);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    ASSERT_TRUE((*results)[i].status.ok()) << (*results)[i].status;
    EXPECT_EQ((*results)[i].layer_index, i);
    test::ExpectMatchesGolden(cases[i], AsEngineResult((*results)[i]));
  }
}

// ---------------------------------------------------------------------------------------
// Pipelining and concurrency against the in-process engine.

TEST_F(ClientTest, ManyJobsPipelinedOnOneStreamMatchTheEngine) {
  const JobSet set = MakeVariedJobs(40, 1000, 500);
  ClientOptions options = Options();
  options.slab_bytes = 16 << 10;  // several slabs per tensor
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  RunPipelined(stream.get(), set.jobs, set.specs);
}

TEST_F(ClientTest, ConcurrentStreamsFromSeveralThreads) {
  constexpr int kThreads = 4;
  std::vector<JobSet> sets;
  for (int t = 0; t < kThreads; ++t) sets.push_back(MakeVariedJobs(8, 2000 + 100 * t, 100 * t));
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&client, &sets, t] {
      std::unique_ptr<CompressStream> stream = client->OpenStream();
      RunPipelined(stream.get(), sets[t].jobs, sets[t].specs);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// One stream used from two threads at once: one submits, the other reads. Next() returns
// OutOfRange whenever nothing is outstanding, so the reader polls until it has everything.
TEST_F(ClientTest, SubmitAndNextFromDifferentThreads) {
  const JobSet set = MakeVariedJobs(12, 3000, 0);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  std::thread submitter([&] {
    for (const LayerJob& job : set.jobs) {
      EXPECT_TRUE(stream->Submit(job).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<uint32_t> layers;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (layers.size() < set.jobs.size() && std::chrono::steady_clock::now() < give_up) {
    absl::StatusOr<LayerResult> result = stream->Next();
    if (result.status().code() == absl::StatusCode::kOutOfRange) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok() || result->layer_index >= set.jobs.size()) break;
    const LayerJob& job = set.jobs[result->layer_index];
    ExpectSameAsEngine(EngineResult(job), job.output_dtype.value_or(job.layer.dtype), *result);
    layers.push_back(result->layer_index);
  }
  submitter.join();
  std::sort(layers.begin(), layers.end());
  ASSERT_EQ(layers.size(), set.jobs.size());
  for (size_t i = 0; i < layers.size(); ++i) EXPECT_EQ(layers[i], i);
  EXPECT_TRUE(stream->Close().ok());
}

// ---------------------------------------------------------------------------------------
// Output dtype and layout.

TEST_F(ClientTest, HalfOutputDTypesAreTheFloat32ResultRoundedOnce) {
  RandomLayerSpec spec{.num_heads = 3, .num_tokens = 200, .key_dim = 32, .value_dim = 24,
      .with_counts = true, .prototypes = 5, .seed = 41};
  SCOPED_TRACE(spec.ToString());
  const RandomLayer layer = RandomLayer::Generate(spec);
  std::vector<LayerJob> jobs(3);
  const DType outputs[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (int i = 0; i < 3; ++i) {
    jobs[i].layer = layer.view();
    jobs[i].options.chunk_size = 32;
    jobs[i].options.sink_tokens = 4;
    jobs[i].options.recent_tokens = 8;
    jobs[i].output_dtype = outputs[i];
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers(jobs);
  ASSERT_TRUE(results.ok()) << results.status();
  const LayerResult& exact = (*results)[0];
  ASSERT_TRUE(exact.status.ok()) << exact.status;
  const CompressResult exact_result = AsEngineResult(exact);
  ASSERT_GT(exact.total_entries(), 0);
  EXPECT_LT(exact.total_entries(), int64_t{3} * 200);
  for (int i = 1; i < 3; ++i) {
    SCOPED_TRACE(DTypeName(outputs[i]));
    const LayerResult& rounded = (*results)[i];
    EXPECT_EQ(rounded.keys.size(), static_cast<size_t>(exact.total_entries() * 32 * 2));
    EXPECT_EQ(rounded.values.size(), static_cast<size_t>(exact.total_entries() * 24 * 2));
    ExpectSameAsEngine(exact_result, outputs[i], rounded);
  }
}

// A job the server refuses at its StartJob is answered while its slabs are still going out;
// once Next() has returned the error, the rest is not sent and its buffers are the caller's
// (ASan sees a read of the freed buffers otherwise).
TEST_F(ClientTest, ARefusedJobsBuffersAreFreeOnceItsErrorIsReturned) {
  RandomLayerSpec big{.num_heads = 4, .num_tokens = 4096, .key_dim = 64, .value_dim = 64,
      .seed = 43};
  auto refused_layer = std::make_unique<RandomLayer>(RandomLayer::Generate(big));
  ClientOptions options = Options();
  options.slab_bytes = 16 << 10;  // 512 slabs for the keys alone
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  LayerJob refused;
  refused.layer = refused_layer->view();
  refused.options.chunk_size = 1;
  ASSERT_TRUE(stream->Submit(refused).ok());
  absl::StatusOr<LayerResult> error = stream->Next();
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->status.code(), absl::StatusCode::kInvalidArgument) << error->status;
  refused_layer.reset();
  // The stream goes on with the next job.
  const RandomLayer layer = RandomLayer::Generate(
      {.num_heads = 2, .num_tokens = 300, .key_dim = 16, .value_dim = 16, .seed = 44});
  LayerJob good;
  good.layer = layer.view();
  ASSERT_TRUE(stream->Submit(good).ok());
  absl::StatusOr<LayerResult> got = stream->Next();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->status.ok()) << got->status;
  ExpectSameAsEngine(EngineResult(good), DType::kFloat32, *got);
  EXPECT_TRUE(stream->Close().ok());
}

TEST_F(ClientTest, TokenMajorGivesTheSameResultAsHeadMajor) {
  RandomLayerSpec spec{.num_heads = 4, .num_tokens = 150, .key_dim = 16, .value_dim = 8,
      .with_counts = true, .prototypes = 4, .seed = 43};
  SCOPED_TRACE(spec.ToString());
  const RandomLayer head_major = RandomLayer::Generate(spec);
  const RandomLayer token_major = head_major.WithLayout(TensorLayout::kTokenMajor);
  std::vector<LayerJob> jobs(2);
  jobs[0].layer = head_major.view();
  jobs[1].layer = token_major.view();
  for (LayerJob& job : jobs) {
    job.options.chunk_size = 16;
    job.options.sink_tokens = 2;
    job.options.recent_tokens = 2;
    job.options.min_similarity = 0.5;
    job.options.uniform_heads = false;
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers(jobs);
  ASSERT_TRUE(results.ok()) << results.status();
  const CompressResult from_head_major = AsEngineResult((*results)[0]);
  ASSERT_GT(from_head_major.total_entries(), 0);
  ExpectSameAsEngine(from_head_major, DType::kFloat32, (*results)[1]);
  ExpectSameAsEngine(EngineResult(jobs[0]), DType::kFloat32, (*results)[0]);
}

// ---------------------------------------------------------------------------------------
// GetInfo and connecting.

TEST_F(ClientTest, GetInfoDescribesTheServer) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ServerInfo> info = client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version, CKV_TEST_PROJECT_VERSION);
  EXPECT_NE(std::find(info->backends.begin(), info->backends.end(), "reference"),
            info->backends.end());
  EXPECT_NE(std::find(info->backends.begin(), info->backends.end(), info->default_backend),
            info->backends.end())
      << "default backend " << info->default_backend;
  const service::ServerOptions options = testutil::TestServerOptions("");
  EXPECT_EQ(info->max_job_bytes, static_cast<int64_t>(testutil::kTestMaxJobBytes));
  EXPECT_EQ(info->max_stream_bytes, static_cast<int64_t>(testutil::kTestMaxStreamBytes));
  EXPECT_EQ(info->max_total_bytes, static_cast<int64_t>(options.max_total_bytes));
  EXPECT_EQ(info->max_message_bytes, options.max_message_bytes);
  EXPECT_EQ(info->max_heads, options.engine_limits.max_heads);
  EXPECT_EQ(info->max_tokens, options.engine_limits.max_tokens);
  EXPECT_EQ(info->max_dim, options.engine_limits.max_dim);
  EXPECT_EQ(info->max_chunk_size, options.engine_limits.max_chunk_size);
}

TEST(ClientConnectTest, NothingListeningIsUnavailableWithinTheTimeout) {
  const int port = UnusedPort();
  ASSERT_NE(port, 0);
  ClientOptions options;
  options.target = "127.0.0.1:" + std::to_string(port);
  options.connect_timeout = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  EXPECT_NE(client.status().message().find(options.target), absl::string_view::npos)
      << client.status();
  EXPECT_LT(elapsed, std::chrono::seconds(3));
}

TEST(ClientConnectTest, RejectsSlabBytesOutsideTheMessageLimit) {
  for (int32_t slab_bytes : {0, 1023, 8 << 20}) {
    ClientOptions options;
    options.slab_bytes = slab_bytes;
    options.connect_timeout = std::chrono::milliseconds(0);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_FALSE(client.ok()) << slab_bytes;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("slab_bytes"), absl::string_view::npos);
  }
}

// The same protocol over a unix domain socket (how a worker reaches a sidecar server).
TEST(ClientUnixSocketTest, CompressesOverAUnixSocket) {
  const std::string path = "/tmp/ckv-test-" + std::to_string(getpid()) + ".sock";
  std::filesystem::remove(path);
  {
    auto server = service::Server::Start(testutil::TestServerOptions("unix://" + path));
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->target(), "unix://" + path);
    EXPECT_TRUE(std::filesystem::exists(path));
    ClientOptions options;
    options.target = (*server)->target();
    options.connect_timeout = std::chrono::seconds(5);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<ServerInfo> info = (*client)->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->version, CKV_TEST_PROJECT_VERSION);
    const JobSet set = MakeVariedJobs(6, 4000, 20);
    std::unique_ptr<CompressStream> stream = (*client)->OpenStream();
    RunPipelined(stream.get(), set.jobs, set.specs);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace centroidkv::client
