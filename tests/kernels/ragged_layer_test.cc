// Ragged and count-0-padded layers, exact_target, padding and token-major rows, run above
// the backends (kernels/ragged_layer.cc, kernels/result_shape.cc): every backend (reference,
// cpu, and the CUDA backend's stages on the host) gives the reference's bits, and the
// checks name the field, head and token.
#include "kernels/ragged_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "tests/kernels/engine_conformance.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv {
namespace {

using ::centroidkv::test::RandomLayer;
using ::centroidkv::test::RandomLayerSpec;

const ClusterEngine& Reference() {
  return **conformance::Engines().Select(BackendKind::kReference);
}

std::vector<const ClusterEngine*> Backends() {
  return {*conformance::Engines().Select(BackendKind::kCpu), &conformance::CudaStagesOnHost(),
          &Reference()};
}

// A result's rows as a ragged layer (heads concatenated).
struct Ragged {
  CompressResult rows;
  LayerView view() const {
    LayerView view;
    view.num_heads = rows.num_heads;
    for (int32_t h = 0; h < rows.num_heads; ++h) {
      view.num_tokens = std::max<int32_t>(
          view.num_tokens, static_cast<int32_t>(rows.offsets[h + 1] - rows.offsets[h]));
    }
    view.key_dim = rows.key_dim;
    view.value_dim = rows.value_dim;
    view.keys = rows.keys.data();
    view.values = rows.values.data();
    view.counts = rows.counts.data();
    view.head_offsets = rows.offsets.data();
    return view;
  }
};

CompressOptions Options() {
  CompressOptions options{.target_ratio = 0.4, .chunk_size = 16, .sink_tokens = 2,
      .recent_tokens = 8};
  return options;
}

RandomLayer Layer(uint64_t seed, TensorLayout layout = TensorLayout::kHeadMajor) {
  RandomLayerSpec spec = test::Spec(4, 120, 16, 8, seed, DType::kFloat32, layout);
  spec.prototypes = 6;
  spec.with_counts = true;
  return RandomLayer::Generate(spec);
}

TEST(RaggedLayerTest, EveryBackendGivesTheReferenceBitsOnRaggedInput) {
  for (bool uniform : {true, false}) {
    SCOPED_TRACE(uniform);
    CompressOptions first = Options();
    first.uniform_heads = uniform;
    first.passthrough_heads = {2};
    if (!uniform) first.min_similarity = 0.5;
    RandomLayer layer = Layer(1);
    auto round1 = Reference().Compress(layer.view(), first);
    ASSERT_TRUE(round1.ok()) << round1.status();
    const Ragged ragged{*round1};
    CompressOptions second = Options();
    second.target_ratio = 0.5;
    second.uniform_heads = uniform;
    second.passthrough_heads = {2};
    auto expected = Reference().Compress(ragged.view(), second);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(expected->target_length, 60);  // ceil(0.5 * 120): the longest head
    EXPECT_EQ(expected->offsets[3] - expected->offsets[2], 120);
    for (const ClusterEngine* engine : Backends()) {
      SCOPED_TRACE(engine->name());
      auto got = engine->Compress(ragged.view(), second);
      ASSERT_TRUE(got.ok()) << got.status();
      test::ExpectBitIdentical(*expected, *got);
      EXPECT_EQ(got->stop_reasons, expected->stop_reasons);
      // And into a reused result of another shape.
      CompressResult reused = *round1;
      ASSERT_TRUE(engine->CompressInto(ragged.view(), second, &reused).ok());
      test::ExpectBitIdentical(*expected, reused);
    }
  }
}

TEST(RaggedLayerTest, CountZeroPaddingIsIgnoredInBothLayouts) {
  for (TensorLayout layout : {TensorLayout::kHeadMajor, TensorLayout::kTokenMajor}) {
    RandomLayer padded = Layer(2, layout);
    CompressOptions options = Options();
    options.uniform_heads = false;
    options.compute_assignment = true;
    // Heads 1 and 3 end in padding (its values need not be what they were).
    for (int32_t t = 100; t < 120; ++t) padded.SetCount(1, t, 0);
    for (int32_t t = 60; t < 120; ++t) padded.SetCount(3, t, 0);
    for (const ClusterEngine* engine : Backends()) {
      SCOPED_TRACE(engine->name());
      auto got = engine->Compress(padded.view(), options);
      ASSERT_TRUE(got.ok()) << got.status();
      test::ExpectBitIdentical(*Reference().Compress(padded.view(), options), *got);
      EXPECT_EQ(got->head_tokens, (std::vector<int32_t>{120, 120, 120, 120}));
      for (int32_t t = 100; t < 120; ++t) EXPECT_EQ(got->assignment[1 * 120 + t], -1);
      for (int32_t t = 60; t < 120; ++t) EXPECT_EQ(got->assignment[3 * 120 + t], -1);
    }
    // Head 3 alone, without its padding, is what head 3 of the padded job is.
    std::vector<float> keys, values;
    std::vector<uint32_t> counts;
    for (int32_t t = 0; t < 60; ++t) {
      for (int32_t j = 0; j < 16; ++j) keys.push_back(padded.Key(3, t, j));
      for (int32_t j = 0; j < 8; ++j) values.push_back(padded.Value(3, t, j));
      counts.push_back(padded.Count(3, t));
    }
    LayerView alone{.num_heads = 1, .num_tokens = 60, .key_dim = 16, .value_dim = 8,
        .keys = keys.data(), .values = values.data(), .counts = counts.data()};
    CompressOptions same = options;
    same.target_ratio.reset();
    same.target_tokens = 48;  // ceil(0.4 * 120), the padded job's t
    auto head = Reference().Compress(alone, same);
    auto whole = Reference().Compress(padded.view(), options);
    ASSERT_TRUE(head.ok() && whole.ok());
    const int64_t begin = whole->offsets[3];
    ASSERT_EQ(whole->offsets[4] - begin, head->total_entries());
    for (int64_t i = 0; i < head->total_entries() * 16; ++i) {
      ASSERT_EQ(whole->keys[begin * 16 + i], head->keys[i]);
    }
  }
}

TEST(RaggedLayerTest, BadPaddingAndUnequalUniformHeadsNameTheField) {
  RandomLayer layer = Layer(3);
  layer.SetCount(1, 30, 0);  // a zero in the middle of head 1 is not padding
  absl::Status status = Reference().Compress(layer.view(), Options()).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  auto location = GetFieldLocation(status);
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "counts");
  EXPECT_EQ(location->head, 1);
  EXPECT_EQ(location->token, 30);

  RandomLayer empty_head = Layer(4);
  for (int32_t t = 0; t < 120; ++t) empty_head.SetCount(2, t, 0);
  status = Reference().Compress(empty_head.view(), Options()).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFieldLocation(status)->head, 2);

  RandomLayer uneven = Layer(5);
  for (int32_t t = 90; t < 120; ++t) uneven.SetCount(0, t, 0);
  status = Reference().Compress(uneven.view(), Options()).status();  // uniform_heads
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFieldLocation(status)->field, "uniform_heads");
  EXPECT_NE(status.message().find("uniform_heads to false"), absl::string_view::npos);
}

TEST(RaggedLayerTest, ExactTargetReachesTOnEveryBackendWithTheReferenceBits) {
  RandomLayer layer = Layer(6);
  CompressOptions options = Options();
  options.target_ratio.reset();
  options.target_tokens = 24;
  options.min_similarity = 0.995;  // stops at once without exact_target
  options.passthrough_heads = {0};
  options.exact_target = true;
  options.result_dtype = DType::kFloat16;
  auto expected = Reference().Compress(layer.view(), options);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(expected->target_reached);
  EXPECT_EQ(expected->dtype, DType::kFloat16);
  for (int32_t h = 1; h < 4; ++h) EXPECT_EQ(expected->offsets[h + 1] - expected->offsets[h], 24);
  for (const ClusterEngine* engine : Backends()) {
    SCOPED_TRACE(engine->name());
    auto got = engine->Compress(layer.view(), options);
    ASSERT_TRUE(got.ok()) << got.status();
    test::ExpectBitIdentical(*expected, *got);
  }
  // Protected entries can make t unreachable: reported, not hidden.
  options.sink_tokens = 20;
  options.recent_tokens = 20;
  auto protected_rows = Reference().Compress(layer.view(), options);
  ASSERT_TRUE(protected_rows.ok());
  EXPECT_FALSE(protected_rows->target_reached);
  EXPECT_EQ(protected_rows->stop_reasons[1], StopReason::kProtected);
}

// PassesReachTarget against what the passes do: over random shapes and options (floor off),
// it says true exactly where the reference's plain job ends with every compressed head at
// or below t.
TEST(RaggedLayerTest, PassesReachTargetIsWhatThePassesDo) {
  std::mt19937 rng(33);
  auto pick = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  int32_t reached_cases = 0, short_cases = 0;
  for (int32_t round = 0; round < 300; ++round) {
    const int32_t heads = pick(1, 3);
    const int32_t tokens = pick(2, 90);
    CompressOptions options;
    options.target_tokens = pick(1, tokens);
    options.chunk_size = pick(2, 40);
    options.sink_tokens = pick(0, 3) == 0 ? pick(0, 12) : 0;
    options.recent_tokens = pick(0, 3) == 0 ? pick(0, 20) : 0;
    options.max_passes = pick(1, 6);
    options.uniform_heads = pick(0, 1) == 1;
    if (heads > 1 && pick(0, 3) == 0) options.passthrough_heads = {pick(0, heads - 1)};
    options.compute_assignment = false;
    const RandomLayer layer =
        RandomLayer::Generate(test::Spec(heads, tokens, 8, 4, 1000 + round));
    SCOPED_TRACE(testing::Message() << "round " << round << ": " << layer.spec().ToString()
                                    << " t=" << *options.target_tokens << " C="
                                    << options.chunk_size << " S=" << options.sink_tokens
                                    << " W=" << options.recent_tokens << " P="
                                    << options.max_passes << " uniform=" << options.uniform_heads);
    auto plain = Reference().Compress(layer.view(), options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    LayerPlan plan;
    plan.options = options;
    plan.target_length = *options.target_tokens;
    plan.head_lengths.assign(heads, tokens);
    plan.passthrough.assign(heads, false);
    for (int32_t h : options.passthrough_heads) plan.passthrough[h] = true;
    const bool reached = HeadsWithinTarget(plan, *plain);
    EXPECT_EQ(PassesReachTarget(plan), reached);
    ++(reached ? reached_cases : short_cases);
  }
  EXPECT_GT(reached_cases, 30);  // both answers are exercised
  EXPECT_GT(short_cases, 30);
  // A floor makes the candidates depend on the data: never predicted.
  LayerPlan floored;
  floored.options.min_similarity = -1.0;
  floored.target_length = 10;
  floored.head_lengths = {100};
  floored.passthrough = {false};
  EXPECT_FALSE(PassesReachTarget(floored));
}

// An exact_target job whose passes reach t runs as the plain job: the same bits on every
// backend, in every result dtype; where they stop short (max_passes) or a floor stops them,
// the second stage still takes every head to t.
TEST(RaggedLayerTest, ExactTargetTheyReachIsThePlainJob) {
  const RandomLayer layer = RandomLayer::Generate(
      test::Spec(3, 256, 16, 12, 77, DType::kFloat16));
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    CompressOptions plain_options{.target_ratio = 0.25, .chunk_size = 64, .sink_tokens = 0,
        .recent_tokens = 0};
    plain_options.result_dtype = dtype;
    CompressOptions exact = plain_options;
    exact.exact_target = true;
    auto plain = Reference().Compress(layer.view(), plain_options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    for (int32_t h = 0; h < 3; ++h) ASSERT_EQ(plain->offsets[h + 1] - plain->offsets[h], 64);
    for (const ClusterEngine* engine : Backends()) {
      SCOPED_TRACE(std::string(engine->name()) + ", " + std::string(DTypeName(dtype)));
      auto got = engine->Compress(layer.view(), exact);
      ASSERT_TRUE(got.ok()) << got.status();
      test::ExpectBitIdentical(*plain, *got);
      EXPECT_EQ(got->stop_reasons, plain->stop_reasons);
      // Short of t after one pass (256 -> 128): the second stage does the rest.
      CompressOptions one_pass = exact;
      one_pass.max_passes = 1;
      auto expected = Reference().Compress(layer.view(), one_pass);
      ASSERT_TRUE(expected.ok()) << expected.status();
      auto short_of_t = engine->Compress(layer.view(), one_pass);
      ASSERT_TRUE(short_of_t.ok()) << short_of_t.status();
      test::ExpectBitIdentical(*expected, *short_of_t);
      for (int32_t h = 0; h < 3; ++h) {
        EXPECT_EQ(short_of_t->offsets[h + 1] - short_of_t->offsets[h], 64);
      }
    }
  }
}

// A backend whose first run stops short of t where PassesReachTarget said it would not (a
// backend that strays from the SPEC): the engine runs the job again through the second
// stage, and the result is the reference's.
class FirstRunFallsShort final : public ClusterEngine {
 public:
  std::string_view name() const override { return "first-run-falls-short"; }
  int32_t runs() const { return runs_; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override {
    CompressOptions options = plan.options;
    options.exact_target = false;  // the plan's job only, as a backend runs it
    if (runs_++ == 0) options.max_passes = 1;
    return Reference().CompressInto(layer, options, out, control);
  }

 private:
  mutable int32_t runs_ = 0;
};

TEST(RaggedLayerTest, ExactTargetRunsTheSecondStageWhenTheBackendFallsShort) {
  const RandomLayer layer = RandomLayer::Generate(test::Spec(2, 256, 16, 12, 78));
  CompressOptions exact{.target_ratio = 0.25, .chunk_size = 64, .sink_tokens = 0,
      .recent_tokens = 0};
  exact.exact_target = true;
  exact.result_dtype = DType::kFloat16;
  auto expected = Reference().Compress(layer.view(), exact);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const FirstRunFallsShort engine;
  auto got = engine.Compress(layer.view(), exact);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(engine.runs(), 2);  // the short run, then the staged one
  test::ExpectBitIdentical(*expected, *got);
  for (int32_t h = 0; h < 2; ++h) EXPECT_EQ(got->offsets[h + 1] - got->offsets[h], 64);
}

TEST(RaggedLayerTest, PaddingAndTokenMajorRowsOnEveryBackend) {
  RandomLayer layer = Layer(7);
  CompressOptions options = Options();
  options.uniform_heads = false;
  options.min_similarity = 0.6;
  options.output_layout = TensorLayout::kTokenMajor;
  options.pad_to = 130;
  auto expected = Reference().Compress(layer.view(), options);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(expected->padded_length, 130);
  EXPECT_EQ(expected->layout, TensorLayout::kTokenMajor);
  EXPECT_EQ(expected->counts.size(), 4u * 130u);
  for (const ClusterEngine* engine : Backends()) {
    SCOPED_TRACE(engine->name());
    auto got = engine->Compress(layer.view(), options);
    ASSERT_TRUE(got.ok()) << got.status();
    test::ExpectBitIdentical(*expected, *got);
  }
  options.pad_to = 20;  // shorter than every head (t = 48)
  const absl::Status status = Reference().Compress(layer.view(), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetFieldLocation(status)->field, "pad_to");
}

}  // namespace
}  // namespace centroidkv
