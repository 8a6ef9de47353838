// Tests of kernels/engine.cc: validation and planning shared by every backend (PlanLayer and
// the non-virtual ClusterEngine::Compress), run through the reference engine.
#include "centroidkv/kernels/engine.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_engine.h"
#include "tests/testing/random_layer.h"

namespace centroidkv {

// Readable test parameters in failure messages (found by ADL in TensorLayout's namespace).
static void PrintTo(TensorLayout layout, std::ostream* os) { *os << TensorLayoutName(layout); }

namespace {

using test::RandomLayer;
using test::RandomLayerSpec;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// EXPECTs an error of `code` whose message names `field` (and any further `also`).
void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& field,
                 const std::vector<std::string>& also = {}) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, field, std::string(status.message()));
  for (const std::string& needle : also) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, std::string(status.message()));
  }
}

// H=2, n=40, dk=8, dv=12: dk != dv so that the limit errors can tell them apart.
RandomLayerSpec BaseSpec() {
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 40, .key_dim = 8, .value_dim = 12,
      .seed = 20240601};
  return spec;
}

// Checks PlanLayer and Compress (which must agree) on a job.
absl::Status Validate(const LayerView& layer, const CompressOptions& options,
                      const EngineLimits& limits = {}) {
  const absl::Status plan_status = PlanLayer(layer, options, limits).status();
  const absl::Status compress_status = ReferenceEngine(limits).Compress(layer, options).status();
  EXPECT_EQ(plan_status, compress_status) << "PlanLayer and Compress disagree";
  return plan_status;
}

struct BadJobCase {
  std::string name;
  std::function<void(LayerView*, CompressOptions*, EngineLimits*)> mutate;
  absl::StatusCode code;
  std::string field;  // the message must name it
};

void PrintTo(const BadJobCase& c, std::ostream* os) { *os << c.name; }

class BadJobTest : public ::testing::TestWithParam<BadJobCase> {};

TEST_P(BadJobTest, IsRejectedNamingTheField) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  LayerView view = layer.view();
  CompressOptions options;
  EngineLimits limits;
  GetParam().mutate(&view, &options, &limits);
  ExpectError(Validate(view, options, limits), GetParam().code, GetParam().field);
}

using LV = LayerView;
using CO = CompressOptions;
using EL = EngineLimits;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Dims, BadJobTest,
    ::testing::Values(
        BadJobCase{"ZeroHeads", [](LV* l, CO*, EL*) { l->num_heads = 0; }, kInvalid, "num_heads"},
        BadJobCase{"ZeroTokens", [](LV* l, CO*, EL*) { l->num_tokens = 0; }, kInvalid,
                   "num_tokens"},
        BadJobCase{"NegativeTokens", [](LV* l, CO*, EL*) { l->num_tokens = -3; }, kInvalid,
                   "num_tokens"},
        BadJobCase{"ZeroKeyDim", [](LV* l, CO*, EL*) { l->key_dim = 0; }, kInvalid, "key_dim"},
        BadJobCase{"ZeroValueDim", [](LV* l, CO*, EL*) { l->value_dim = 0; }, kInvalid,
                   "value_dim"},
        BadJobCase{"HeadsAboveLimit", [](LV*, CO*, EL* e) { e->max_heads = 1; }, kInvalid,
                   "num_heads"},
        BadJobCase{"TokensAboveLimit", [](LV*, CO*, EL* e) { e->max_tokens = 39; }, kInvalid,
                   "num_tokens"},
        BadJobCase{"KeyDimAboveLimit", [](LV*, CO*, EL* e) { e->max_dim = 7; }, kInvalid,
                   "key_dim"},
        BadJobCase{"ValueDimAboveLimit", [](LV*, CO*, EL* e) { e->max_dim = 10; }, kInvalid,
                   "value_dim"},
        BadJobCase{"TooManyElements",
                   [](LV*, CO*, EL* e) { e->max_layer_elements = 2 * 40 * (8 + 12) - 1; },
                   absl::StatusCode::kResourceExhausted, "elements"},
        BadJobCase{"ChunkSizeAboveLimit",
                   [](LV*, CO* o, EL* e) {
                     o->chunk_size = 17;
                     e->max_chunk_size = 16;
                   },
                   absl::StatusCode::kResourceExhausted, "chunk_size"},
        BadJobCase{"MissingKeys", [](LV* l, CO*, EL*) { l->keys = nullptr; }, kInvalid, "keys"},
        BadJobCase{"MissingValues", [](LV* l, CO*, EL*) { l->values = nullptr; }, kInvalid,
                   "values"}),
    [](const ::testing::TestParamInfo<BadJobCase>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Options, BadJobTest,
    ::testing::Values(
        BadJobCase{"TargetRatioZero", [](LV*, CO* o, EL*) { o->target_ratio = 0.0; }, kInvalid,
                   "target_ratio"},
        BadJobCase{"TargetRatioAboveOne", [](LV*, CO* o, EL*) { o->target_ratio = 1.5; }, kInvalid,
                   "target_ratio"},
        BadJobCase{"TargetRatioNegative", [](LV*, CO* o, EL*) { o->target_ratio = -0.25; },
                   kInvalid, "target_ratio"},
        BadJobCase{"TargetRatioNaN", [](LV*, CO* o, EL*) { o->target_ratio = kNaN; }, kInvalid,
                   "target_ratio"},
        BadJobCase{"BothTargets",
                   [](LV*, CO* o, EL*) {
                     o->target_ratio = 0.5;
                     o->target_tokens = 10;
                   },
                   kInvalid, "target_tokens"},
        BadJobCase{"TargetTokensZero", [](LV*, CO* o, EL*) { o->target_tokens = 0; }, kInvalid,
                   "target_tokens"},
        BadJobCase{"TargetTokensNegative", [](LV*, CO* o, EL*) { o->target_tokens = -5; }, kInvalid,
                   "target_tokens"},
        BadJobCase{"ChunkSizeOne", [](LV*, CO* o, EL*) { o->chunk_size = 1; }, kInvalid,
                   "chunk_size"},
        BadJobCase{"ChunkSizeNegative", [](LV*, CO* o, EL*) { o->chunk_size = -8; }, kInvalid,
                   "chunk_size"},
        BadJobCase{"SinkTokensNegative", [](LV*, CO* o, EL*) { o->sink_tokens = -1; }, kInvalid,
                   "sink_tokens"},
        BadJobCase{"RecentTokensNegative", [](LV*, CO* o, EL*) { o->recent_tokens = -1; }, kInvalid,
                   "recent_tokens"},
        BadJobCase{"MinSimilarityTwo", [](LV*, CO* o, EL*) { o->min_similarity = 2.0; }, kInvalid,
                   "min_similarity"},
        BadJobCase{"MinSimilarityBelowMinusOne", [](LV*, CO* o, EL*) { o->min_similarity = -1.01; },
                   kInvalid, "min_similarity"},
        BadJobCase{"MinSimilarityNaN", [](LV*, CO* o, EL*) { o->min_similarity = kNaN; }, kInvalid,
                   "min_similarity"},
        BadJobCase{"TightenNegative", [](LV*, CO* o, EL*) { o->tighten_per_pass = -0.01; },
                   kInvalid, "tighten_per_pass"},
        BadJobCase{"TightenNaN", [](LV*, CO* o, EL*) { o->tighten_per_pass = kNaN; }, kInvalid,
                   "tighten_per_pass"},
        BadJobCase{"TightenInfinite",
                   [](LV*, CO* o, EL*) { o->tighten_per_pass = static_cast<double>(kInf); },
                   kInvalid, "tighten_per_pass"},
        BadJobCase{"MaxPassesZero", [](LV*, CO* o, EL*) { o->max_passes = 0; }, kInvalid,
                   "max_passes"},
        BadJobCase{"PassthroughHeadTooLarge",
                   [](LV*, CO* o, EL*) { o->passthrough_heads = {0, 2}; }, kInvalid,
                   "passthrough_heads"},
        BadJobCase{"PassthroughHeadNegative", [](LV*, CO* o, EL*) { o->passthrough_heads = {-1}; },
                   kInvalid, "passthrough_heads"}),
    [](const ::testing::TestParamInfo<BadJobCase>& info) { return info.param.name; });

TEST(EngineValidationTest, BothTargetsNamesBoth) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  CompressOptions options;
  options.target_ratio = 0.5;
  options.target_tokens = 10;
  ExpectError(Validate(layer.view(), options), kInvalid, "target_ratio", {"target_tokens"});
}

TEST(EngineValidationTest, ElementLimitIsInclusive) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  EngineLimits limits;
  limits.max_layer_elements = 2 * 40 * (8 + 12);
  limits.max_heads = 2;
  limits.max_tokens = 40;
  limits.max_dim = 12;
  EXPECT_TRUE(Validate(layer.view(), CompressOptions{}, limits).ok());
}

TEST(EngineValidationTest, BoundaryOptionsAreAccepted) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  std::vector<std::function<void(CompressOptions*)>> mutations = {
      [](CompressOptions* o) { o->target_ratio = 1.0; },
      [](CompressOptions* o) { o->target_ratio = 1e-9; },
      [](CompressOptions* o) { o->target_tokens = 1; },
      [](CompressOptions* o) { o->target_tokens = 1000; },
      [](CompressOptions* o) { o->chunk_size = 2; },
      [](CompressOptions* o) {
        o->sink_tokens = 0;
        o->recent_tokens = 0;
      },
      [](CompressOptions* o) {
        o->sink_tokens = 100;
        o->recent_tokens = 100;
      },
      [](CompressOptions* o) { o->min_similarity = -1.0; },
      [](CompressOptions* o) { o->min_similarity = 1.0; },
      [](CompressOptions* o) { o->max_passes = 1; },
      [](CompressOptions* o) {
        o->passthrough_heads = {0, 1};
      }};
  for (size_t i = 0; i < mutations.size(); ++i) {
    CompressOptions options;
    mutations[i](&options);
    EXPECT_TRUE(Validate(layer.view(), options).ok()) << "mutation " << i;
  }
}

class BadDataTest : public ::testing::TestWithParam<TensorLayout> {
 protected:
  RandomLayer MakeLayer(DType dtype = DType::kFloat32) const {
    RandomLayerSpec spec = BaseSpec();
    spec.layout = GetParam();
    spec.dtype = dtype;
    return RandomLayer::Generate(spec);
  }
};

TEST_P(BadDataTest, NaNInKeys) {
  RandomLayer layer = MakeLayer();
  layer.SetKey(1, 3, 5, std::numeric_limits<float>::quiet_NaN());
  ExpectError(Validate(layer.view(), {}), kInvalid, "keys", {"head 1", "token 3", "dim 5"});
}

TEST_P(BadDataTest, InfInKeys) {
  for (float inf : {kInf, -kInf}) {
    RandomLayer layer = MakeLayer();
    layer.SetKey(0, 39, 7, inf);
    ExpectError(Validate(layer.view(), {}), kInvalid, "keys", {"head 0", "token 39"});
  }
}

TEST_P(BadDataTest, InfInHalfKeys) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    RandomLayer layer = MakeLayer(dtype);
    layer.SetKey(1, 0, 0, 1e30f);  // overflows to inf in fp16; stays finite in bf16
    const absl::Status status = Validate(layer.view(), {});
    if (dtype == DType::kFloat16) {
      ExpectError(status, kInvalid, "keys", {"head 1", "token 0"});
    } else {
      EXPECT_TRUE(status.ok()) << status;
    }
  }
}

TEST_P(BadDataTest, NaNInValues) {
  RandomLayer layer = MakeLayer();
  layer.SetValue(1, 20, 11, std::numeric_limits<float>::quiet_NaN());
  ExpectError(Validate(layer.view(), {}), kInvalid, "values", {"head 1", "token 20", "dim 11"});
}

TEST_P(BadDataTest, InfInValues) {
  RandomLayer layer = MakeLayer();
  layer.SetValue(0, 0, 0, -kInf);
  ExpectError(Validate(layer.view(), {}), kInvalid, "values", {"head 0", "token 0"});
}

TEST_P(BadDataTest, ZeroCount) {
  RandomLayer layer = MakeLayer();
  layer.SetCount(1, 17, 0);
  ExpectError(Validate(layer.view(), {}), kInvalid, "counts", {"head 1", "token 17"});
}

TEST_P(BadDataTest, CountsSummingPastUint32) {
  constexpr uint32_t kMax = std::numeric_limits<uint32_t>::max();
  RandomLayer layer = MakeLayer();
  // Head 1: 39 entries of 1 plus one entry of kMax - 39 sum to exactly kMax: allowed.
  layer.SetCount(1, 5, kMax - 39);
  EXPECT_TRUE(Validate(layer.view(), {}).ok());
  // One more and the head's sum no longer fits.
  layer.SetCount(1, 6, 2);
  ExpectError(Validate(layer.view(), {}), kInvalid, "counts", {"head 1"});
}

INSTANTIATE_TEST_SUITE_P(Layouts, BadDataTest,
                         ::testing::Values(TensorLayout::kHeadMajor, TensorLayout::kTokenMajor),
                         [](const ::testing::TestParamInfo<TensorLayout>& info) {
                           return info.param == TensorLayout::kHeadMajor ? "HeadMajor"
                                                                         : "TokenMajor";
                         });

TEST(PlanLayerTest, DefaultsResolve) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  absl::StatusOr<LayerPlan> plan = PlanLayer(layer.view(), {}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->target_length, 10);  // ceil(0.25 * 40)
  EXPECT_EQ(plan->passthrough, std::vector<bool>(2, false));
  EXPECT_EQ(plan->compressed_heads, 2);
  EXPECT_EQ(plan->options.chunk_size, CompressOptions::kDefaultChunkSize);
  EXPECT_EQ(plan->FloorForPass(0), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(plan->FloorForPass(7), -std::numeric_limits<double>::infinity());
}

TEST(PlanLayerTest, TargetRatioBoundaryIsExact) {
  // 0.3 * 40 is 12 in double arithmetic, not 12.000...1: t must be 12, not 13.
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  CompressOptions options;
  options.target_ratio = 0.3;
  absl::StatusOr<LayerPlan> plan = PlanLayer(layer.view(), options, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->target_length, 12);

  // And the engine reaches it: S=2, W=4, C=8 leaves enough edges for 3 passes.
  options.sink_tokens = 2;
  options.recent_tokens = 4;
  options.chunk_size = 8;
  absl::StatusOr<CompressResult> result = ReferenceEngine().Compress(layer.view(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->offsets, (std::vector<int64_t>{0, 12, 24}));
  EXPECT_EQ(result->passes_run, 3);
}

TEST(PlanLayerTest, TargetsResolve) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  const std::vector<std::pair<CompressOptions, int64_t>> cases = [] {
    std::vector<std::pair<CompressOptions, int64_t>> out;
    CompressOptions options;
    options.target_ratio = 1.0;
    out.emplace_back(options, 40);
    options.target_ratio = 0.01;  // ceil(0.4)
    out.emplace_back(options, 1);
    options.target_ratio = 0.5;
    out.emplace_back(options, 20);
    options.target_ratio = 0.51;  // ceil(20.4)
    out.emplace_back(options, 21);
    options.target_ratio.reset();
    options.target_tokens = 17;
    out.emplace_back(options, 17);
    options.target_tokens = 400;  // clamped to n
    out.emplace_back(options, 40);
    return out;
  }();
  for (const auto& [options, expected] : cases) {
    absl::StatusOr<LayerPlan> plan = PlanLayer(layer.view(), options, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->target_length, expected) << "ratio " << options.target_ratio.value_or(-1)
                                             << " tokens " << options.target_tokens.value_or(-1);
  }
}

TEST(PlanLayerTest, PassthroughAndFloor) {
  RandomLayerSpec spec = BaseSpec();
  spec.num_heads = 4;
  const RandomLayer layer = RandomLayer::Generate(spec);
  CompressOptions options;
  options.passthrough_heads = {3, 1};
  options.min_similarity = 0.9;
  options.tighten_per_pass = 0.01;
  absl::StatusOr<LayerPlan> plan = PlanLayer(layer.view(), options, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->passthrough, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(plan->compressed_heads, 2);
  EXPECT_DOUBLE_EQ(plan->FloorForPass(0), 0.9);
  EXPECT_DOUBLE_EQ(plan->FloorForPass(2), 0.92);
}

// CompressInto's default (CompressReusingImpl): the earlier result, of another shape, is
// emptied and the job runs as in Compress.
TEST(CompressIntoTest, ReplacesAnEarlierResult) {
  const ReferenceEngine engine;
  RandomLayerSpec big = BaseSpec();
  big.num_tokens = 90;
  big.with_counts = true;
  const RandomLayer small_layer = RandomLayer::Generate(BaseSpec());
  const RandomLayer big_layer = RandomLayer::Generate(big);
  CompressResult reused;
  for (const RandomLayer* layer : {&big_layer, &small_layer, &big_layer}) {
    absl::StatusOr<CompressResult> fresh = engine.Compress(layer->view(), {});
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    ASSERT_TRUE(engine.CompressInto(layer->view(), {}, &reused).ok());
    EXPECT_EQ(reused.offsets, fresh->offsets);
    EXPECT_EQ(reused.keys, fresh->keys);
    EXPECT_EQ(reused.values, fresh->values);
    EXPECT_EQ(reused.counts, fresh->counts);
    EXPECT_EQ(reused.assignment, fresh->assignment);
    EXPECT_EQ(reused.passes_run, fresh->passes_run);
  }
  RandomLayer bad = RandomLayer::Generate(BaseSpec());
  bad.SetKey(1, 3, 5, std::numeric_limits<float>::quiet_NaN());
  ExpectError(engine.CompressInto(bad.view(), {}, &reused), kInvalid, "keys", {"head 1"});
}

TEST(CompressControlTest, CancelledBeforeStartReturnsCancelled) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  std::atomic<bool> cancelled{true};
  CompressControl control;
  control.cancelled = &cancelled;
  absl::StatusOr<CompressResult> result = ReferenceEngine().Compress(layer.view(), {}, control);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
}

TEST(CompressControlTest, UnsetFlagRuns) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  std::atomic<bool> cancelled{false};
  CompressControl control;
  control.cancelled = &cancelled;
  EXPECT_FALSE(control.IsCancelled());
  EXPECT_FALSE(CompressControl{}.IsCancelled());
  absl::StatusOr<CompressResult> result = ReferenceEngine().Compress(layer.view(), {}, control);
  EXPECT_TRUE(result.ok()) << result.status();
}

TEST(CompressControlTest, InvalidJobIsReportedBeforeCancellation) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  std::atomic<bool> cancelled{true};
  CompressControl control;
  control.cancelled = &cancelled;
  CompressOptions options;
  options.chunk_size = 1;
  absl::StatusOr<CompressResult> result =
      ReferenceEngine().Compress(layer.view(), options, control);
  EXPECT_EQ(result.status().code(), kInvalid) << result.status();
}

TEST(TensorLayoutTest, NamesAndOffsets) {
  EXPECT_EQ(TensorLayoutName(TensorLayout::kHeadMajor), "head_major");
  EXPECT_EQ(TensorLayoutName(TensorLayout::kTokenMajor), "token_major");
  LayerView view{.num_heads = 3, .num_tokens = 5, .key_dim = 4, .value_dim = 2};
  EXPECT_EQ(view.RowIndex(2, 1), 2 * 5 + 1);
  EXPECT_EQ(view.KeyOffset(2, 1), (2 * 5 + 1) * 4);
  view.layout = TensorLayout::kTokenMajor;
  EXPECT_EQ(view.RowIndex(2, 1), 1 * 3 + 2);
  EXPECT_EQ(view.ValueOffset(2, 1), (1 * 3 + 2) * 2);
  EXPECT_EQ(view.CountAt(2, 1), 1u);  // no counts: all 1
}

}  // namespace
}  // namespace centroidkv

namespace centroidkv {
namespace {

// Scored, budgeted and fitted jobs: each bad field refused by name (and head / entry where
// one is at fault), by PlanLayer and Compress alike.
struct BadScoredCase {
  std::string name;
  std::function<void(LayerView*, CompressOptions*, std::vector<float>* scores,
                      std::vector<float>* queries)>
      mutate;
  std::string field;
  std::optional<int64_t> head = std::nullopt, token = std::nullopt;
};

void PrintTo(const BadScoredCase& c, std::ostream* os) { *os << c.name; }

class BadScoredJobTest : public ::testing::TestWithParam<BadScoredCase> {};

TEST_P(BadScoredJobTest, IsRejectedNamingTheField) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());  // H=2, n=40, dk=8
  std::vector<float> scores(2 * 40, 1.0f), queries(4 * 3 * 8, 0.5f);
  LayerView view = layer.view();
  view.scores = scores.data();
  view.queries = queries.data();
  view.num_query_heads = 4;
  view.num_queries = 3;
  CompressOptions options;
  options.sink_tokens = 2;
  options.recent_tokens = 4;
  ASSERT_TRUE(Validate(view, options).ok()) << "the unmutated job is valid";
  GetParam().mutate(&view, &options, &scores, &queries);
  const absl::Status status = Validate(view, options);
  ExpectError(status, kInvalid, GetParam().field);
  const std::optional<FieldLocation> where = GetFieldLocation(status);
  ASSERT_TRUE(where.has_value()) << status;
  EXPECT_EQ(where->field, GetParam().field);
  EXPECT_EQ(where->head, GetParam().head);
  EXPECT_EQ(where->token, GetParam().token);
}

using Scores = std::vector<float>;
INSTANTIATE_TEST_SUITE_P(
    Fields, BadScoredJobTest,
    ::testing::Values(
        BadScoredCase{"ScoreNaN", [](LV*, CO*, Scores* s, Scores*) { (*s)[40 + 7] = kNaN; },
                      "scores", 1, 7},
        BadScoredCase{"ScoreInf", [](LV*, CO*, Scores* s, Scores*) { (*s)[3] = -kInf; },
                      "scores", 0, 3},
        BadScoredCase{"QueryNaN", [](LV*, CO*, Scores*, Scores* q) { (*q)[(2 * 3 + 1) * 8 + 5] = kNaN; },
                      "queries", 2, 1},
        BadScoredCase{"QueryHeadsDoNotDivide",
                      [](LV* l, CO*, Scores*, Scores*) { l->num_query_heads = 3; },
                      "num_query_heads"},
        BadScoredCase{"NoQueriesPerHead", [](LV* l, CO*, Scores*, Scores*) { l->num_queries = 0; },
                      "num_queries"},
        BadScoredCase{"QueriesMissing", [](LV* l, CO*, Scores*, Scores*) { l->queries = nullptr; },
                      "queries"},
        BadScoredCase{"ShareAboveOne", [](LV*, CO* o, Scores*, Scores*) { o->centroid_share = 1.5; },
                      "centroid_share"},
        BadScoredCase{"ShareNegative",
                      [](LV*, CO* o, Scores*, Scores*) { o->centroid_share = -0.1; },
                      "centroid_share"},
        BadScoredCase{"ShareNaN", [](LV*, CO* o, Scores*, Scores*) { o->centroid_share = kNaN; },
                      "centroid_share"},
        BadScoredCase{"MaxClusterNegative",
                      [](LV*, CO* o, Scores*, Scores*) { o->max_cluster_size = -1; },
                      "max_cluster_size"},
        BadScoredCase{"BudgetsWrongLength",
                      [](LV*, CO* o, Scores*, Scores*) { o->head_budgets = {10}; },
                      "head_budgets"},
        BadScoredCase{"BudgetZero",
                      [](LV*, CO* o, Scores*, Scores*) { o->head_budgets = {10, 0}; },
                      "head_budgets", 1},
        BadScoredCase{"BudgetBelowProtected",
                      [](LV*, CO* o, Scores*, Scores*) { o->head_budgets = {10, 5}; },
                      "head_budgets", 1},
        BadScoredCase{"TargetBelowProtected",
                      [](LV*, CO* o, Scores*, Scores*) { o->target_tokens = 5; },
                      "target_tokens", 0},
        BadScoredCase{"PassthroughOverBudget",
                      [](LV*, CO* o, Scores*, Scores*) {
                        o->passthrough_heads = {1};
                        o->head_budgets = {10, 39};
                      },
                      "head_budgets", 1},
        BadScoredCase{"LogWeightBoundZero",
                      [](LV*, CO* o, Scores*, Scores*) { o->fit.log_weight_bound = 0.0; },
                      "fit.log_weight_bound"},
        BadScoredCase{"BlockTokensZero",
                      [](LV*, CO* o, Scores*, Scores*) { o->fit.block_tokens = 0; },
                      "fit.block_tokens"},
        BadScoredCase{"QueryScaleNaN",
                      [](LV*, CO* o, Scores*, Scores*) { o->fit.query_scale = kNaN; },
                      "fit.query_scale"}),
    [](const ::testing::TestParamInfo<BadScoredCase>& info) { return info.param.name; });

// Budgets without scores: the SPEC's job per head needs one merged entry between its sink
// and recent entries, so a budget of exactly sink + recent cannot be met.
TEST(EngineValidationTest, UnscoredBudgetNeedsOneMergedEntry) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  CompressOptions options;
  options.sink_tokens = 2;
  options.recent_tokens = 4;
  options.head_budgets = {7, 6};
  ExpectError(Validate(layer.view(), options), kInvalid, "head_budgets", {"merged"});
  options.head_budgets = {7, 7};
  absl::StatusOr<CompressResult> result = ReferenceEngine().Compress(layer.view(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->offsets, (std::vector<int64_t>{0, 7, 14}));
  EXPECT_TRUE(result->target_reached);
  EXPECT_EQ(result->head_budgets, (std::vector<int32_t>{7, 7}));
}

// A finite fp8 code whose scale makes it overflow float32 names the scale, not the keys.
TEST(EngineValidationTest, Fp8OverflowNamesTheScale) {
  const RandomLayer layer = RandomLayer::Generate(BaseSpec());
  std::vector<uint8_t> keys(2 * 40 * 8, 0x38), values(2 * 40 * 12, 0x38);  // 1.0 in E4M3
  keys[0] = 0x7e;  // 448
  const float key_scales[] = {1e37f};
  const float value_scales[] = {1.0f};
  LayerView view = layer.view();
  view.dtype = DType::kFp8E4M3;
  view.keys = keys.data();
  view.values = values.data();
  view.key_scales = key_scales;
  view.value_scales = value_scales;
  const absl::Status status = Validate(view, CompressOptions{});
  ExpectError(status, kInvalid, "key_scales");
  ASSERT_TRUE(GetFieldLocation(status).has_value());
  EXPECT_EQ(GetFieldLocation(status)->field, "key_scales");
}

}  // namespace
}  // namespace centroidkv
