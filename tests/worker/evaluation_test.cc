// Tests of worker/evaluation.cc: KL and top-1 on known distributions, and the
// prefill / compress / teacher-force protocol with in-process compressors; the tracked
// prefill's observation-window cache (SnapKV).
#include "worker/evaluation.h"

#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "worker/eviction.h"
#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

TEST(EvaluationTest, KlOfKnownDistributions) {
  const std::vector<float> p = {0.0f, 0.0f};            // (1/2, 1/2)
  const std::vector<float> q = {std::log(3.0f), 0.0f};  // (3/4, 1/4)
  EXPECT_NEAR(KlDivergence(p, q), 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25), 1e-6);
  EXPECT_EQ(KlDivergence(p, p), 0.0);
  const Agreement same = CompareStep(q, q);
  EXPECT_EQ(same.top1_matches, 1);
  EXPECT_EQ(same.exact_matches, 1);
  const std::vector<float> r = {0.0f, 1.0f};
  const Agreement differ = CompareStep(q, r);
  EXPECT_EQ(differ.top1_matches, 0);
  EXPECT_EQ(differ.exact_matches, 0);
  Agreement total = same;
  total.Add(differ);
  EXPECT_EQ(total.steps, 2);
  EXPECT_DOUBLE_EQ(total.top1(), 0.5);
}

TEST(EvaluationTest, NoCompressionAgreesExactlyAndEvictionDoesNot) {
  ASSERT_NE(testutil::Stories260K(), nullptr);
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 160, 0.8f, 11);
  ASSERT_TRUE(tokens.ok());
  absl::StatusOr<PrefilledText> text = PrefillText(transformer, *tokens, 128, {.whole = true});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->cache.position(), 128);
  EXPECT_EQ(text->continuation.size(), 32u);
  EXPECT_EQ(text->reference.size(), 32u);
  absl::StatusOr<Agreement> none =
      EvaluateCompressed(transformer, *text, [](KvCache*) { return absl::OkStatus(); });
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->exact_matches, 32);
  EXPECT_EQ(none->mean_kl(), 0.0);
  int64_t entries = 0;
  absl::StatusOr<Agreement> evicted = EvaluateCompressed(
      transformer, *text,
      [](KvCache* cache) {
        EvictStreamingLlm(cache, 0.1, 1);
        return absl::OkStatus();
      },
      &entries);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(entries, 13 * 20);
  EXPECT_GT(evicted->mean_kl(), 0.0);
  EXPECT_EQ(PrefillText(transformer, *tokens, 160, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EvaluationTest, TheWindowCacheHoldsOnlyTheLastQueriesAttention) {
  ASSERT_NE(testutil::Stories260K(), nullptr);
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 100, 0.8f, 12);
  ASSERT_TRUE(tokens.ok());
  const std::span<const int32_t> prefill = std::span<const int32_t>(*tokens).first(96);
  KvCache whole = transformer.NewCache();
  std::optional<KvCache> window;
  ASSERT_TRUE(PrefillTracked(transformer, prefill, {.whole = true, .observation_window = 8},
                             &whole, &window)
                  .ok());
  ASSERT_TRUE(window.has_value());
  KvCache plain = transformer.NewCache();
  ASSERT_TRUE(transformer.Prefill(prefill, &plain).ok());
  for (int32_t layer = 0; layer < plain.num_layers(); ++layer) {
    for (int32_t h = 0; h < plain.num_kv_heads(); ++h) {
      // Both caches hold exactly the entries of a plain prefill.
      EXPECT_EQ(window->head(layer, h).keys, plain.head(layer, h).keys);
      EXPECT_EQ(whole.head(layer, h).keys, plain.head(layer, h).keys);
      // 8 queries x 2 query heads per KV head: the window statistic sums to 16 (each
      // query's probabilities sum to 1), the whole prefill's to 96 x 2.
      double window_sum = 0.0, whole_sum = 0.0;
      for (double a : window->head(layer, h).attention) window_sum += a;
      for (double a : whole.head(layer, h).attention) whole_sum += a;
      EXPECT_NEAR(window_sum, 16.0, 1e-4);
      EXPECT_NEAR(whole_sum, 192.0, 1e-3);
      // Entries after the window's start get attention only from the window.
      EXPECT_GT(window->head(layer, h).attention[90], 0.0);
    }
  }
  KvCache none = transformer.NewCache();
  ASSERT_TRUE(PrefillTracked(transformer, prefill, {}, &none, &window).ok());
  EXPECT_FALSE(window.has_value());
  EXPECT_FALSE(none.tracks_attention());
}

}  // namespace
}  // namespace centroidkv::worker
