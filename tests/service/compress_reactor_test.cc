// The Compress stream protocol against a real server on loopback: results equal the
// in-process engine, several jobs in flight per stream, every malformed input ends the
// stream with the right code and a message naming the field, the server keeps serving,
// and cancelled work is dropped. Result buffers come from the server's ResultPool: jobs
// of different shapes reusing one another's buffers still match the engine bit for bit,
// and every path (result sent, job cancelled, stream failed) gives its buffer back.
#include "service/compress_reactor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

#include "centroidkv/kernels/engine_factory.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::service {
namespace {

using ::centroidkv::service::testing::DecodeResults;
using ::centroidkv::service::testing::KeyBytes;
using ::centroidkv::service::testing::MakeStub;
using ::centroidkv::service::testing::RawStream;
using ::centroidkv::service::testing::SlabRequest;
using ::centroidkv::service::testing::StartJobRequest;
using ::centroidkv::service::testing::StartLoopbackServer;
using ::centroidkv::service::testing::ValueBytes;
using ::centroidkv::test::RandomLayer;
using ::centroidkv::test::RandomLayerSpec;

RandomLayer SmallLayer(uint64_t seed, bool with_counts = false) {
  RandomLayerSpec spec;
  spec.num_heads = 2;
  spec.num_tokens = 96;
  spec.key_dim = 16;
  spec.value_dim = 12;
  spec.prototypes = 6;
  spec.with_counts = with_counts;
  spec.seed = seed;
  return RandomLayer::Generate(spec);
}

CompressOptions SmallOptions() {
  CompressOptions options;
  options.target_ratio = 0.4;
  options.chunk_size = 16;
  options.sink_tokens = 2;
  options.recent_tokens = 8;
  return options;
}

// Waits up to `timeout` for `condition`; returns whether it became true.
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

class CompressReactorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.worker_threads = 2;
    options.grace_period = std::chrono::seconds(2);
    server_ = StartLoopbackServer(options);
    ASSERT_NE(server_, nullptr);
    stub_ = MakeStub(server_->target());
    engines_ = EngineSet::CreateAvailable();
  }

  // What the engine that BACKEND_AUTO selects computes in process.
  CompressResult Expected(const LayerView& layer, const CompressOptions& options) {
    auto engine = engines_->Select(BackendKind::kAuto);
    EXPECT_TRUE(engine.ok());
    auto result = (*engine)->Compress(layer, options);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *std::move(result) : CompressResult{};
  }

  // Runs one valid job on a fresh stream: proves the server still serves.
  void ExpectServerStillServes() {
    RandomLayer layer = SmallLayer(99);
    RawStream stream(stub_.get());
    ASSERT_TRUE(stream.SendJob(7, layer.view(), SmallOptions()));
    std::vector<v1::CompressResponse> responses;
    ASSERT_TRUE(stream.Finish(&responses).ok());
    auto results = DecodeResults(responses);
    ASSERT_EQ(results.count(7), 1u);
    EXPECT_EQ(results[7].counts, Expected(layer.view(), SmallOptions()).counts);
  }

  const ServiceStats& stats() const { return server_->context().stats; }

  // Every result buffer is back in the pool (or freed), within the pool's bounds.
  void ExpectResultsReturned(const Server& server) {
    const ResultPool& pool = *server.context().results;
    EXPECT_TRUE(WaitFor([&] { return pool.stats().leased == 0; }, std::chrono::seconds(20)))
        << pool.stats().leased << " results still leased";
    const ResultPool::Stats stats = pool.stats();
    EXPECT_LE(stats.idle_results, pool.limits().max_idle_results);
    EXPECT_LE(stats.idle_bytes, pool.limits().max_idle_bytes);
    EXPECT_EQ(stats.created - stats.trimmed, stats.idle_results) << "a result went missing";
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::CentroidKV::Stub> stub_;
  std::unique_ptr<EngineSet> engines_;
};

TEST_F(CompressReactorTest, ResultEqualsInProcessEngine) {
  RandomLayer layer = SmallLayer(1, /*with_counts=*/true);
  RawStream stream(stub_.get());
  ASSERT_TRUE(stream.SendJob(42, layer.view(), SmallOptions(), /*slab_bytes=*/1000));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  ASSERT_TRUE(responses.front().has_result());
  EXPECT_EQ(responses.front().result().job_id(), 42u);
  EXPECT_EQ(responses.front().result().backend(),
            std::string((*engines_->Select(BackendKind::kAuto))->name()));
  auto results = DecodeResults(responses);
  const CompressResult expected = Expected(layer.view(), SmallOptions());
  EXPECT_EQ(results[42].offsets, expected.offsets);
  EXPECT_EQ(results[42].counts, expected.counts);
  EXPECT_EQ(results[42].assignment, expected.assignment);
  EXPECT_EQ(results[42].keys, expected.keys);
  EXPECT_EQ(results[42].values, expected.values);
}

TEST_F(CompressReactorTest, GoldenCasesThroughServer) {
  for (const std::string& name : test::ListGoldenCases()) {
    SCOPED_TRACE(name);
    auto golden = test::LoadGoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    RawStream stream(stub_.get());
    CompressOptions options = golden->options;
    options.compute_assignment = true;
    ASSERT_TRUE(stream.SendJob(1, test::GoldenLayerView(*golden), options));
    std::vector<v1::CompressResponse> responses;
    ASSERT_TRUE(stream.Finish(&responses).ok());
    test::ExpectMatchesGolden(*golden, DecodeResults(responses)[1]);
  }
}

TEST_F(CompressReactorTest, SeveralJobsInFlightOnOneStreamComeBackTagged) {
  std::vector<RandomLayer> layers;
  for (uint64_t seed = 10; seed < 16; ++seed) layers.push_back(SmallLayer(seed, seed % 2 == 0));
  RawStream stream(stub_.get());
  // Interleave the slabs of all jobs: every job is in flight at once.
  for (size_t i = 0; i < layers.size(); ++i) {
    ASSERT_TRUE(stream.Write(StartJobRequest(100 + i, layers[i].view(), SmallOptions())));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerView view = layers[i].view();
    ASSERT_TRUE(stream.Write(SlabRequest(100 + i, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view))));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerView view = layers[i].view();
    ASSERT_TRUE(
        stream.Write(SlabRequest(100 + i, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view))));
    if (view.counts != nullptr) {
      ASSERT_TRUE(stream.Write(SlabRequest(100 + i, v1::TENSOR_COUNTS, 0, view.counts,
                                           testing::CountBytes(view))));
    }
  }
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  auto results = DecodeResults(responses);
  ASSERT_EQ(results.size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const CompressResult expected = Expected(layers[i].view(), SmallOptions());
    EXPECT_EQ(results[100 + i].counts, expected.counts) << "job " << 100 + i;
    EXPECT_EQ(results[100 + i].keys, expected.keys) << "job " << 100 + i;
  }
}

// ---------------------------------------------------------------------------------------
// Malformed input: one case per field, each on its own stream.

struct BadInput {
  std::string name;
  // The requests to send, built from a valid small layer.
  std::function<std::vector<v1::CompressRequest>(RandomLayer&)> requests;
  grpc::StatusCode code;
  std::string field;  // must appear in the status message
};

std::vector<v1::CompressRequest> ValidJob(RandomLayer& layer, const CompressOptions& options,
                                          uint64_t job_id = 1) {
  const LayerView view = layer.view();
  std::vector<v1::CompressRequest> requests = {StartJobRequest(job_id, view, options)};
  requests.push_back(SlabRequest(job_id, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view)));
  requests.push_back(SlabRequest(job_id, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view)));
  if (view.counts != nullptr) {
    requests.push_back(
        SlabRequest(job_id, v1::TENSOR_COUNTS, 0, view.counts, testing::CountBytes(view)));
  }
  return requests;
}

// A valid job whose StartJob is edited by `edit`.
std::function<std::vector<v1::CompressRequest>(RandomLayer&)> EditStart(
    std::function<void(v1::StartJob*)> edit) {
  return [edit](RandomLayer& layer) {
    auto requests = ValidJob(layer, SmallOptions());
    edit(requests[0].mutable_start_job());
    return requests;
  };
}

std::function<std::vector<v1::CompressRequest>(RandomLayer&)> EditOptions(
    std::function<void(CompressOptions*)> edit) {
  return [edit](RandomLayer& layer) {
    CompressOptions options = SmallOptions();
    edit(&options);
    return ValidJob(layer, options);
  };
}

std::vector<BadInput> BadInputs() {
  using grpc::StatusCode;
  std::vector<BadInput> cases = {
      {"UnknownDtype", EditStart([](v1::StartJob* s) { s->set_dtype(static_cast<v1::DType>(9)); }),
       StatusCode::INVALID_ARGUMENT, "start_job.dtype"},
      {"UnspecifiedLayout", EditStart([](v1::StartJob* s) { s->set_layout(v1::LAYOUT_UNSPECIFIED); }),
       StatusCode::INVALID_ARGUMENT, "start_job.layout"},
      {"ZeroHeads", EditStart([](v1::StartJob* s) { s->set_num_heads(0); }),
       StatusCode::INVALID_ARGUMENT, "num_heads"},
      {"ZeroKeyDim", EditStart([](v1::StartJob* s) { s->set_key_dim(0); }),
       StatusCode::INVALID_ARGUMENT, "key_dim"},
      {"AbsurdTokenCount", EditStart([](v1::StartJob* s) { s->set_num_tokens(1u << 30); }),
       StatusCode::INVALID_ARGUMENT, "num_tokens"},
      {"JobAboveMaxJobBytes",
       EditStart([](v1::StartJob* s) {
         s->set_num_heads(8), s->set_num_tokens(65536), s->set_key_dim(128), s->set_value_dim(128);
       }),
       StatusCode::RESOURCE_EXHAUSTED, "max_job_bytes"},
      {"UnknownBackend", EditStart([](v1::StartJob* s) { s->set_backend(static_cast<v1::Backend>(42)); }),
       StatusCode::INVALID_ARGUMENT, "start_job.backend"},
      {"GpuOnServerWithoutGpu", EditStart([](v1::StartJob* s) { s->set_backend(v1::BACKEND_GPU); }),
       StatusCode::FAILED_PRECONDITION, "gpu"},
      {"RatioZero", EditOptions([](CompressOptions* o) { o->target_ratio = 0.0; }),
       StatusCode::INVALID_ARGUMENT, "target_ratio"},
      {"RatioAboveOne", EditOptions([](CompressOptions* o) { o->target_ratio = 1.5; }),
       StatusCode::INVALID_ARGUMENT, "target_ratio"},
      {"ChunkSizeOne", EditOptions([](CompressOptions* o) { o->chunk_size = 1; }),
       StatusCode::INVALID_ARGUMENT, "chunk_size"},
      {"PassthroughHeadOutOfRange", EditOptions([](CompressOptions* o) { o->passthrough_heads = {2}; }),
       StatusCode::INVALID_ARGUMENT, "passthrough_heads"},
      {"NaNInKeys",
       [](RandomLayer& layer) {
         layer.SetKey(1, 50, 3, std::nanf(""));
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "keys"},
      {"InfInKeys",
       [](RandomLayer& layer) {
         layer.SetKey(0, 0, 0, INFINITY);
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "keys"},
      {"ZeroCount",
       [](RandomLayer& layer) {
         layer.SetCount(0, 10, 0);
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "counts"},
      {"ValuesLongerThanKeys",  // V has more tokens than K: more bytes than the shape allows
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[2].mutable_slab()->mutable_data()->append(64, '\0');
         return requests;
       },
       StatusCode::INVALID_ARGUMENT, "slab.data"},
      {"ValuesShorterThanKeys",  // V has fewer tokens than K: the stream ends short
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[2].mutable_slab()->mutable_data()->resize(ValueBytes(layer.view()) / 2);
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "still expected slabs"},
      {"OverlappingSlabs",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         const LayerView view = layer.view();
         requests[1] = SlabRequest(1, v1::TENSOR_KEYS, 0, view.keys, 1024);
         requests.insert(requests.begin() + 2,
                         SlabRequest(1, v1::TENSOR_KEYS, 512, view.keys, 1024));
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "overlaps"},
      {"GapBetweenSlabs",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[1].mutable_slab()->set_byte_offset(256);
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "gap"},
      {"SlabForUnknownJob",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[1].mutable_slab()->set_job_id(77);
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "slab.job_id"},
      {"JobIdReusedWhileInFlight",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests.insert(requests.begin() + 1, requests[0]);
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "start_job.job_id"},
      {"CountsNotAnnounced",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         uint32_t ones[4] = {1, 1, 1, 1};
         // Before the values: the job is still receiving.
         requests.insert(requests.begin() + 2,
                         SlabRequest(1, v1::TENSOR_COUNTS, 0, ones, sizeof(ones)));
         return requests;
       },
       StatusCode::INVALID_ARGUMENT, "slab.tensor"},
      {"OutputTensorSentAsInput",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[1].mutable_slab()->set_tensor(v1::TENSOR_OUT_KEYS);
         return requests;
       },
       StatusCode::INVALID_ARGUMENT, "slab.tensor"},
      {"EmptyRequest",
       [](RandomLayer&) { return std::vector<v1::CompressRequest>(1); },
       StatusCode::INVALID_ARGUMENT, "request"},
  };
  return cases;
}

void PrintTo(const BadInput& input, std::ostream* os) { *os << input.name; }

class BadInputTest : public CompressReactorTest,
                     public ::testing::WithParamInterface<BadInput> {};

TEST_P(BadInputTest, EndsStreamWithCodeNamingFieldAndServerKeepsServing) {
  RandomLayer layer = SmallLayer(3);
  const std::vector<v1::CompressRequest> requests = GetParam().requests(layer);
  RawStream stream(stub_.get());
  for (const v1::CompressRequest& request : requests) {
    if (!stream.Write(request)) break;  // the server may end the stream early
  }
  std::vector<v1::CompressResponse> responses;
  const grpc::Status status = stream.Finish(&responses);
  EXPECT_EQ(status.error_code(), GetParam().code) << status.error_message();
  EXPECT_NE(status.error_message().find(GetParam().field), std::string::npos)
      << "message does not name '" << GetParam().field << "': " << status.error_message();
  for (const v1::CompressResponse& response : responses) {
    EXPECT_FALSE(response.has_result()) << "a failed stream returned a result";
  }
  ExpectServerStillServes();
  ExpectResultsReturned(*server_);
}

INSTANTIATE_TEST_SUITE_P(Protocol, BadInputTest, ::testing::ValuesIn(BadInputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

TEST_F(CompressReactorTest, BadStreamDoesNotDisturbAnotherStreamsJob) {
  RandomLayer good = SmallLayer(21, /*with_counts=*/true);
  const LayerView view = good.view();
  RawStream healthy(stub_.get());
  ASSERT_TRUE(healthy.Write(StartJobRequest(5, view, SmallOptions())));
  ASSERT_TRUE(healthy.Write(SlabRequest(5, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view))));

  RandomLayer bad = SmallLayer(22);
  bad.SetKey(0, 3, 0, std::nanf(""));
  RawStream broken(stub_.get());
  for (const auto& request : ValidJob(bad, SmallOptions(), 5)) broken.Write(request);
  EXPECT_EQ(broken.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(healthy.Write(SlabRequest(5, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view))));
  ASSERT_TRUE(healthy.Write(
      SlabRequest(5, v1::TENSOR_COUNTS, 0, view.counts, testing::CountBytes(view))));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(healthy.Finish(&responses).ok());
  const CompressResult expected = Expected(view, SmallOptions());
  auto results = DecodeResults(responses);
  EXPECT_EQ(results[5].keys, expected.keys);
  EXPECT_EQ(results[5].assignment, expected.assignment);
}

// ---------------------------------------------------------------------------------------
// Cancellation: the work of a cancelled stream or job is dropped, others complete.

// A job the reference engine needs tens of seconds for (the slow jobs below ask for the
// reference backend on purpose, so that they are still running when cancelled).
RandomLayer SlowLayer() {
  RandomLayerSpec spec;
  spec.num_heads = 16;
  spec.num_tokens = 8192;
  spec.key_dim = 64;
  spec.value_dim = 8;
  spec.seed = 5;
  return RandomLayer::Generate(spec);
}

CompressOptions SlowOptions() {
  CompressOptions options;
  options.target_ratio = 0.1;
  options.chunk_size = 1024;
  return options;
}

TEST_F(CompressReactorTest, CancelledStreamWorkIsDroppedWhileOthersComplete) {
  RandomLayer slow = SlowLayer();
  auto cancelled = std::make_unique<RawStream>(stub_.get());
  ASSERT_TRUE(cancelled->SendJob(1, slow.view(), SlowOptions(), 1 << 20, v1::BACKEND_REFERENCE));
  ASSERT_TRUE(WaitFor([&] { return stats().jobs_received.load() == 1; },
                      std::chrono::seconds(20)));
  const auto cancel_time = std::chrono::steady_clock::now();
  cancelled->context().TryCancel();
  EXPECT_EQ(cancelled->Finish().error_code(), grpc::StatusCode::CANCELLED);

  ExpectServerStillServes();
  ASSERT_TRUE(WaitFor([&] { return stats().jobs_dropped.load() == 1; }, std::chrono::seconds(20)));
  const double drop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancel_time).count();
  EXPECT_EQ(stats().jobs_completed.load(), 1) << "only the healthy stream's job completes";
  EXPECT_TRUE(WaitFor([&] { return server_->context().budget.used() == 0; },
                      std::chrono::seconds(5)))
      << "cancelled work still holds " << server_->context().budget.used() << " bytes";
  // One head of one pass at most, far less than the whole job.
  EXPECT_LT(drop_seconds, 10.0);
  ExpectResultsReturned(*server_);
}

TEST_F(CompressReactorTest, ExpiredDeadlineDropsWork) {
  RandomLayer slow = SlowLayer();
  RawStream stream(stub_.get(), std::chrono::seconds(2));
  ASSERT_TRUE(stream.SendJob(1, slow.view(), SlowOptions(), 1 << 20, v1::BACKEND_REFERENCE));
  EXPECT_EQ(stream.Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitFor([&] { return stats().jobs_dropped.load() == 1; }, std::chrono::seconds(20)));
  EXPECT_EQ(stats().jobs_completed.load(), 0);
  ExpectResultsReturned(*server_);
}

TEST_F(CompressReactorTest, CancelJobDropsThatJobOnly) {
  RandomLayer slow = SlowLayer();
  RandomLayer small = SmallLayer(8);
  RawStream stream(stub_.get());
  ASSERT_TRUE(stream.SendJob(1, slow.view(), SlowOptions(), 1 << 20, v1::BACKEND_REFERENCE));
  ASSERT_TRUE(stream.SendJob(2, small.view(), SmallOptions()));
  v1::CompressRequest cancel;
  cancel.mutable_cancel_job()->set_job_id(1);
  ASSERT_TRUE(stream.Write(cancel));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  auto results = DecodeResults(responses);
  EXPECT_EQ(results.count(1), 0u);
  ASSERT_EQ(results.count(2), 1u);
  EXPECT_EQ(results[2].counts, Expected(small.view(), SmallOptions()).counts);
  EXPECT_EQ(stats().jobs_dropped.load(), 1);
  ExpectResultsReturned(*server_);
}

// ---------------------------------------------------------------------------------------
// Pooled results: jobs of many shapes, each reusing a buffer an earlier job left behind.

struct ShapedJob {
  RandomLayer layer;
  CompressOptions options;
};

// Shapes that differ in every array's size, largest first, then smaller and larger again,
// with and without counts and assignment, both layouts and a passthrough head: a reused
// buffer that is not fully overwritten (stale rows, a stale assignment) shows up.
std::vector<ShapedJob> MixedShapeJobs(uint64_t seed) {
  struct Shape {
    int32_t heads, tokens, key_dim, value_dim;
    bool counts, assignment;
    TensorLayout layout;
    double ratio;
    std::vector<int32_t> passthrough;
  };
  const std::vector<Shape> shapes = {
      {4, 200, 32, 24, true, true, TensorLayout::kHeadMajor, 0.5, {}},
      {1, 40, 8, 4, false, true, TensorLayout::kHeadMajor, 0.25, {}},
      {3, 130, 16, 16, true, false, TensorLayout::kTokenMajor, 0.3, {1}},
      {2, 96, 16, 12, false, true, TensorLayout::kHeadMajor, 0.4, {}},
      {4, 256, 24, 32, false, false, TensorLayout::kHeadMajor, 0.2, {}},
      {2, 64, 32, 8, true, true, TensorLayout::kTokenMajor, 0.75, {0}},
      {1, 300, 16, 16, false, true, TensorLayout::kHeadMajor, 0.1, {}},
  };
  std::vector<ShapedJob> jobs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& shape = shapes[i];
    RandomLayerSpec spec = test::Spec(shape.heads, shape.tokens, shape.key_dim,
                                      shape.value_dim, seed + i, DType::kFloat32, shape.layout);
    spec.with_counts = shape.counts;
    spec.prototypes = 5;
    CompressOptions options = SmallOptions();
    options.target_ratio = shape.ratio;
    options.compute_assignment = shape.assignment;
    options.passthrough_heads = shape.passthrough;
    jobs.push_back(ShapedJob{RandomLayer::Generate(spec), options});
  }
  return jobs;
}

// Sends `jobs` on one stream (ids first_id, first_id + 1, ...), all in flight at once, and
// checks each result against the in-process engine, bit for bit.
void RunMixedShapesOnOneStream(v1::CentroidKV::Stub* stub, const std::vector<ShapedJob>& jobs,
                               uint64_t first_id, const EngineSet& engines) {
  RawStream stream(stub);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(stream.SendJob(first_id + i, jobs[i].layer.view(), jobs[i].options, 4096));
  }
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  auto results = DecodeResults(responses);
  ASSERT_EQ(results.size(), jobs.size());
  const ClusterEngine* engine = *engines.Select(BackendKind::kAuto);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(jobs[i].layer.spec().ToString());
    auto expected = engine->Compress(jobs[i].layer.view(), jobs[i].options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    test::ExpectBitIdentical(*expected, results[first_id + i]);
  }
}

TEST_F(CompressReactorTest, ReusedResultsOfOtherShapesMatchTheEngineOnOneStream) {
  const std::vector<ShapedJob> jobs = MixedShapeJobs(300);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    RunMixedShapesOnOneStream(stub_.get(), jobs, 1000 * (round + 1), *engines_);
  }
  ExpectResultsReturned(*server_);
  const ResultPool::Stats pool = server_->context().results->stats();
  EXPECT_EQ(pool.reused + pool.created, 3 * static_cast<int64_t>(jobs.size()));
  EXPECT_GT(pool.reused, 0) << "later jobs reuse earlier jobs' buffers";
}

TEST_F(CompressReactorTest, ReusedResultsMatchTheEngineOnSeveralStreamsAtOnce) {
  ServerOptions options;
  options.worker_threads = 3;
  options.max_pooled_results = 2;  // tight bounds: buffers are trimmed as well as reused
  options.max_pooled_result_bytes = 200 << 10;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  std::vector<std::thread> clients;
  for (uint64_t s = 0; s < 4; ++s) {
    clients.emplace_back([&, s] {
      const std::vector<ShapedJob> jobs = MixedShapeJobs(500 + 10 * s);
      for (int round = 0; round < 2; ++round) {
        RunMixedShapesOnOneStream(stub.get(), jobs, 100 * (round + 1), *engines_);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  ExpectResultsReturned(*server);
  EXPECT_GT(server->context().results->stats().reused, 0);
}

// Every job reuses the one buffer all the earlier shapes wrote: the strictest overwrite test.
TEST_F(CompressReactorTest, OneJobAtATimeReusesOneResultBuffer) {
  const std::vector<ShapedJob> jobs = MixedShapeJobs(700);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      SCOPED_TRACE(jobs[i].layer.spec().ToString());
      RawStream stream(stub_.get());
      ASSERT_TRUE(stream.SendJob(1, jobs[i].layer.view(), jobs[i].options));
      std::vector<v1::CompressResponse> responses;
      ASSERT_TRUE(stream.Finish(&responses).ok());
      auto results = DecodeResults(responses);
      ASSERT_EQ(results.count(1), 1u);
      test::ExpectBitIdentical(Expected(jobs[i].layer.view(), jobs[i].options), results[1]);
      // The buffer is back before the last slab reaches the client.
      ASSERT_EQ(server_->context().results->stats().leased, 0);
    }
  }
  const ResultPool::Stats pool = server_->context().results->stats();
  EXPECT_EQ(pool.created, 1) << "no growth: every job after the first reused the one buffer";
  EXPECT_EQ(pool.reused, 3 * static_cast<int64_t>(jobs.size()) - 1);
  EXPECT_EQ(pool.idle_results, 1);
}

TEST_F(CompressReactorTest, PoolOffStillMatchesTheEngine) {
  ServerOptions options;
  options.worker_threads = 2;
  options.max_pooled_results = 0;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  RunMixedShapesOnOneStream(stub.get(), MixedShapeJobs(900), 1, *engines_);
  const ResultPool::Stats pool = server->context().results->stats();
  EXPECT_EQ(pool.reused, 0);
  EXPECT_EQ(pool.idle_results, 0);
  ExpectResultsReturned(*server);
}

}  // namespace
}  // namespace centroidkv::service
