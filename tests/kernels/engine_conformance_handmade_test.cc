// Hand-made conformance cases (SPEC.md section 2): small layers whose exact result follows
// from the SPEC by hand (ties, top-r order across chunks, counts, passes, the similarity
// floor, uniform heads), with the helpers that build them and their expected results. These
// TEST_Ps belong to EngineConformanceTest (engine_conformance.h); they run for every backend
// through the INSTANTIATE lines in engine_conformance_test.cc.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "gtest/gtest.h"
#include "tests/kernels/engine_conformance.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::conformance {
namespace {

using test::RandomLayer;

// A layer of the given shape whose rows the test sets one by one.
RandomLayer HandLayer(int32_t heads, int32_t tokens, int32_t key_dim, int32_t value_dim) {
  return RandomLayer::Generate(Spec(heads, tokens, key_dim, value_dim, 0));
}

void SetRow(RandomLayer* layer, int32_t h, int32_t t, const std::vector<float>& key,
            const std::vector<float>& value, uint32_t count = 1) {
  for (size_t j = 0; j < key.size(); ++j) layer->SetKey(h, t, static_cast<int32_t>(j), key[j]);
  for (size_t j = 0; j < value.size(); ++j) {
    layer->SetValue(h, t, static_cast<int32_t>(j), value[j]);
  }
  if (count != 1 || layer->view().counts != nullptr) layer->SetCount(h, t, count);
}

// Expected result of a one-head-at-a-time hand computation.
struct HandHead {
  std::vector<std::vector<float>> keys, values;
  std::vector<uint32_t> counts;
  std::vector<int32_t> assignment;
};

CompressResult HandResult(const LayerView& layer, const std::vector<HandHead>& heads) {
  CompressResult out;
  out.num_heads = layer.num_heads;
  out.num_tokens = layer.num_tokens;
  out.key_dim = layer.key_dim;
  out.value_dim = layer.value_dim;
  out.offsets = {0};
  for (const HandHead& head : heads) {
    out.offsets.push_back(out.offsets.back() + static_cast<int64_t>(head.counts.size()));
    for (const auto& key : head.keys) out.keys.insert(out.keys.end(), key.begin(), key.end());
    for (const auto& value : head.values) {
      out.values.insert(out.values.end(), value.begin(), value.end());
    }
    out.counts.insert(out.counts.end(), head.counts.begin(), head.counts.end());
    out.assignment.insert(out.assignment.end(), head.assignment.begin(), head.assignment.end());
  }
  return out;
}

// Chunk {0..4}: sources 0, 2, 4 and destinations 1, 3 with identical keys: every source's
// scores tie, so every source goes to the lowest destination, 1.
TEST_P(EngineConformanceTest, TiesGoToTheLowestDestination) {
  RandomLayer layer = HandLayer(1, 5, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {0});
  SetRow(&layer, 0, 1, {1, 1}, {1});
  SetRow(&layer, 0, 2, {0, 1}, {2});
  SetRow(&layer, 0, 3, {1, 1}, {3});
  SetRow(&layer, 0, 4, {2, 1}, {4});
  const CompressOptions options = Opts().Chunk(5).Protect(0, 0).Tokens(2).Passes(1);
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &result));
  const HandHead head{{{1.0f, 0.75f}, {1, 1}}, {{1.75f}, {3}}, {4, 1}, {0, 0, 0, 1, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

// All-zero keys: every score is 0 (norms clamp at 1e-6), so the ties go to the lowest
// destination and, in the top-r order, to the lowest source.
TEST_P(EngineConformanceTest, ZeroKeysTieEverywhere) {
  RandomLayer layer = HandLayer(1, 8, 3, 1);
  for (int32_t t = 0; t < 8; ++t) SetRow(&layer, 0, t, {0, 0, 0}, {static_cast<float>(t)});
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(8).Protect(0, 0).Tokens(5).Passes(1), &result));
  // r = 3 of the 4 sources 0, 2, 4, 6 (all to 1): 0, 2 and 4 merge.
  const HandHead head{{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}},
                      {{7.0f / 4}, {3}, {5}, {6}, {7}},
                      {4, 1, 1, 1, 1},
                      {0, 0, 0, 1, 0, 2, 3, 4}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

// Three chunks of 2 with edge scores 0.6, 0.2 and 0.9: the best edges are kept across chunks.
RandomLayer ThreeChunkLayer() {
  RandomLayer layer = HandLayer(1, 6, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {10});
  SetRow(&layer, 0, 1, {0.6f, 0.8f}, {20});
  SetRow(&layer, 0, 2, {1, 0}, {30});
  SetRow(&layer, 0, 3, {0.2f, 0.9798f}, {40});
  SetRow(&layer, 0, 4, {1, 0}, {50});
  SetRow(&layer, 0, 5, {0.9f, 0.4359f}, {60});
  return layer;
}

TEST_P(EngineConformanceTest, KeepsTheBestEdgesAcrossChunks) {
  const RandomLayer layer = ThreeChunkLayer();
  const Opts base = Opts().Chunk(2).Protect(0, 0).Passes(1);
  CompressResult one, two;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Tokens(5), &one));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Tokens(4), &two));
  const HandHead keep_one{{{1, 0}, {0.6f, 0.8f}, {1, 0}, {0.2f, 0.9798f}, {0.95f, 0.21795f}},
                          {{10}, {20}, {30}, {40}, {55}},
                          {1, 1, 1, 1, 2},
                          {0, 1, 2, 3, 4, 4}};
  const HandHead keep_two{{{0.8f, 0.4f}, {1, 0}, {0.2f, 0.9798f}, {0.95f, 0.21795f}},
                          {{15}, {30}, {40}, {55}},
                          {2, 1, 1, 2},
                          {0, 0, 1, 2, 3, 3}};
  test::ExpectResultsNear(HandResult(layer.view(), {keep_one}), one, kHandRelTolerance);
  test::ExpectResultsNear(HandResult(layer.view(), {keep_two}), two, kHandRelTolerance);
}

// Equal scores in every chunk: the top-r order falls back to the source position.
TEST_P(EngineConformanceTest, EqualScoresKeepTheEarliestSources) {
  RandomLayer layer = HandLayer(1, 6, 2, 1);
  for (int32_t t = 0; t < 6; t += 2) {
    SetRow(&layer, 0, t, {1, 0}, {static_cast<float>(t)});
    SetRow(&layer, 0, t + 1, {0.6f, 0.8f}, {static_cast<float>(t + 1)});
  }
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(2).Protect(0, 0).Passes(1).Tokens(4), &result));
  const HandHead head{{{0.8f, 0.4f}, {0.8f, 0.4f}, {1, 0}, {0.6f, 0.8f}},
                      {{0.5f}, {2.5f}, {4}, {5}},
                      {2, 2, 1, 1},
                      {0, 0, 1, 1, 2, 3}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

TEST_P(EngineConformanceTest, CountsWeightTheMean) {
  RandomLayer layer = HandLayer(1, 2, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {4}, 3);
  SetRow(&layer, 0, 1, {2, 0}, {8}, 1);
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts().Chunk(2).Protect(0, 0).Tokens(1), &result));
  const HandHead head{{{1.25f, 0}}, {{5}}, {4}, {0, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
  EXPECT_EQ(result.passes_run, 1);
}

// Chunks {0, 1}, {2}: a chunk of one source has no edge. Pass 0 merges 0 into 1; pass 1 sees
// the chunk {01, 2} and merges the centroid into 2: the mean of all three.
TEST_P(EngineConformanceTest, LoneSourceWaitsForTheNextPass) {
  RandomLayer layer = HandLayer(1, 3, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {3});
  SetRow(&layer, 0, 1, {1, 1}, {6});
  SetRow(&layer, 0, 2, {1, 2}, {9});
  const Opts base = Opts().Chunk(2).Protect(0, 0).Tokens(1);
  CompressResult one_pass, two_passes;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Passes(1), &one_pass));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), base, &two_passes));
  const HandHead after_one{{{1, 0.5f}, {1, 2}}, {{4.5f}, {9}}, {2, 1}, {0, 0, 1}};
  const HandHead after_two{{{1, 1}}, {{6}}, {3}, {0, 0, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {after_one}), one_pass, kHandRelTolerance);
  test::ExpectResultsNear(HandResult(layer.view(), {after_two}), two_passes, kHandRelTolerance);
  EXPECT_EQ(one_pass.passes_run, 1);
  EXPECT_EQ(two_passes.passes_run, 2);
}

// Parallel keys score exactly 1 (x.y = |x||y| in any float arithmetic for these values),
// and a floor of 1 admits them: candidates are edges with score >= the floor.
TEST_P(EngineConformanceTest, FloorIsInclusive) {
  RandomLayer layer = HandLayer(1, 4, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {1});
  SetRow(&layer, 0, 1, {2, 0}, {2});
  SetRow(&layer, 0, 2, {0, 1}, {3});
  SetRow(&layer, 0, 3, {0, 3}, {4});
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(4).Protect(0, 0).Tokens(1).Passes(1).Floor(1.0), &result));
  const HandHead head{{{1.5f, 0}, {0, 2}}, {{1.5f}, {3.5f}}, {2, 2}, {0, 0, 1, 1}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
  EXPECT_EQ(result.passes_run, 1);
}

// Head 0 has the three-chunk scores (0.6, 0.2, 0.9), head 1 three perfect pairs. With a floor
// of 0.5, head 0 has 2 candidates and head 1 has 3.
RandomLayer TwoHeadLayer() {
  RandomLayer layer = HandLayer(2, 6, 2, 1);
  const RandomLayer first = ThreeChunkLayer();
  for (int32_t t = 0; t < 6; ++t) {
    SetRow(&layer, 0, t, {first.Key(0, t, 0), first.Key(0, t, 1)}, {first.Value(0, t, 0)});
    SetRow(&layer, 1, t, {1, 1}, {static_cast<float>(t)});
  }
  return layer;
}

TEST_P(EngineConformanceTest, UniformHeadsTakeTheSmallestMergeCount) {
  const RandomLayer layer = TwoHeadLayer();
  const Opts base = Opts().Chunk(2).Protect(0, 0).Passes(1).Tokens(2).Floor(0.5);
  CompressResult uniform, ragged, passthrough, blocked;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(true), &uniform));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(false), &ragged));
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts(base).Uniform(true).Passthrough({0}), &passthrough));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(true).Floor(0.95), &blocked));
  EXPECT_EQ(uniform.offsets, (std::vector<int64_t>{0, 4, 8}));      // min(2, 3) = 2 each
  EXPECT_EQ(ragged.offsets, (std::vector<int64_t>{0, 4, 7}));       // 2 and 3
  EXPECT_EQ(passthrough.offsets, (std::vector<int64_t>{0, 6, 9}));  // head 0 does not count
  EXPECT_EQ(blocked.offsets, (std::vector<int64_t>{0, 6, 12}));     // head 0 has none: nobody
  EXPECT_EQ(blocked.passes_run, 0);
  const std::vector<int32_t> head0_two = {0, 0, 1, 2, 3, 3};
  const std::vector<int32_t> head1_two = {0, 0, 1, 1, 2, 3};  // equal scores: earliest first
  const std::vector<int32_t> head1_three = {0, 0, 1, 1, 2, 2};
  auto concat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(uniform.assignment, concat(head0_two, head1_two));
  EXPECT_EQ(ragged.assignment, concat(head0_two, head1_three));
  EXPECT_EQ(passthrough.assignment, concat({0, 1, 2, 3, 4, 5}, head1_three));
  ExpectInvariants(layer.view(), Opts(base).Uniform(true), uniform);
  ExpectInvariants(layer.view(), Opts(base).Uniform(false), ragged);
}

// The floor of pass p is tau + p * delta: with tau 0.55 and delta 0.4, pass 0 takes the 0.6
// and 0.9 edges of the three-chunk layer, and pass 1 (floor 0.95; its best edge scores 0.89)
// nothing more.
TEST_P(EngineConformanceTest, FloorRisesEachPass) {
  const RandomLayer layer = ThreeChunkLayer();
  CompressResult tight, loose;
  const Opts base = Opts().Chunk(2).Protect(0, 0).Tokens(1);
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Floor(0.55, 0.4), &tight));
  EXPECT_EQ(tight.offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(tight.assignment, (std::vector<int32_t>{0, 0, 1, 2, 3, 3}));
  EXPECT_EQ(tight.passes_run, 1);
  // Without the rise, pass 1 continues (its chunks are {01, 2} and {3, 45}).
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Floor(-1.0), &loose));
  EXPECT_LT(loose.total_entries(), 4);
  EXPECT_GE(loose.passes_run, 2);
  ExpectInvariants(layer.view(), Opts(base).Floor(-1.0), loose);
}

}  // namespace
}  // namespace centroidkv::conformance
