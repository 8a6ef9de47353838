// Tests of client/compress_stream_impl.cc, the CompressStream over gRPC, against a real
// in-process Server: the end of a stream (OutOfRange, Close, Submit after Close), job
// cancellation (no result for a cancelled job, whatever its state), stream deadlines,
// Abort, and stream failures that name the bad field.
#include "client/compress_stream_impl.h"

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/client/client.h"
#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "tests/client/client_testing.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;
using testutil::EngineResult;
using testutil::ExpectSameAsEngine;

class CompressStreamTest : public testutil::ServerTest {};

// EXPECTs that `status` has `code` and names `part` in its message.
void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& part) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(std::string(status.message()).find(part), std::string::npos)
      << "message of " << status << " does not name '" << part << "'";
}

RandomLayer SmallLayer(uint64_t seed) {
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 48, .key_dim = 8, .value_dim = 8,
      .seed = seed};
  return RandomLayer::Generate(spec);
}

LayerJob SmallJob(const RandomLayer& layer, uint32_t layer_index) {
  LayerJob job;
  job.layer_index = layer_index;
  job.layer = layer.view();
  job.options.chunk_size = 8;
  job.options.sink_tokens = 2;
  job.options.recent_tokens = 2;
  job.output_dtype = DType::kFloat32;
  job.backend = BackendKind::kReference;
  return job;
}

// A job that keeps the reference engine busy for a while (two passes over one 2048-entry
// chunk per head: about 10^8 multiply-adds in float64), for deadlines and cancellation.
RandomLayer HeavyLayer() {
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 2048, .key_dim = 64, .value_dim = 8,
      .seed = 77};
  return RandomLayer::Generate(spec);
}

LayerJob HeavyJob(const RandomLayer& layer, uint32_t layer_index) {
  LayerJob job;
  job.layer_index = layer_index;
  job.layer = layer.view();
  job.options.chunk_size = 2048;
  job.options.sink_tokens = 0;
  job.options.recent_tokens = 0;
  job.backend = BackendKind::kReference;
  return job;
}

// Reads the one result left on `stream`, checks it is `job`'s, then that nothing follows.
void ExpectOnlyResult(CompressStream* stream, const LayerJob& job) {
  absl::StatusOr<LayerResult> result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->layer_index, job.layer_index);
  ExpectSameAsEngine(EngineResult(job), DType::kFloat32, *result);
  absl::StatusOr<LayerResult> more = stream->Next();
  EXPECT_EQ(more.status().code(), absl::StatusCode::kOutOfRange)
      << (more.ok() ? "got a result for layer " + std::to_string(more->layer_index)
                    : more.status().ToString());
}

// ---------------------------------------------------------------------------------------
// The end of a stream.

TEST_F(CompressStreamTest, NextWithNothingSubmittedIsOutOfRange) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Close().ok());
}

TEST_F(CompressStreamTest, SubmitAfterCloseFails) {
  const RandomLayer layer = SmallLayer(1);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  ASSERT_TRUE(stream->Submit(SmallJob(layer, 0)).ok());
  ASSERT_TRUE(stream->Next().ok());
  ASSERT_TRUE(stream->Close().ok());
  absl::StatusOr<uint64_t> late = stream->Submit(SmallJob(layer, 1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
}

// Job ids are unique on a stream, and results are matched to them.
TEST_F(CompressStreamTest, JobIdsAreDistinctAndEchoed) {
  const RandomLayer a = SmallLayer(2), b = SmallLayer(3);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  absl::StatusOr<uint64_t> id_a = stream->Submit(SmallJob(a, 10));
  absl::StatusOr<uint64_t> id_b = stream->Submit(SmallJob(b, 11));
  ASSERT_TRUE(id_a.ok() && id_b.ok());
  EXPECT_NE(*id_a, *id_b);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->job_id, result->layer_index == 10 ? *id_a : *id_b);
  }
  EXPECT_TRUE(stream->Close().ok());
}

// ---------------------------------------------------------------------------------------
// Cancellation: "no result will come for it", whatever state the job is in.

TEST_F(CompressStreamTest, CancelledJobInFlightGetsNoResult) {
  const RandomLayer heavy = HeavyLayer(), small = SmallLayer(4);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  absl::StatusOr<uint64_t> heavy_id = stream->Submit(HeavyJob(heavy, 1));
  ASSERT_TRUE(heavy_id.ok()) << heavy_id.status();
  ASSERT_TRUE(stream->Cancel(*heavy_id).ok());
  ASSERT_TRUE(stream->Submit(SmallJob(small, 2)).ok());
  ExpectOnlyResult(stream.get(), SmallJob(small, 2));
  EXPECT_TRUE(stream->Close().ok());
}

// The result may already be at the client when Cancel is called (here: almost surely, after
// a pause); it must still not be returned, and the other job must be.
TEST_F(CompressStreamTest, CancelAfterTheResultArrivedDropsIt) {
  const RandomLayer a = SmallLayer(5), b = SmallLayer(6);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  absl::StatusOr<uint64_t> id_a = stream->Submit(SmallJob(a, 1));
  ASSERT_TRUE(id_a.ok()) << id_a.status();
  ASSERT_TRUE(stream->Submit(SmallJob(b, 2)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(stream->Cancel(*id_a).ok());
  ExpectOnlyResult(stream.get(), SmallJob(b, 2));
  EXPECT_TRUE(stream->Close().ok());
}

// Cancelling a job whose result Next() already returned changes nothing.
TEST_F(CompressStreamTest, CancelOfAReturnedJobIsHarmless) {
  const RandomLayer a = SmallLayer(7), b = SmallLayer(8);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  absl::StatusOr<uint64_t> id_a = stream->Submit(SmallJob(a, 1));
  ASSERT_TRUE(id_a.ok()) << id_a.status();
  ASSERT_TRUE(stream->Next().ok());
  ASSERT_TRUE(stream->Submit(SmallJob(b, 2)).ok());
  EXPECT_TRUE(stream->Cancel(*id_a).ok());
  ExpectOnlyResult(stream.get(), SmallJob(b, 2));
  EXPECT_TRUE(stream->Close().ok());
}

// A job cancelled while still queued behind a large one is never sent: after Cancel returns
// its buffers are the caller's again (here overwritten with NaN, which the server would
// reject), and the server receives only the large job.
TEST_F(CompressStreamTest, CancelledJobBuffersAreNotReadAfterCancel) {
  RandomLayerSpec big_spec{.num_heads = 2, .num_tokens = 8192, .key_dim = 64, .value_dim = 64,
      .seed = 13};
  const RandomLayer big = RandomLayer::Generate(big_spec);  // 8 MiB: 32 slabs
  RandomLayer small = SmallLayer(14);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  const service::ServiceMetrics& counters = server_->context().metrics;
  const int64_t received_before = counters.jobs_received();
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  LayerJob big_job = SmallJob(big, 1);
  big_job.options.chunk_size = 64;
  ASSERT_TRUE(stream->Submit(big_job).ok());
  absl::StatusOr<uint64_t> small_id = stream->Submit(SmallJob(small, 2));
  ASSERT_TRUE(small_id.ok()) << small_id.status();
  ASSERT_TRUE(stream->Cancel(*small_id).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int32_t t = 0; t < small.spec().num_tokens; ++t) small.SetKey(0, t, 0, nan);
  ExpectOnlyResult(stream.get(), big_job);
  EXPECT_TRUE(stream->Close().ok());
  EXPECT_EQ(counters.jobs_received() - received_before, 1);
}

TEST_F(CompressStreamTest, CancelOfAnUnknownJobIsNotFound) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  EXPECT_EQ(stream->Cancel(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(stream->Close().ok());
}

// ---------------------------------------------------------------------------------------
// Deadlines, Abort, and failures of the whole stream.

TEST_F(CompressStreamTest, DeadlineExpiresWhileAJobComputes) {
  const RandomLayer heavy = HeavyLayer();
  ClientOptions options = Options();
  options.stream_deadline = std::chrono::milliseconds(50);
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  // Submit may already see the expired stream; either way the stream's status is the same.
  absl::StatusOr<uint64_t> id = stream->Submit(HeavyJob(heavy, 1));
  if (id.ok()) {
    EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_EQ(stream->Close().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CompressStreamTest, DeadlineExpiresOnAnIdleStream) {
  const RandomLayer layer = SmallLayer(9);
  ClientOptions options = Options();
  options.stream_deadline = std::chrono::milliseconds(100);
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(stream->Close().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(stream->Submit(SmallJob(layer, 0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CompressStreamTest, AbortEndsTheStreamCancelled) {
  const RandomLayer heavy = HeavyLayer();
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  ASSERT_TRUE(stream->Submit(HeavyJob(heavy, 1)).ok());
  stream->Abort();
  EXPECT_EQ(stream->Next().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(stream->Close().code(), absl::StatusCode::kCancelled);
}

// Destroying a stream with a job in flight cancels it instead of waiting for the result.
TEST_F(CompressStreamTest, DestroyingAStreamWithJobsInFlightReturnsPromptly) {
  const RandomLayer heavy = HeavyLayer();
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_ptr<CompressStream> stream = client->OpenStream();
    ASSERT_TRUE(stream->Submit(HeavyJob(heavy, 1)).ok());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(CompressStreamTest, BadParameterFailsThatJobNamingTheFieldAndTheStreamGoesOn) {
  const RandomLayer layer = SmallLayer(10);
  LayerJob job = SmallJob(layer, 0);
  job.options.chunk_size = 1;
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  ASSERT_TRUE(stream->Submit(job).ok());
  absl::StatusOr<LayerResult> failed = stream->Next();
  ASSERT_TRUE(failed.ok()) << failed.status();
  ExpectError(failed->status, absl::StatusCode::kInvalidArgument, "chunk_size");
  auto location = GetFieldLocation(failed->status);
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "start_job.params.chunk_size");
  // The stream goes on.
  ASSERT_TRUE(stream->Submit(SmallJob(layer, 1)).ok());
  absl::StatusOr<LayerResult> next = stream->Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->status.ok()) << next->status;
  EXPECT_TRUE(stream->Close().ok());
}

TEST_F(CompressStreamTest, ZeroCountFailsThatJobNamingCountsHeadAndToken) {
  RandomLayer layer = SmallLayer(11);
  layer.SetCount(1, 20, 0);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results =
      client->CompressLayers({SmallJob(layer, 0)});
  ASSERT_TRUE(results.ok()) << results.status();
  ExpectError((*results)[0].status, absl::StatusCode::kInvalidArgument, "counts");
  auto location = GetFieldLocation((*results)[0].status);
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "counts");
  EXPECT_EQ(location->head, 1);
  EXPECT_EQ(location->token, 20);
}

TEST_F(CompressStreamTest, GpuBackendWithoutAGpuIsFailedPrecondition) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ServerInfo> info = client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  for (const std::string& backend : info->backends) {
    if (backend.rfind("cuda", 0) == 0) GTEST_SKIP() << "this server has " << backend;
  }
  const RandomLayer layer = SmallLayer(12);
  LayerJob job = SmallJob(layer, 0);
  job.backend = BackendKind::kCuda;
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers({job});
  ASSERT_TRUE(results.ok()) << results.status();
  ExpectError((*results)[0].status, absl::StatusCode::kFailedPrecondition, "gpu");
}

}  // namespace
}  // namespace centroidkv::client
