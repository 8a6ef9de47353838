// Tests of worker/eviction.cc: budgets as the engine computes them, and which
// entries StreamingLLM, the H2O-style baseline and SnapKV keep (by ratio, and online to a
// fixed budget of entries); SnapKV's observation-window statistic from a real prefill;
// what merging the dropped entries does to the kept ones, and MergeEntries itself.
#include "worker/eviction.h"

#include <vector>

#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

// One layer, one head of size 1; entry t has key t and attention attention[t].
KvCache LineCache(const std::vector<double>& attention) {
  KvCache cache(1, 1, 1);
  cache.TrackAttention(true);
  for (size_t t = 0; t < attention.size(); ++t) {
    const float x = static_cast<float>(t);
    cache.Append(0, &x, &x);
    cache.AdvancePosition();
  }
  cache.head(0, 0).attention = attention;
  return cache;
}

std::vector<float> Keys(const KvCache& cache) { return cache.head(0, 0).keys; }

TEST(EvictionTest, BudgetIsTheCeilingOfRatioTimesLength) {
  EXPECT_EQ(BudgetEntries(384, 0.25), 96);
  EXPECT_EQ(BudgetEntries(384, 0.5), 192);
  EXPECT_EQ(BudgetEntries(10, 0.25), 3);
  EXPECT_EQ(BudgetEntries(40, 0.3), 12);
  EXPECT_EQ(BudgetEntries(5, 0.0), 1);
  EXPECT_EQ(BudgetEntries(5, 1.0), 5);
  const BudgetSplit split = SplitBudget(5, 4, 3);
  EXPECT_EQ(split.sinks, 4);
  EXPECT_EQ(split.recent, 1);
  EXPECT_EQ(split.middle, 0);
}

TEST(EvictionTest, StreamingKeepsSinksAndTheMostRecent) {
  KvCache cache = LineCache(std::vector<double>(10, 0.0));
  EvictStreamingLlm(&cache, 0.5, 2);
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 1, 7, 8, 9}));
  EXPECT_EQ(cache.position(), 10);
}

TEST(EvictionTest, HeavyHittersKeepTheMostAttendedBetweenSinksAndRecent) {
  KvCache cache = LineCache({9, 0, 5, 0.5, 7, 1, 0, 3, 0, 0});
  ASSERT_TRUE(EvictHeavyHitters(&cache, 0.5, 1, 2).ok());
  // Budget 5: sink 0, recent 8 and 9, and the two most attended of 1..7: 4 (7) and 2 (5).
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 2, 4, 8, 9}));
  EXPECT_EQ(cache.head(0, 0).attention, (std::vector<double>{9, 5, 7, 0, 0}));
}

TEST(EvictionTest, HeavyHittersNeedTrackedAttention) {
  KvCache cache = LineCache(std::vector<double>(4, 0.0));
  cache.TrackAttention(false);
  EXPECT_EQ(EvictHeavyHitters(&cache, 0.5, 1, 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EvictionTest, MergedEvictionFoldsEachDroppedEntryIntoItsMostSimilarKeptOne) {
  // Head size 2, values equal to keys; H2O at 0.5 with 1 sink and 1 recent keeps 2 and 3
  // (the most attended of 1..6), and the rest of 1..6 joins the kept entry whose key is
  // closest in angle: 4 -> 2; 1, 5 and 6 -> 3 (6 is orthogonal to 3, opposite to 2).
  const std::vector<std::vector<float>> keys = {{1, 0}, {1, 0.5f}, {0, 1},  {1, 0},
                                                {0.5f, 1}, {2, 0}, {0, -1}, {5, 5}};
  const std::vector<double> attention = {0, 0, 5, 4, 0, 0, 0, 0};
  auto cache_of = [&] {
    KvCache cache(1, 1, 2);
    cache.TrackAttention(true);
    for (const std::vector<float>& key : keys) {
      cache.Append(0, key.data(), key.data());
      cache.AdvancePosition();
    }
    cache.head(0, 0).attention = attention;
    return cache;
  };
  KvCache merged = cache_of();
  ASSERT_TRUE(EvictHeavyHitters(&merged, 0.5, 1, 1, EvictedEntries{.merged = true}).ok());
  const HeadCache& head = merged.head(0, 0);
  const std::vector<float> expected = {1, 0, 0.25f, 1, 1, -0.125f, 5, 5};
  EXPECT_EQ(head.keys, expected);
  EXPECT_EQ(head.values, expected);
  EXPECT_EQ(head.counts, (std::vector<uint32_t>{1, 2, 4, 1}));  // all 8 tokens still there
  EXPECT_EQ(head.attention, (std::vector<double>{0, 5, 4, 0}));
  EXPECT_EQ(merged.position(), 8);

  // Dropping keeps the same entries unchanged.
  KvCache dropped = cache_of();
  ASSERT_TRUE(EvictHeavyHitters(&dropped, 0.5, 1, 1).ok());
  EXPECT_EQ(dropped.head(0, 0).keys, (std::vector<float>{1, 0, 0, 1, 1, 0, 5, 5}));
  EXPECT_EQ(dropped.head(0, 0).counts, (std::vector<uint32_t>{1, 1, 1, 1}));

  // With a similarity floor of 0.5, 6 (cosine 0 with 3) is dropped instead; 1, 4 and 5 are
  // still merged.
  KvCache floored = cache_of();
  ASSERT_TRUE(EvictHeavyHitters(&floored, 0.5, 1, 1,
                                EvictedEntries{.merged = true, .min_similarity = 0.5})
                  .ok());
  EXPECT_EQ(floored.head(0, 0).keys,
            (std::vector<float>{1, 0, 0.25f, 1, static_cast<float>(4.0 / 3.0),
                                static_cast<float>(0.5 / 3.0), 5, 5}));
  EXPECT_EQ(floored.head(0, 0).counts, (std::vector<uint32_t>{1, 2, 3, 1}));

  // StreamingLLM keeps nothing between its windows, so merging drops as it would.
  KvCache streaming = cache_of();
  EvictStreamingLlm(&streaming, 0.5, 1, EvictedEntries{.merged = true});
  EXPECT_EQ(streaming.head(0, 0).keys, (std::vector<float>{1, 0, 2, 0, 0, -1, 5, 5}));
  EXPECT_EQ(streaming.head(0, 0).counts, (std::vector<uint32_t>{1, 1, 1, 1}));
}

TEST(EvictionTest, MergeEntriesAveragesEachGroupByCountAndDropsGroupMinusOne) {
  HeadCache head;
  head.keys = {1, 2, 3, 4, 5};
  head.values = {10, 20, 30, 40, 50};
  head.counts = {1, 3, 2, 0, 0};
  head.attention = {0.5, 0.25, 1.0, 0.0, 0.0};
  // Entries 0 and 1 -> group 1, entry 2 dropped, entries 3 and 4 (padding) -> group 0.
  MergeEntries(&head, 1, {1, 1, -1, 0, 0}, 2);
  ASSERT_EQ(head.size(), 2);
  EXPECT_EQ(head.counts, (std::vector<uint32_t>{0, 4}));
  EXPECT_FLOAT_EQ(head.keys[0], 4.0f);  // padding only: its first member as it is
  EXPECT_FLOAT_EQ(head.values[0], 40.0f);
  EXPECT_FLOAT_EQ(head.keys[1], (1.0f * 1 + 2.0f * 3) / 4);
  EXPECT_FLOAT_EQ(head.values[1], (10.0f * 1 + 20.0f * 3) / 4);
  EXPECT_EQ(head.attention, (std::vector<double>{0.0, 0.75}));
}

TEST(EvictionTest, SnapKvKeepsTheWindowAndThePooledMostAttended) {
  // With kernel 3, entry 4 (never attended itself) pools highest, between 3 and 5:
  // pooled(4) = (4 + 0 + 6) / 3, then pooled(2) = pooled(3) = 8 / 3, pooled(5) = 6 / 3.
  KvCache cache = LineCache({0, 0, 4, 4, 0, 6, 0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(EvictSnapKv(&cache, 0.5, 1, 3, 3).ok());
  // Budget 6: sink 0, window 9..11, and the two best pooled of 1..8: 4, then 2 (the older of
  // the tie).
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 2, 4, 9, 10, 11}));
  // Kernel 1 is no pooling: then 5 and one of 2, 3 (the older on ties).
  cache = LineCache({0, 0, 4, 4, 0, 6, 0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(EvictSnapKv(&cache, 0.5, 1, 3, 1).ok());
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 2, 5, 9, 10, 11}));
}

TEST(EvictionTest, SnapKvNeedsTrackedAttentionAndAKernel) {
  KvCache cache = LineCache(std::vector<double>(4, 0.0));
  EXPECT_EQ(EvictSnapKv(&cache, 0.5, 1, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  cache.TrackAttention(false);
  EXPECT_EQ(EvictSnapKv(&cache, 0.5, 1, 1, 3).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EvictionTest, OnlineVariantsCutToAFixedBudgetAndLeaveShorterHeads) {
  KvCache cache = LineCache({9, 0, 5, 0.5, 7, 1, 0, 3, 0, 0});
  EvictStreamingLlmToBudget(&cache, 12, 2);  // shorter than the budget: untouched
  EXPECT_EQ(Keys(cache).size(), 10u);
  ASSERT_TRUE(EvictHeavyHittersToBudget(&cache, 5, 1, 2).ok());
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 2, 4, 8, 9}));
  EvictStreamingLlmToBudget(&cache, 3, 1);
  EXPECT_EQ(Keys(cache), (std::vector<float>{0, 8, 9}));
  cache.TrackAttention(false);
  EXPECT_EQ(EvictHeavyHittersToBudget(&cache, 2, 1, 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace centroidkv::worker
