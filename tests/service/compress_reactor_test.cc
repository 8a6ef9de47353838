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
#include <ctime>
#include <functional>
#include <map>
#include <thread>
#include <tuple>

#include "centroidkv/client/client.h"
#include "centroidkv/kernels/engine_factory.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::service::testing {
namespace {

using ::centroidkv::test::RandomLayer;
using ::centroidkv::test::RandomLayerSpec;

RandomLayer SmallLayer(uint64_t seed, bool with_counts = false) {
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 96, .key_dim = 16, .value_dim = 12,
      .with_counts = with_counts, .prototypes = 6, .seed = seed};
  return RandomLayer::Generate(spec);
}

CompressOptions SmallOptions() {
  CompressOptions options{.target_ratio = 0.4, .chunk_size = 16, .sink_tokens = 2,
      .recent_tokens = 8};
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

  const ServiceMetrics& metrics() const { return server_->context().metrics; }

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
  // Empty: a framing violation, the stream ends with `code`. Otherwise an error of job 1
  // only: a JobError with `code` whose field is `job_field`, and the stream goes on.
  std::string job_field = "";
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
  // Job-level cases first (the job fails, the stream goes on), then framing violations.
  std::vector<BadInput> cases = {
      {"UnknownDtype", EditStart([](v1::StartJob* s) { s->set_dtype(static_cast<v1::DType>(9)); }),
       StatusCode::INVALID_ARGUMENT, "start_job.dtype", "start_job.dtype"},
      {"UnspecifiedLayout", EditStart([](v1::StartJob* s) { s->set_layout(v1::LAYOUT_UNSPECIFIED); }),
       StatusCode::INVALID_ARGUMENT, "start_job.layout", "start_job.layout"},
      {"ZeroHeads", EditStart([](v1::StartJob* s) { s->set_num_heads(0); }),
       StatusCode::INVALID_ARGUMENT, "num_heads", "start_job.num_heads"},
      {"ZeroKeyDim", EditStart([](v1::StartJob* s) { s->set_key_dim(0); }),
       StatusCode::INVALID_ARGUMENT, "key_dim", "start_job.key_dim"},
      {"AbsurdTokenCount", EditStart([](v1::StartJob* s) { s->set_num_tokens(1u << 30); }),
       StatusCode::INVALID_ARGUMENT, "num_tokens", "start_job.num_tokens"},
      {"JobAboveMaxJobBytes",
       EditStart([](v1::StartJob* s) {
         s->set_num_heads(8), s->set_num_tokens(65536), s->set_key_dim(128), s->set_value_dim(128);
       }),
       StatusCode::RESOURCE_EXHAUSTED, "max_job_bytes", "start_job.num_tokens"},
      {"UnknownBackend", EditStart([](v1::StartJob* s) { s->set_backend(static_cast<v1::Backend>(42)); }),
       StatusCode::INVALID_ARGUMENT, "start_job.backend", "start_job.backend"},
      {"GpuOnServerWithoutGpu", EditStart([](v1::StartJob* s) { s->set_backend(v1::BACKEND_GPU); }),
       StatusCode::FAILED_PRECONDITION, "gpu", "start_job.backend"},
      {"RatioZero", EditOptions([](CompressOptions* o) { o->target_ratio = 0.0; }),
       StatusCode::INVALID_ARGUMENT, "target_ratio", "start_job.params.target_ratio"},
      {"RatioAboveOne", EditOptions([](CompressOptions* o) { o->target_ratio = 1.5; }),
       StatusCode::INVALID_ARGUMENT, "target_ratio", "start_job.params.target_ratio"},
      {"ChunkSizeOne", EditOptions([](CompressOptions* o) { o->chunk_size = 1; }),
       StatusCode::INVALID_ARGUMENT, "chunk_size", "start_job.params.chunk_size"},
      {"PassthroughHeadOutOfRange", EditOptions([](CompressOptions* o) { o->passthrough_heads = {2}; }),
       StatusCode::INVALID_ARGUMENT, "passthrough_heads", "start_job.params.passthrough_heads"},
      {"NaNInKeys",
       [](RandomLayer& layer) {
         layer.SetKey(1, 50, 3, std::nanf(""));
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "keys", "keys"},
      {"InfInKeys",
       [](RandomLayer& layer) {
         layer.SetKey(0, 0, 0, INFINITY);
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "keys", "keys"},
      {"ZeroCount",
       [](RandomLayer& layer) {
         layer.SetCount(0, 10, 0);
         return ValidJob(layer, SmallOptions());
       },
       StatusCode::INVALID_ARGUMENT, "counts", "counts"},
      {"ValuesLongerThanKeys",  // V has more tokens than K: more bytes than the shape allows
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[2].mutable_slab()->mutable_data()->append(64, '\0');
         return requests;
       },
       StatusCode::INVALID_ARGUMENT, "slab.data", "slab.data"},
      {"ValuesShorterThanKeys",  // V has fewer tokens than K: the stream ends short
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[2].mutable_slab()->mutable_data()->resize(ValueBytes(layer.view()) / 2);
         return requests;
       },
       StatusCode::FAILED_PRECONDITION, "still expected slabs", "values"},
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
       StatusCode::INVALID_ARGUMENT, "slab.tensor", "slab.tensor"},
      {"OutputTensorSentAsInput",
       [](RandomLayer& layer) {
         auto requests = ValidJob(layer, SmallOptions());
         requests[1].mutable_slab()->set_tensor(v1::TENSOR_OUT_KEYS);
         return requests;
       },
       StatusCode::INVALID_ARGUMENT, "slab.tensor", "slab.tensor"},
      {"EmptyRequest",
       [](RandomLayer&) { return std::vector<v1::CompressRequest>(1); },
       StatusCode::INVALID_ARGUMENT, "request"},
  };
  return cases;
}

void PrintTo(const BadInput& input, std::ostream* os) { *os << input.name; }

class BadInputTest : public CompressReactorTest,
                     public ::testing::WithParamInterface<BadInput> {};

TEST_P(BadInputTest, FailsTheJobOrTheStreamWithCodeNamingFieldAndServerKeepsServing) {
  const BadInput& input = GetParam();
  RandomLayer layer = SmallLayer(3);
  const std::vector<v1::CompressRequest> requests = input.requests(layer);
  RawStream stream(stub_.get());
  for (const v1::CompressRequest& request : requests) {
    if (!stream.Write(request)) break;  // the server may end the stream early
  }
  // A valid job after the bad one, on the same stream.
  RandomLayer good = SmallLayer(4);
  if (!input.job_field.empty()) {
    ASSERT_TRUE(stream.SendJob(2, good.view(), SmallOptions()));
  }
  std::vector<v1::CompressResponse> responses;
  const grpc::Status status = stream.Finish(&responses);
  std::map<uint64_t, v1::JobError> errors;
  auto results = DecodeResults(responses, &errors);
  if (input.job_field.empty()) {
    EXPECT_EQ(status.error_code(), input.code) << status.error_message();
    EXPECT_NE(status.error_message().find(input.field), std::string::npos)
        << "message does not name '" << input.field << "': " << status.error_message();
    EXPECT_TRUE(results.empty()) << "a failed stream returned a result";
  } else {
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(errors.size(), 1u);
    ASSERT_EQ(errors.count(1), 1u);
    const v1::JobError& error = errors[1];
    EXPECT_EQ(error.code(), static_cast<int32_t>(input.code)) << error.message();
    EXPECT_EQ(error.field(), input.job_field) << error.message();
    EXPECT_NE(error.message().find(input.field), std::string::npos)
        << "message does not name '" << input.field << "': " << error.message();
    EXPECT_EQ(results.count(1), 0u);
    ASSERT_EQ(results.count(2), 1u) << "the stream's next job was lost";
    test::ExpectBitIdentical(Expected(good.view(), SmallOptions()), results[2]);
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
  std::vector<v1::CompressResponse> broken_responses;
  EXPECT_TRUE(broken.Finish(&broken_responses).ok());
  std::map<uint64_t, v1::JobError> broken_errors;
  DecodeResults(broken_responses, &broken_errors);
  ASSERT_EQ(broken_errors.count(5), 1u);
  EXPECT_EQ(broken_errors[5].field(), "keys");

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
  RandomLayerSpec spec{.num_heads = 16, .num_tokens = 8192, .key_dim = 64, .value_dim = 8,
      .seed = 5};
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
  ASSERT_TRUE(WaitFor([&] { return metrics().jobs_received() == 1; },
                      std::chrono::seconds(20)));
  const auto cancel_time = std::chrono::steady_clock::now();
  cancelled->context().TryCancel();
  EXPECT_EQ(cancelled->Finish().error_code(), grpc::StatusCode::CANCELLED);

  ExpectServerStillServes();
  ASSERT_TRUE(WaitFor([&] { return metrics().jobs_ended(JobOutcome::kDropped) == 1; },
                      std::chrono::seconds(20)));
  const double drop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancel_time).count();
  EXPECT_EQ(metrics().jobs_ended(JobOutcome::kCompleted), 1)
      << "only the healthy stream's job completes";
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
  EXPECT_TRUE(WaitFor([&] { return metrics().jobs_ended(JobOutcome::kDropped) == 1; },
                      std::chrono::seconds(20)));
  EXPECT_EQ(metrics().jobs_ended(JobOutcome::kCompleted), 0);
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
  EXPECT_EQ(metrics().jobs_ended(JobOutcome::kDropped), 1);
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

// ---------------------------------------------------------------------------------------
// What serving engines need: job-level errors, ragged input, equal lengths,
// honest results, slab limits, deadlines, priorities and token-major rows.

// A result's rows sent back as the next job's input: heads concatenated, ragged.
struct RaggedInput {
  std::vector<float> keys, values;
  std::vector<uint32_t> counts;
  std::vector<int64_t> offsets;
  int32_t num_heads = 0, num_tokens = 0, key_dim = 0, value_dim = 0;

  explicit RaggedInput(const CompressResult& result)
      : keys(result.keys),
        values(result.values),
        counts(result.counts),
        offsets(result.offsets),
        num_heads(result.num_heads),
        key_dim(result.key_dim),
        value_dim(result.value_dim) {
    for (int32_t h = 0; h < num_heads; ++h) {
      num_tokens = std::max<int32_t>(num_tokens, static_cast<int32_t>(offsets[h + 1] - offsets[h]));
    }
  }
  LayerView view() const {
    LayerView view{.num_heads = num_heads, .num_tokens = num_tokens, .key_dim = key_dim,
        .value_dim = value_dim, .keys = keys.data(), .values = values.data(),
        .counts = counts.data(), .head_offsets = offsets.data()};
    return view;
  }
};

// Sends `requests` and then half-closes; returns results and job errors.
grpc::Status Exchange(RawStream* stream, const std::vector<v1::CompressRequest>& requests,
                      std::map<uint64_t, CompressResult>* results,
                      std::map<uint64_t, v1::JobError>* errors,
                      std::vector<uint64_t>* order = nullptr) {
  for (const v1::CompressRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  std::vector<v1::CompressResponse> responses;
  grpc::Status status = stream->Finish(&responses);
  *results = DecodeResults(responses, errors);
  if (order != nullptr) {
    for (const auto& response : responses) {
      if (response.has_result()) order->push_back(response.result().job_id());
    }
  }
  return status;
}

// One job through the server: its result, or its JobError in *error.
CompressResult ThroughServer(v1::CentroidKV::Stub* stub, const LayerView& layer,
                             const CompressOptions& options, v1::JobError* error = nullptr,
                             v1::Backend backend = v1::BACKEND_AUTO) {
  RawStream stream(stub);
  EXPECT_TRUE(stream.SendJob(1, layer, options, 4096, backend));
  std::vector<v1::CompressResponse> responses;
  EXPECT_TRUE(stream.Finish(&responses).ok());
  std::map<uint64_t, v1::JobError> errors;
  auto results = DecodeResults(responses, &errors);
  if (error != nullptr && errors.count(1)) *error = errors[1];
  EXPECT_EQ(results.count(1) + errors.count(1), 1u);
  return results[1];
}

const ClusterEngine& Reference() {
  static const auto* const engines = EngineSet::CreateAvailable().release();
  return **engines->Select(BackendKind::kReference);
}

int64_t Entries(const CompressResult& result, int32_t head) {
  return result.offsets[head + 1] - result.offsets[head];
}

TEST_F(CompressReactorTest, EightJobsInFlightOnlyTheBadOnesGetJobErrorsNamingTheField) {
  std::vector<RandomLayer> layers;
  std::vector<CompressOptions> options(8, SmallOptions());
  for (uint64_t i = 0; i < 8; ++i) layers.push_back(SmallLayer(30 + i, i % 2 == 0));
  layers[3].SetKey(1, 50, 3, std::nanf(""));
  options[5].passthrough_heads = {7};  // the layers have 2 heads
  std::vector<v1::CompressRequest> starts, keys, rest;
  for (uint64_t i = 0; i < 8; ++i) {
    auto job = ValidJob(layers[i], options[i], i);
    starts.push_back(job[0]);
    keys.push_back(job[1]);
    rest.insert(rest.end(), job.begin() + 2, job.end());
  }
  std::vector<v1::CompressRequest> requests = starts;  // every job in flight at once
  requests.insert(requests.end(), keys.begin(), keys.end());
  requests.insert(requests.end(), rest.begin(), rest.end());
  RawStream stream(stub_.get());
  std::map<uint64_t, CompressResult> results;
  std::map<uint64_t, v1::JobError> errors;
  ASSERT_TRUE(Exchange(&stream, requests, &results, &errors).ok());

  ASSERT_EQ(errors.size(), 2u);
  ASSERT_EQ(errors.count(3), 1u);
  EXPECT_EQ(errors[3].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(errors[3].field(), "keys");
  EXPECT_EQ(errors[3].head(), 1u);
  EXPECT_EQ(errors[3].token(), 50u);
  ASSERT_EQ(errors.count(5), 1u);
  EXPECT_EQ(errors[5].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(errors[5].field(), "start_job.params.passthrough_heads");
  EXPECT_EQ(errors[5].head(), 7u);
  EXPECT_FALSE(errors[5].has_token());
  ASSERT_EQ(results.size(), 6u);
  for (uint64_t i : {0, 1, 2, 4, 6, 7}) {
    SCOPED_TRACE(i);
    ASSERT_EQ(results.count(i), 1u);
    test::ExpectBitIdentical(Expected(layers[i].view(), options[i]), results[i]);
  }
  ExpectResultsReturned(*server_);
}

TEST_F(CompressReactorTest, OldClientMessagesWorkUnchangedAndGetAnHonestHeader) {
  RandomLayer layer = SmallLayer(40, /*with_counts=*/true);
  const LayerView view = layer.view();
  // Only the fields of the first version of centroidkv.v1, spelled out.
  v1::CompressRequest start;
  v1::StartJob* job = start.mutable_start_job();
  job->set_job_id(9);
  job->set_num_heads(2);
  job->set_num_tokens(96);
  job->set_key_dim(16);
  job->set_value_dim(12);
  job->set_dtype(v1::DTYPE_FLOAT32);
  job->set_layout(v1::LAYOUT_HEAD_MAJOR);
  job->set_has_counts(true);
  job->mutable_params()->set_target_ratio(0.4);
  job->mutable_params()->set_chunk_size(16);
  job->mutable_params()->set_sink_tokens(2);
  job->mutable_params()->set_recent_tokens(8);
  job->set_return_assignment(true);
  RawStream stream(stub_.get());
  std::map<uint64_t, CompressResult> results;
  std::map<uint64_t, v1::JobError> errors;
  ASSERT_TRUE(Exchange(&stream,
                       {start, SlabRequest(9, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view)),
                        SlabRequest(9, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view)),
                        SlabRequest(9, v1::TENSOR_COUNTS, 0, view.counts,
                                    testing::CountBytes(view))},
                       &results, &errors)
                  .ok());
  ASSERT_EQ(results.count(9), 1u);
  CompressOptions options = SmallOptions();
  options.compute_assignment = true;
  const CompressResult expected = Expected(view, options);
  test::ExpectBitIdentical(expected, results[9]);
  const CompressResult& got = results[9];
  EXPECT_EQ(got.target_length, 39);  // ceil(0.4 * 96)
  EXPECT_TRUE(got.target_reached);
  EXPECT_EQ(got.head_tokens, (std::vector<int32_t>{96, 96}));
  EXPECT_EQ(got.padded_length, 0);
  EXPECT_EQ(got.layout, TensorLayout::kHeadMajor);
  for (int32_t h = 0; h < 2; ++h) {
    EXPECT_EQ(got.head_entries[h], Entries(got, h));
    uint64_t sum = 0;
    for (int32_t t = 0; t < 96; ++t) sum += layer.Count(h, t);
    EXPECT_EQ(got.head_input_tokens[h], sum);
    EXPECT_EQ(got.stop_reasons[h], StopReason::kTargetReached);
  }
}

// Round 1 leaves heads of different lengths (a passthrough head; or, without uniform_heads,
// a floor); round 2 sends that result back as it is.
TEST_F(CompressReactorTest, RaggedResultSentBackRoundTripsLikeTheReferenceByHand) {
  RandomLayerSpec spec = test::Spec(3, 160, 16, 8, 41);
  spec.prototypes = 6;
  spec.with_counts = true;
  RandomLayer layer = RandomLayer::Generate(spec);
  for (bool uniform : {true, false}) {
    SCOPED_TRACE(uniform ? "uniform_heads" : "independent heads");
    CompressOptions first = SmallOptions();
    first.target_ratio = 0.5;
    first.uniform_heads = uniform;
    first.passthrough_heads = {1};
    if (!uniform) first.min_similarity = 0.2;
    const CompressResult round1 = ThroughServer(stub_.get(), layer.view(), first);
    ASSERT_EQ(Entries(round1, 1), 160);
    ASSERT_NE(Entries(round1, 0), 160);
    const RaggedInput again(round1);

    CompressOptions second = SmallOptions();
    second.target_ratio.reset();
    second.target_tokens = 30;
    second.uniform_heads = uniform;
    second.passthrough_heads = {1};
    second.compute_assignment = true;
    v1::JobError error;
    const CompressResult round2 = ThroughServer(stub_.get(), again.view(), second, &error);
    ASSERT_TRUE(error.message().empty()) << error.message();
    // The server's backend (auto) equals the reference on the same ragged job ...
    auto reference = Reference().Compress(again.view(), second);
    ASSERT_TRUE(reference.ok()) << reference.status();
    test::ExpectBitIdentical(*reference, round2);
    // ... and the reference equals the heads compressed by hand as regular jobs: the
    // compressed heads (one length when uniform) together or each alone, head 1 unchanged.
    std::vector<std::vector<int32_t>> groups =
        uniform ? std::vector<std::vector<int32_t>>{{0, 2}} : std::vector<std::vector<int32_t>>{{0}, {2}};
    for (const std::vector<int32_t>& group : groups) {
      const int32_t length = static_cast<int32_t>(Entries(round1, group[0]));
      std::vector<float> keys, values;
      std::vector<uint32_t> counts;
      for (int32_t h : group) {
        ASSERT_EQ(Entries(round1, h), length);
        const int64_t b = round1.offsets[h], e = round1.offsets[h + 1];
        keys.insert(keys.end(), round1.keys.begin() + b * 16, round1.keys.begin() + e * 16);
        values.insert(values.end(), round1.values.begin() + b * 8, round1.values.begin() + e * 8);
        counts.insert(counts.end(), round1.counts.begin() + b, round1.counts.begin() + e);
      }
      LayerView regular{.num_heads = static_cast<int32_t>(group.size()), .num_tokens = length,
          .key_dim = 16, .value_dim = 8, .keys = keys.data(), .values = values.data(),
          .counts = counts.data()};
      CompressOptions by_hand = second;
      by_hand.passthrough_heads.clear();
      auto part = Reference().Compress(regular, by_hand);
      ASSERT_TRUE(part.ok()) << part.status();
      for (size_t k = 0; k < group.size(); ++k) {
        const int32_t h = group[k];
        ASSERT_EQ(Entries(round2, h), Entries(*part, static_cast<int32_t>(k)));
        EXPECT_LE(Entries(round2, h), 30);
        for (int64_t r = 0; r < Entries(round2, h); ++r) {
          EXPECT_EQ(round2.counts[round2.offsets[h] + r], part->counts[part->offsets[k] + r]);
          for (int32_t j = 0; j < 16; ++j) {
            ASSERT_EQ(round2.keys[(round2.offsets[h] + r) * 16 + j],
                      part->keys[(part->offsets[k] + r) * 16 + j]);
          }
        }
        for (int32_t i = 0; i < length; ++i) {
          EXPECT_EQ(round2.assignment[round1.offsets[h] + i], part->assignment[k * length + i]);
        }
      }
    }
    // The passthrough head comes back unchanged; every head keeps its tokens.
    EXPECT_EQ(Entries(round2, 1), 160);
    EXPECT_EQ(round2.head_tokens, (std::vector<int32_t>{static_cast<int32_t>(Entries(round1, 0)),
                                                         160, static_cast<int32_t>(Entries(round1, 2))}));
    EXPECT_EQ(round2.head_input_tokens, round1.head_input_tokens);
    EXPECT_EQ(round2.stop_reasons[1], StopReason::kPassthrough);
  }
}

TEST_F(CompressReactorTest, PaddedOutputsHaveEqualLengthsCountZeroRowsAndTheSameRealRows) {
  RandomLayerSpec spec = test::Spec(3, 128, 16, 8, 42);
  spec.prototypes = 4;
  spec.with_counts = true;
  RandomLayer layer = RandomLayer::Generate(spec);
  CompressOptions options = SmallOptions();
  options.uniform_heads = false;
  options.min_similarity = 0.3;
  options.passthrough_heads = {2};
  const CompressResult plain = ThroughServer(stub_.get(), layer.view(), options);
  ASSERT_EQ(Entries(plain, 2), 128);
  for (int32_t pad_to : {0, 150}) {
    SCOPED_TRACE(pad_to);
    CompressOptions padded_options = options;
    padded_options.pad_heads = pad_to == 0;
    padded_options.pad_to = pad_to;
    const CompressResult padded = ThroughServer(stub_.get(), layer.view(), padded_options);
    const int64_t length = pad_to == 0 ? 128 : pad_to;
    EXPECT_EQ(padded.padded_length, length);
    ASSERT_EQ(padded.offsets, (std::vector<int64_t>{0, length, 2 * length, 3 * length}));
    EXPECT_EQ(padded.assignment, plain.assignment);
    for (int32_t h = 0; h < 3; ++h) {
      EXPECT_EQ(padded.head_entries[h], Entries(plain, h));
      for (int64_t r = 0; r < length; ++r) {
        const bool real = r < Entries(plain, h);
        const int64_t row = padded.offsets[h] + r, from = plain.offsets[h] + r;
        ASSERT_EQ(padded.counts[row], real ? plain.counts[from] : 0u) << h << " " << r;
        for (int32_t j = 0; j < 16; ++j) {
          ASSERT_EQ(padded.keys[row * 16 + j], real ? plain.keys[from * 16 + j] : 0.0f);
        }
        for (int32_t j = 0; j < 8; ++j) {
          ASSERT_EQ(padded.values[row * 8 + j], real ? plain.values[from * 8 + j] : 0.0f);
        }
      }
    }
  }
  // Too short a pad_to fails that job, naming the field and the head.
  CompressOptions short_pad = options;
  short_pad.pad_to = 10;
  v1::JobError error;
  ThroughServer(stub_.get(), layer.view(), short_pad, &error);
  EXPECT_EQ(error.code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(error.field(), "start_job.pad_to");
  EXPECT_TRUE(error.has_head());

  // A padded result goes back in as a regular [H, L] job: its count-0 rows are padding,
  // ignored (assignment -1), and it compresses exactly like the same rows sent ragged.
  CompressOptions pad_options = options;
  pad_options.pad_heads = true;
  const CompressResult padded = ThroughServer(stub_.get(), layer.view(), pad_options);
  LayerView as_regular{.num_heads = 3, .num_tokens = 128, .key_dim = 16, .value_dim = 8,
      .keys = padded.keys.data(), .values = padded.values.data(), .counts = padded.counts.data()};
  CompressOptions second = SmallOptions();
  second.target_ratio.reset();
  second.target_tokens = 20;
  second.uniform_heads = false;
  second.compute_assignment = true;
  const CompressResult from_padded = ThroughServer(stub_.get(), as_regular, second);
  const RaggedInput ragged(plain);
  const CompressResult from_ragged = ThroughServer(stub_.get(), ragged.view(), second);
  EXPECT_EQ(from_padded.offsets, from_ragged.offsets);
  EXPECT_EQ(from_padded.keys, from_ragged.keys);
  EXPECT_EQ(from_padded.values, from_ragged.values);
  EXPECT_EQ(from_padded.counts, from_ragged.counts);
  for (int32_t h = 0; h < 3; ++h) {
    for (int32_t i = 0; i < 128; ++i) {
      const bool real = i < Entries(plain, h);
      const int32_t owner = from_padded.assignment[h * 128 + i];
      if (real) {
        EXPECT_EQ(owner, from_ragged.assignment[plain.offsets[h] + i]);
      } else {
        EXPECT_EQ(owner, -1) << "padding row " << i << " of head " << h;
      }
    }
  }
}

TEST_F(CompressReactorTest, ExactTargetHitsTOnEveryHeadEvenWithAFloor) {
  RandomLayerSpec spec = test::Spec(4, 256, 16, 8, 43);
  spec.prototypes = 12;
  spec.noise = 0.3;
  spec.with_counts = true;
  RandomLayer layer = RandomLayer::Generate(spec);
  CompressOptions options{.target_tokens = 40, .chunk_size = 32, .sink_tokens = 4,
      .recent_tokens = 8, .min_similarity = 0.99, .passthrough_heads = {3},
      .compute_assignment = true};
  const CompressResult floored = ThroughServer(stub_.get(), layer.view(), options);
  EXPECT_FALSE(floored.target_reached);
  EXPECT_EQ(floored.stop_reasons[0], StopReason::kSimilarityFloor);
  EXPECT_GT(Entries(floored, 0), 40);

  options.exact_target = true;
  const CompressResult exact = ThroughServer(stub_.get(), layer.view(), options);
  EXPECT_TRUE(exact.target_reached);
  for (int32_t h = 0; h < 3; ++h) {
    EXPECT_EQ(Entries(exact, h), 40) << "head " << h;
    EXPECT_EQ(exact.stop_reasons[h], StopReason::kTargetReached);
    // Every input entry lands on a row of its head, and counts add up.
    uint64_t sum = 0;
    for (int64_t r = exact.offsets[h]; r < exact.offsets[h + 1]; ++r) sum += exact.counts[r];
    EXPECT_EQ(sum, exact.head_input_tokens[h]);
    for (int32_t i = 0; i < 256; ++i) {
      const int32_t owner = exact.assignment[h * 256 + i];
      ASSERT_GE(owner, 0);
      ASSERT_LT(owner, 40);
    }
  }
  EXPECT_EQ(Entries(exact, 3), 256);
  EXPECT_EQ(exact.stop_reasons[3], StopReason::kPassthrough);
  // The same bits as the reference engine doing the same in process.
  auto reference = Reference().Compress(layer.view(), options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  test::ExpectBitIdentical(*reference, exact);
}

TEST_F(CompressReactorTest, EveryMissedTargetIsReportedWithItsReason) {
  RandomLayerSpec spec = test::Spec(2, 256, 16, 8, 44);
  RandomLayer layer = RandomLayer::Generate(spec);
  struct Case {
    const char* name;
    std::function<void(CompressOptions*)> edit;
    StopReason reason;
  };
  const Case cases[] = {
      {"max_passes", [](CompressOptions* o) { o->max_passes = 1; o->target_ratio = 0.05; },
       StopReason::kMaxPasses},
      {"floor", [](CompressOptions* o) { o->min_similarity = 0.99; }, StopReason::kSimilarityFloor},
      {"protected", [](CompressOptions* o) { o->sink_tokens = 100; o->recent_tokens = 100; },
       StopReason::kProtected},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CompressOptions options = SmallOptions();
    options.target_ratio = 0.25;
    c.edit(&options);
    const CompressResult result = ThroughServer(stub_.get(), layer.view(), options);
    EXPECT_FALSE(result.target_reached);
    for (int32_t h = 0; h < 2; ++h) {
      EXPECT_GT(Entries(result, h), result.target_length);
      EXPECT_EQ(result.stop_reasons[h], c.reason) << StopReasonName(result.stop_reasons[h]);
    }
  }
}

TEST_F(CompressReactorTest, ExpiredJobDeadlineDropsItsWorkWhileOtherJobsComplete) {
  RandomLayer slow = SlowLayer();
  RandomLayer small = SmallLayer(45);
  // The slow job in 1 MiB slabs (its tensors are larger than a message).
  const LayerView view = slow.view();
  std::vector<v1::CompressRequest> requests = {StartJobRequest(1, view, SlowOptions())};
  requests[0].mutable_start_job()->set_backend(v1::BACKEND_REFERENCE);
  requests[0].mutable_start_job()->set_timeout_ms(300);
  for (const auto& [tensor, data, size] :
       {std::tuple{v1::TENSOR_KEYS, view.keys, KeyBytes(view)},
        std::tuple{v1::TENSOR_VALUES, view.values, ValueBytes(view)}}) {
    for (uint64_t offset = 0; offset < size; offset += 1 << 20) {
      requests.push_back(SlabRequest(1, tensor, offset, static_cast<const char*>(data) + offset,
                                     std::min<uint64_t>(1 << 20, size - offset)));
    }
  }
  auto other = ValidJob(small, SmallOptions(), 2);
  requests.insert(requests.end(), other.begin(), other.end());
  const auto start = std::chrono::steady_clock::now();
  RawStream stream(stub_.get());
  std::map<uint64_t, CompressResult> results;
  std::map<uint64_t, v1::JobError> errors;
  ASSERT_TRUE(Exchange(&stream, requests, &results, &errors).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(errors.count(1), 1u);
  EXPECT_EQ(errors[1].code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(errors[1].field(), "start_job.timeout_ms");
  ASSERT_EQ(results.count(2), 1u);
  test::ExpectBitIdentical(Expected(small.view(), SmallOptions()), results[2]);
  EXPECT_EQ(results.count(1), 0u);
  // The reference needs tens of seconds for the whole job; it stopped at the deadline
  // (the bound leaves room for a busy machine: sending the job alone takes seconds there).
  EXPECT_LT(seconds, 15.0);
  EXPECT_EQ(metrics().jobs_ended(JobOutcome::kDropped), 1);
  EXPECT_EQ(metrics().jobs_ended(JobOutcome::kCompleted), 1);
  ExpectResultsReturned(*server_);
}

TEST(CompressReactorPriorityTest, HigherPriorityJobsAreTakenFirstFromAQueuedBacklog) {
  ServerOptions options;
  options.worker_threads = 1;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  // A long job occupies the one clustering thread while the backlog queues behind it.
  RandomLayer slow = SlowLayer();
  RawStream stream(stub.get());
  ASSERT_TRUE(stream.SendJob(1, slow.view(), SlowOptions(), 1 << 20, v1::BACKEND_REFERENCE));
  ASSERT_TRUE(WaitFor([&] { return server->context().metrics.jobs_received() == 1 &&
                                   server->context().executor->queued() == 0; },
                      std::chrono::seconds(20)));
  std::vector<RandomLayer> layers;
  const int32_t priorities[] = {0, 5, 1, 9, -3};
  for (int i = 0; i < 5; ++i) layers.push_back(SmallLayer(50 + i));
  for (int i = 0; i < 5; ++i) {
    auto job = ValidJob(layers[i], SmallOptions(), 10 + i);
    job[0].mutable_start_job()->set_priority(priorities[i]);
    for (const auto& request : job) ASSERT_TRUE(stream.Write(request));
  }
  ASSERT_TRUE(WaitFor([&] { return server->context().executor->queued() == 5; },
                      std::chrono::seconds(20)));
  // The backlog is queued: drop the long job; the thread takes the backlog by priority.
  v1::CompressRequest cancel;
  cancel.mutable_cancel_job()->set_job_id(1);
  ASSERT_TRUE(stream.Write(cancel));
  std::map<uint64_t, CompressResult> results;
  std::map<uint64_t, v1::JobError> errors;
  std::vector<uint64_t> order;
  ASSERT_TRUE(Exchange(&stream, {}, &results, &errors, &order).ok());
  EXPECT_EQ(order, (std::vector<uint64_t>{13, 11, 12, 10, 14}));
  EXPECT_TRUE(errors.empty());
}

TEST_F(CompressReactorTest, TokenMajorOutputIsTheTransposedHeadMajorOutput) {
  RandomLayerSpec spec = test::Spec(3, 100, 16, 8, 46);
  spec.prototypes = 5;
  RandomLayer layer = RandomLayer::Generate(spec);
  CompressOptions options = SmallOptions();
  options.uniform_heads = false;
  options.min_similarity = 0.4;
  options.pad_heads = true;
  const CompressResult heads = ThroughServer(stub_.get(), layer.view(), options);
  options.output_layout = TensorLayout::kTokenMajor;
  const CompressResult tokens = ThroughServer(stub_.get(), layer.view(), options);
  EXPECT_EQ(tokens.layout, TensorLayout::kTokenMajor);
  EXPECT_EQ(heads.layout, TensorLayout::kHeadMajor);
  const int64_t length = heads.padded_length;
  ASSERT_GT(length, 0);
  EXPECT_EQ(tokens.padded_length, length);
  EXPECT_EQ(tokens.head_entries, heads.head_entries);
  EXPECT_EQ(tokens.assignment, heads.assignment);
  ASSERT_EQ(tokens.keys.size(), heads.keys.size());
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t r = 0; r < length; ++r) {
      ASSERT_EQ(tokens.counts[r * 3 + h], heads.counts[h * length + r]);
      for (int32_t j = 0; j < 16; ++j) {
        ASSERT_EQ(tokens.keys[(r * 3 + h) * 16 + j], heads.keys[(h * length + r) * 16 + j]);
      }
      for (int32_t j = 0; j < 8; ++j) {
        ASSERT_EQ(tokens.values[(r * 3 + h) * 8 + j], heads.values[(h * length + r) * 8 + j]);
      }
    }
  }
}

TEST(CompressReactorLimitsTest, OversizedSlabGetsANamedJobErrorAndTheClientSizesItsSlabs) {
  ServerOptions options;
  options.worker_threads = 1;
  options.max_slab_bytes = 4096;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  {
    grpc::ClientContext context;
    v1::GetInfoResponse info;
    ASSERT_TRUE(stub->GetInfo(&context, v1::GetInfoRequest(), &info).ok());
    EXPECT_EQ(info.limits().max_slab_bytes(), 4096u);
  }
  RandomLayer layer = SmallLayer(47);  // keys: 2 x 96 x 16 floats = 12 KiB
  RawStream stream(stub.get());
  ASSERT_TRUE(stream.SendJob(1, layer.view(), SmallOptions(), /*slab_bytes=*/8192));
  ASSERT_TRUE(stream.SendJob(2, layer.view(), SmallOptions(), /*slab_bytes=*/4096));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  std::map<uint64_t, v1::JobError> errors;
  auto results = DecodeResults(responses, &errors);
  ASSERT_EQ(errors.count(1), 1u);
  EXPECT_EQ(errors[1].code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(errors[1].field(), "slab.data");
  EXPECT_NE(errors[1].message().find("4096"), std::string::npos) << errors[1].message();
  EXPECT_EQ(results.count(2), 1u);

  // The C++ client asks for 64 KiB slabs and sends the server's 4 KiB instead.
  client::ClientOptions client_options;
  client_options.target = server->target();
  client_options.slab_bytes = 64 << 10;
  auto client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  client::LayerJob job;
  job.layer = layer.view();
  job.options = SmallOptions();
  auto answers = (*client)->CompressLayers({job});
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_TRUE((*answers)[0].status.ok()) << (*answers)[0].status;
  EXPECT_EQ((*answers)[0].counts, results[2].counts);
}

// ---------------------------------------------------------------------------------------
// Hostile and heavy load: no silent loss, work that stops.

// Bytes that are not a CompressRequest (field 1 with wire type 7, which does not exist)
// end the stream with INVALID_ARGUMENT; before, gRPC's typed reader took them for a
// half-close and the stream ended OK, the job sent before them never answered.
TEST_F(CompressReactorTest, UnparseableMessageEndsStreamWithInvalidArgument) {
  auto channel = grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(),
          grpc::internal::RpcMethod("/centroidkv.v1.CentroidKV/Compress",
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  RandomLayer layer = SmallLayer(5);
  const std::string start = StartJobRequest(3, layer.view(), SmallOptions()).SerializeAsString();
  const std::string garbage = "\x0f\xff\xff\xff";
  for (const std::string& bytes : {start, garbage}) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    stream->Write(buffer);
  }
  stream->WritesDone();
  grpc::ByteBuffer response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("not a valid CompressRequest"), std::string::npos)
      << status.error_message();
  ExpectServerStillServes();
}

// float32 keys beyond fp16's range, asked back in fp16: a JobError naming output_dtype
// (OUT_OF_RANGE) instead of Inf rows with status OK; the stream goes on.
TEST_F(CompressReactorTest, ResultBeyondFloat16RangeIsAJobErrorNamingOutputDType) {
  RandomLayer layer = SmallLayer(6);
  for (int32_t t = 0; t < layer.spec().num_tokens; ++t) layer.SetKey(0, t, 0, 1e6f);
  v1::CompressRequest start = StartJobRequest(8, layer.view(), SmallOptions());
  start.mutable_start_job()->set_output_dtype(v1::DTYPE_FLOAT16);
  RawStream stream(stub_.get());
  ASSERT_TRUE(stream.Write(start));
  const LayerView view = layer.view();
  ASSERT_TRUE(stream.Write(SlabRequest(8, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view))));
  ASSERT_TRUE(
      stream.Write(SlabRequest(8, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view))));
  ASSERT_TRUE(stream.SendJob(9, layer.view(), SmallOptions()));  // float32 out: fine
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  std::map<uint64_t, v1::JobError> errors;
  auto results = DecodeResults(responses, &errors);
  ASSERT_EQ(errors.count(8), 1u);
  EXPECT_EQ(errors[8].code(), static_cast<int32_t>(absl::StatusCode::kOutOfRange));
  EXPECT_NE(errors[8].message().find("output_dtype"), std::string::npos) << errors[8].message();
  EXPECT_EQ(errors[8].field(), "start_job.output_dtype");
  EXPECT_EQ(results.count(8), 0u);
  EXPECT_EQ(results.count(9), 1u);
}

// The process's CPU time (every thread), for checking that cancelled work stops.
double ProcessCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// A big job cancelled with CancelJob, by the client's cancellation of the call and by the
// call's deadline: within a second the pool is empty and the server uses no more CPU. Both
// engines that run on the CPU check the flag inside their matching and merging loops: the
// reference backend (per source row; a small layer takes it seconds) and the cpu backend
// (per chunk of at most max_chunk_size rows; a layer of 8 x 16384 x 128 takes it a second or
// two). The call's deadline reaches the job the same way as the client's cancellation
// (OnCancel sets its flag); it is tried on the reference backend only, whose job surely
// outlives a deadline that leaves time to send it.
TEST_F(CompressReactorTest, CancelledBigJobStopsUsingCpuWithinASecond) {
  struct Case {
    v1::Backend backend;
    RandomLayer layer;
  };
  const Case cases[] = {
      // The reference job must outlive a 2.5 s deadline even on a quiet machine (about 9 s
      // uncancelled on this 2-vCPU box; 2 x 8192 tokens ended before the deadline there).
      {v1::BACKEND_REFERENCE, RandomLayer::Generate(test::Spec(4, 16384, 64, 64, 21, DType::kFloat16))},
      {v1::BACKEND_CPU, RandomLayer::Generate(test::Spec(8, 16384, 128, 128, 22, DType::kFloat16))}};
  CompressOptions options;
  options.target_ratio = 0.1;
  options.chunk_size = 4096;
  options.max_passes = 8;
  enum class How { kCancelJob, kCancelCall, kDeadline };
  for (const Case& big : cases) {
    for (How how : {How::kCancelJob, How::kCancelCall, How::kDeadline}) {
      if (how == How::kDeadline && big.backend != v1::BACKEND_REFERENCE) continue;
      SCOPED_TRACE(::testing::Message() << v1::Backend_Name(big.backend) << " how "
                                        << static_cast<int>(how));
      // The deadline leaves time to send the job and start it.
      constexpr std::chrono::milliseconds kDeadline{2500};
      const auto opened = std::chrono::steady_clock::now();
      RawStream stream(stub_.get(),
                       how == How::kDeadline ? kDeadline : std::chrono::milliseconds(0));
      ASSERT_TRUE(stream.SendJob(1, big.layer.view(), options, 1 << 20, big.backend));
      ASSERT_TRUE(WaitFor(
          [&] {
            return server_->context().executor->pending() == 1 &&
                   server_->context().executor->queued() == 0;
          },
          std::chrono::seconds(20)));
      const double started = ProcessCpuSeconds();
      ASSERT_TRUE(WaitFor([&] { return ProcessCpuSeconds() > started + 0.2; },
                          std::chrono::seconds(20)));
      ASSERT_EQ(server_->context().executor->pending(), 1) << "the job ended on its own";
      auto cancelled = std::chrono::steady_clock::now();
      if (how == How::kCancelJob) {
        v1::CompressRequest cancel;
        cancel.mutable_cancel_job()->set_job_id(1);
        ASSERT_TRUE(stream.Write(cancel));
      } else if (how == How::kCancelCall) {
        stream.context().TryCancel();
      } else {
        ASSERT_LT(cancelled, opened + kDeadline) << "the job must still run at its deadline";
        cancelled = opened + kDeadline;
      }
      EXPECT_TRUE(WaitFor([&] { return server_->context().executor->pending() == 0; },
                          std::chrono::seconds(20)));
      const double stopped_after =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled).count();
      EXPECT_LT(stopped_after, 1.0) << "the job ran on after it was cancelled";
      const double cpu_then = ProcessCpuSeconds();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_LT(ProcessCpuSeconds() - cpu_then, 0.05) << "CPU still burning after the cancel";
      std::vector<v1::CompressResponse> responses;
      const grpc::Status status = stream.Finish(&responses);
      EXPECT_EQ(status.ok(), how == How::kCancelJob) << status.error_message();
      EXPECT_TRUE(DecodeResults(responses).empty());
    }
  }
  ExpectServerStillServes();
}

}  // namespace
}  // namespace centroidkv::service::testing
