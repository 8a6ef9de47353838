// Tests of worker/sampler.cc: a reproducible RNG, argmax, suppression, and texts
// sampled from the model that are reproducible per seed and never contain BOS/EOS.
#include "worker/sampler.h"

#include <algorithm>
#include <vector>

#include "worker/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

TEST(SamplerTest, RngIsTheSameStreamEverywhere) {
  Rng rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFull);  // SplitMix64's published first output
  Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.Uniform(), b.Uniform());
  const double u = Rng(7).Uniform();
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

TEST(SamplerTest, ArgmaxAndSuppression) {
  const std::vector<float> logits = {0.0f, 5.0f, 5.0f, 1.0f};
  EXPECT_EQ(Argmax(logits), 1);
  Rng rng(1);
  const int32_t suppressed[] = {1, 2};
  EXPECT_EQ(SampleToken(logits, 0.0f, suppressed, &rng), 3);
  for (int i = 0; i < 50; ++i) {
    const int32_t token = SampleToken(logits, 1.0f, suppressed, &rng);
    EXPECT_TRUE(token == 0 || token == 3) << token;
  }
}

TEST(SamplerTest, SampledTextsAreReproducibleAndFreeOfBosAndEos) {
  ASSERT_NE(testutil::Stories260K(), nullptr);
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> a = SampleText(transformer, 120, 0.8f, 5);
  absl::StatusOr<std::vector<int32_t>> b = SampleText(transformer, 120, 0.8f, 5);
  absl::StatusOr<std::vector<int32_t>> c = SampleText(transformer, 120, 0.8f, 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  ASSERT_EQ(a->size(), 120u);
  EXPECT_EQ(a->front(), kBosToken);
  EXPECT_EQ(std::count(a->begin() + 1, a->end(), kBosToken), 0);
  EXPECT_EQ(std::count(a->begin(), a->end(), kEosToken), 0);
}

}  // namespace
}  // namespace centroidkv::worker
