// Tests of worker/evaluation.cc: KL and top-1 on known distributions, and the
// prefill / compress / teacher-force protocol with in-process compressors.
#include "worker/evaluation.h"

#include <cmath>
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
  absl::StatusOr<PrefilledText> text = PrefillText(transformer, *tokens, 128, true);
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
  EXPECT_EQ(PrefillText(transformer, *tokens, 160, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace centroidkv::worker
