// Tests of worker/transformer.cc: the reference values of ../shared/models/README.md
// (logits, post-RoPE keys, values, the 64-step greedy story) and the count-aware attention
// of SPEC section 2 (a centroid of c identical keys weighs as the c keys do).
#include "worker/transformer.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "worker/sampler.h"
#include "worker/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

constexpr float kTolerance = 1e-3f;

// Token ids of the top `k` logits, highest first.
std::vector<int32_t> TopK(const std::vector<float>& logits, int k) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

class TransformerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(testutil::Stories260K(), nullptr); }
  Transformer transformer_{*testutil::Stories260K()};
};

TEST_F(TransformerTest, OnceUponATimeLogitsMatchTheReference) {
  KvCache cache = transformer_.NewCache();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  ASSERT_TRUE(transformer_.Prefill(prompt, &cache).ok());
  const std::vector<float>& logits = transformer_.logits();
  EXPECT_NEAR(logits[432], 17.7994f, kTolerance);
  EXPECT_NEAR(logits[383], 14.2813f, kTolerance);
  EXPECT_NEAR(logits[322], 9.7097f, kTolerance);
  EXPECT_EQ(TopK(logits, 3), (std::vector<int32_t>{432, 383, 322}));
  EXPECT_EQ(cache.position(), 5);
}

TEST_F(TransformerTest, CachedKeysAreAfterRopeAndValuesMatchTheReference) {
  KvCache cache = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(std::vector<int32_t>{1, 403, 407, 261, 378}, &cache).ok());
  const float keys[4] = {1.125199f, -0.321229f, 3.241047f, -1.933559f};
  const float values[4] = {0.036428f, -0.051094f, 0.332612f, 0.342953f};
  const HeadCache& layer0 = cache.head(0, 0);
  const HeadCache& layer4 = cache.head(4, 0);
  ASSERT_EQ(layer0.size(), 5);
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(layer0.keys[4 * 8 + j], keys[j], kTolerance) << j;
    EXPECT_NEAR(layer4.values[4 * 8 + j], values[j], kTolerance) << j;
  }
  EXPECT_EQ(layer0.counts, std::vector<uint32_t>(5, 1u));
}

TEST_F(TransformerTest, BosAloneTopLogitsMatchTheReference) {
  KvCache cache = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Forward(kBosToken, &cache).ok());
  const std::vector<float>& logits = transformer_.logits();
  EXPECT_EQ(TopK(logits, 3), (std::vector<int32_t>{403, 385, 410}));
  EXPECT_NEAR(logits[403], 17.0235f, kTolerance);
  EXPECT_NEAR(logits[385], 15.4062f, kTolerance);
  EXPECT_NEAR(logits[410], 13.1083f, kTolerance);
}

TEST_F(TransformerTest, GreedyStoryMatchesTheReferenceTokenIds) {
  const std::vector<int32_t> expected = {
      1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
      401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328,
      432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335,
      312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};
  absl::StatusOr<std::vector<int32_t>> story =
      GenerateGreedy(transformer_, std::vector<int32_t>{1, 403, 407, 261, 378}, 64);
  ASSERT_TRUE(story.ok()) << story.status();
  EXPECT_EQ(*story, expected);
  const std::string text = testutil::Tok512()->Decode(*story);
  EXPECT_EQ(text.rfind("Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park.",
                       0),
            0u)
      << text;
  // From BOS alone, greedy decoding tells the same story.
  absl::StatusOr<std::vector<int32_t>> from_bos =
      GenerateGreedy(transformer_, std::vector<int32_t>{1}, 20);
  ASSERT_TRUE(from_bos.ok());
  EXPECT_TRUE(std::equal(from_bos->begin(), from_bos->end(), expected.begin()));
}

// Two identical entries of count 1 and one entry of count 2 give the same attention.
TEST_F(TransformerTest, CountWeighsAnEntryLikeThatManyIdenticalKeys) {
  KvCache duplicated = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(std::vector<int32_t>{1, 403, 407, 261}, &duplicated).ok());
  KvCache merged = duplicated;
  const int32_t hs = duplicated.head_size();
  for (int32_t layer = 0; layer < duplicated.num_layers(); ++layer) {
    for (int32_t h = 0; h < duplicated.num_kv_heads(); ++h) {
      // duplicated: entry 2 twice; merged: entry 2 once with count 2.
      HeadCache& d = duplicated.head(layer, h);
      d.keys.insert(d.keys.end(), d.keys.begin() + 2 * hs, d.keys.begin() + 3 * hs);
      d.values.insert(d.values.end(), d.values.begin() + 2 * hs, d.values.begin() + 3 * hs);
      d.counts.push_back(1);
      merged.head(layer, h).counts[2] = 2;
    }
  }
  ASSERT_TRUE(transformer_.Forward(378, &duplicated).ok());
  const std::vector<float> expected = transformer_.logits();
  ASSERT_TRUE(transformer_.Forward(378, &merged).ok());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(transformer_.logits()[i], expected[i], 1e-4f) << i;
  }
}

// Count-0 rows (the padding of an equal-length result) are masked: with padding rows of
// arbitrary content between the prefill and the decoded tokens, every later step's logits
// are bit-identical to the unpadded cache's.
TEST_F(TransformerTest, PaddingRowsAreMaskedBitForBit) {
  KvCache plain = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(std::vector<int32_t>{1, 403, 407, 261}, &plain).ok());
  KvCache padded = plain;
  const int32_t hs = padded.head_size();
  for (int32_t layer = 0; layer < padded.num_layers(); ++layer) {
    for (int32_t h = 0; h < padded.num_kv_heads(); ++h) {
      HeadCache& head = padded.head(layer, h);
      for (int32_t row = 0; row < 3 + h; ++row) {  // heads padded by different amounts
        // Not even finite: a mask that only pushed the logit to -inf would turn NaN.
        head.keys.insert(head.keys.end(), static_cast<size_t>(hs),
                         row == 0 ? std::numeric_limits<float>::quiet_NaN() : 50.0f * row);
        head.values.insert(head.values.end(), static_cast<size_t>(hs),
                           std::numeric_limits<float>::infinity());
        head.counts.push_back(0);
      }
    }
  }
  for (int32_t token : {378, 290, 301}) {
    ASSERT_TRUE(transformer_.Forward(token, &plain).ok());
    const std::vector<float> expected = transformer_.logits();
    ASSERT_TRUE(transformer_.Forward(token, &padded).ok());
    EXPECT_EQ(transformer_.logits(), expected) << "token " << token;
  }
  EXPECT_EQ(padded.TotalEntries(), plain.TotalEntries());
}

// Decoding continues at the true position after the cache shrinks: token 378 fed after
// the cache was cut to its first entry still gets RoPE position 4, so its layer-0 key (which
// depends only on the token and the position) is the reference key of position 4.
TEST_F(TransformerTest, PositionIsTheTrueLengthNotTheEntryCount) {
  KvCache cache = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(std::vector<int32_t>{1, 403, 407, 261}, &cache).ok());
  for (int32_t layer = 0; layer < cache.num_layers(); ++layer) {
    for (int32_t h = 0; h < cache.num_kv_heads(); ++h) {
      HeadCache& head = cache.head(layer, h);
      head.keys.resize(8);
      head.values.resize(8);
      head.counts.resize(1);
    }
  }
  EXPECT_EQ(cache.position(), 4);
  EXPECT_EQ(cache.TotalEntries(), 5 * 4);
  ASSERT_TRUE(transformer_.Forward(378, &cache).ok());
  EXPECT_EQ(cache.position(), 5);
  const HeadCache& layer0 = cache.head(0, 0);
  ASSERT_EQ(layer0.size(), 2);
  EXPECT_EQ(layer0.counts.back(), 1u);
  const float reference[4] = {1.125199f, -0.321229f, 3.241047f, -1.933559f};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(layer0.keys[8 + j], reference[j], kTolerance) << j;
}

TEST_F(TransformerTest, BadInputsAreRejected) {
  KvCache cache = transformer_.NewCache();
  EXPECT_EQ(transformer_.Forward(512, &cache).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transformer_.Forward(-1, &cache).code(), absl::StatusCode::kInvalidArgument);
  KvCache other(5, 4, 16);
  EXPECT_EQ(transformer_.Forward(1, &other).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 512; ++i) cache.AdvancePosition();
  EXPECT_EQ(transformer_.Forward(1, &cache).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace centroidkv::worker
