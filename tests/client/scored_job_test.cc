// Scored, budgeted and fitted jobs through a real server on loopback: the C++ client sends
// scores and reference queries as slabs (also for a job in shared memory), the result
// (rows, counts, assignment, budgets, exact entries, log-weights) is the in-process
// engine's bit for bit, and bad scores, queries and options come back as JobErrors naming
// the wire field, head and entry while the stream goes on.
#include <cmath>
#include <functional>
#include <optional>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "centroidkv/client/client.h"
#include "centroidkv/client/shm_region.h"
#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_engine.h"
#include "tests/client/client_testing.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::client {
namespace {

using test::RandomLayer;

class ScoredJobClientTest : public testutil::ServerTest {};

struct ScoredInput {
  RandomLayer layer;
  std::vector<float> scores;
  std::vector<float> queries;
};

ScoredInput MakeInput(uint64_t seed) {
  test::RandomLayerSpec spec = test::Spec(4, 160, 32, 24, seed, DType::kFloat16);
  spec.prototypes = 10;
  spec.noise = 0.2;
  ScoredInput input{RandomLayer::Generate(spec), {}, {}};
  input.scores.resize(4 * 160);
  for (size_t i = 0; i < input.scores.size(); ++i) {
    input.scores[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
  }
  input.queries.resize(8 * 16 * 32);
  for (size_t i = 0; i < input.queries.size(); ++i) {
    input.queries[i] = std::sin(0.37f * static_cast<float>(i));
  }
  return input;
}

LayerJob ScoredJob(const ScoredInput& input, bool fitted) {
  LayerJob job;
  job.layer = input.layer.view();
  job.layer.scores = input.scores.data();
  if (fitted) {
    job.layer.queries = input.queries.data();
    job.layer.num_query_heads = 8;
    job.layer.num_queries = 16;
  }
  job.options.head_budgets = {40, 24, 160, 60};
  job.options.passthrough_heads = {2};
  job.options.sink_tokens = 4;
  job.options.recent_tokens = 8;
  job.options.chunk_size = 32;
  job.options.centroid_share = 0.3;
  job.options.compute_assignment = true;
  job.options.fit.block_tokens = 64;
  job.output_dtype = DType::kFloat32;
  job.backend = BackendKind::kCpu;
  return job;
}

// The job on an in-process cpu backend, as the server runs it (its fit in float32 with the
// same kernels).
CompressResult CpuResult(const LayerJob& job) {
  static const cpu::CpuEngine engine;
  absl::StatusOr<CompressResult> result = engine.Compress(job.layer, job.options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : CompressResult{};
}

void ExpectSameAsEngineJob(const LayerJob& job, const LayerResult& got) {
  ASSERT_TRUE(got.status.ok()) << got.status;
  const CompressResult want = CpuResult(job);
  test::ExpectBitIdentical(want, testutil::AsEngineResult(got));
  EXPECT_TRUE(got.target_reached);
}

TEST_F(ScoredJobClientTest, ScoredAndFittedJobsEqualTheEngine) {
  const ScoredInput input = MakeInput(11);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  for (bool fitted : {false, true}) {
    SCOPED_TRACE(fitted ? "fitted" : "scored");
    const LayerJob job = ScoredJob(input, fitted);
    absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers({job});
    ASSERT_TRUE(results.ok()) << results.status();
    const LayerResult& got = results->front();
    ExpectSameAsEngineJob(job, got);
    EXPECT_EQ(got.head_budgets, (std::vector<int32_t>{40, 24, 160, 60}));
    ASSERT_EQ(got.head_exact_entries.size(), 4u);
    EXPECT_EQ(got.head_exact_entries[2], 160);  // the passthrough head
    for (int32_t h = 0; h < 4; ++h) {
      EXPECT_LE(got.offsets[h + 1] - got.offsets[h], job.options.head_budgets[h]);
    }
    EXPECT_EQ(got.log_weights.size(), fitted ? static_cast<size_t>(got.total_entries()) : 0u);
  }
}

// fp16 rows out, padded, token-major: the scored job's rows in the layout asked, log-weights
// padded with it.
TEST_F(ScoredJobClientTest, FittedJobsPadAndRoundLikeOthers) {
  const ScoredInput input = MakeInput(12);
  LayerJob job = ScoredJob(input, true);
  job.output_dtype = DType::kFloat16;
  job.options.pad_heads = true;
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results = client->CompressLayers({job});
  ASSERT_TRUE(results.ok()) << results.status();
  const LayerResult& got = results->front();
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.dtype, DType::kFloat16);
  EXPECT_EQ(got.padded_length, 160);
  EXPECT_EQ(got.log_weights.size(), 4u * 160u);
  const CompressResult want = CpuResult(job);
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.log_weights, want.log_weights);
}

TEST_F(ScoredJobClientTest, BadScoresQueriesAndOptionsNameTheField) {
  const ScoredInput input = MakeInput(13);
  struct Case {
    const char* name;
    std::function<void(LayerJob*, std::vector<float>*, std::vector<float>*)> mutate;
    std::string field;
    std::optional<uint32_t> head, token;
  };
  const std::vector<Case> cases = {
      {"score NaN", [](LayerJob*, std::vector<float>* s, std::vector<float>*) {
         (*s)[160 + 9] = NAN;
       }, "scores", 1, 9},
      {"query Inf", [](LayerJob*, std::vector<float>*, std::vector<float>* q) {
         (*q)[(3 * 16 + 2) * 32] = INFINITY;
       }, "queries", 3, 2},
      {"share above one", [](LayerJob* j, std::vector<float>*, std::vector<float>*) {
         j->options.centroid_share = 1.5;
       }, "start_job.selection.centroid_share", std::nullopt, std::nullopt},
      {"query heads do not divide", [](LayerJob* j, std::vector<float>*, std::vector<float>*) {
         j->layer.num_query_heads = 6;
         j->layer.num_queries = 16;
       }, "start_job.fit.num_query_heads", std::nullopt, std::nullopt},
      {"budget below the protected entries",
       [](LayerJob* j, std::vector<float>*, std::vector<float>*) {
         j->options.head_budgets = {40, 10, 160, 60};
       }, "start_job.head_budgets", 1, std::nullopt},
      {"budgets of the wrong length", [](LayerJob* j, std::vector<float>*, std::vector<float>*) {
         j->options.head_budgets = {40, 24};
       }, "start_job.head_budgets", std::nullopt, std::nullopt},
  };
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<CompressStream> stream = client->OpenStream();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> scores = input.scores, queries = input.queries;
    LayerJob job = ScoredJob(input, true);
    job.layer.scores = scores.data();
    job.layer.queries = queries.data();
    c.mutate(&job, &scores, &queries);
    ASSERT_TRUE(stream->Submit(job).ok());
    absl::StatusOr<LayerResult> got = stream->Next();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status.code(), absl::StatusCode::kInvalidArgument) << got->status;
    const std::optional<FieldLocation> where = GetFieldLocation(got->status);
    ASSERT_TRUE(where.has_value()) << got->status;
    EXPECT_EQ(where->field, c.field) << got->status;
    EXPECT_EQ(where->head, c.head.has_value() ? std::optional<int64_t>(*c.head) : std::nullopt);
    EXPECT_EQ(where->token,
              c.token.has_value() ? std::optional<int64_t>(*c.token) : std::nullopt);
  }
  // The stream still serves: a good job after the bad ones.
  const LayerJob good = ScoredJob(input, true);
  ASSERT_TRUE(stream->Submit(good).ok());
  absl::StatusOr<LayerResult> got = stream->Next();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameAsEngineJob(good, *got);
  EXPECT_TRUE(stream->Close().ok());
}

}  // namespace
}  // namespace centroidkv::client
