// Tests of worker/kmeans.cc: budget, protected sinks and recent entries, counts
// conserved, centroids as count-weighted means, and well-separated clusters found.
#include "worker/kmeans.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

// One head of size 2 holding the given keys (values = keys * 10) with counts.
KvCache PointCache(const std::vector<std::pair<float, float>>& keys,
                   const std::vector<uint32_t>& counts) {
  KvCache cache(1, 1, 2);
  for (const auto& [x, y] : keys) {
    const float k[2] = {x, y};
    const float v[2] = {10 * x, 10 * y};
    cache.Append(0, k, v);
    cache.AdvancePosition();
  }
  cache.head(0, 0).counts = counts;
  return cache;
}

TEST(KMeansTest, MergesSeparatedClustersIntoWeightedMeans) {
  // Sink 0, recent 7; the middle 1..6 holds two clusters: near (0, 0) and near (5, 5).
  KvCache cache = PointCache({{9, 9}, {0, 0}, {5, 5}, {1, 0}, {6, 5}, {0, 1}, {5, 6}, {-9, -9}},
                             {1, 1, 1, 3, 1, 1, 2, 1});
  KMeansOptions options;
  options.sinks = 1;
  options.recent = 1;
  KMeansCompress(&cache, 0.5, options);  // budget 4 = sink + 2 clusters + recent
  const HeadCache& head = cache.head(0, 0);
  ASSERT_EQ(head.size(), 4);
  EXPECT_EQ(head.counts, (std::vector<uint32_t>{1, 5, 4, 1}));
  // Cluster of entries 1, 3, 5 (counts 1, 3, 1): key (3/5, 1/5); values are 10x.
  EXPECT_FLOAT_EQ(head.keys[2], 0.6f);
  EXPECT_FLOAT_EQ(head.keys[3], 0.2f);
  EXPECT_FLOAT_EQ(head.values[2], 6.0f);
  // Cluster of entries 2, 4, 6 (counts 1, 1, 2): key (21/4, 22/4).
  EXPECT_FLOAT_EQ(head.keys[4], 5.25f);
  EXPECT_FLOAT_EQ(head.keys[5], 5.5f);
  // Sink and recent unchanged.
  EXPECT_EQ(head.keys[0], 9.0f);
  EXPECT_EQ(head.keys[7], -9.0f);
  EXPECT_EQ(cache.position(), 8);
}

TEST(KMeansTest, ConservesCountsAndMeetsTheBudgetOnRandomKeys) {
  std::vector<std::pair<float, float>> keys;
  for (int i = 0; i < 100; ++i) {
    keys.emplace_back(static_cast<float>((i * 37) % 17), static_cast<float>((i * 11) % 7));
  }
  KvCache cache = PointCache(keys, std::vector<uint32_t>(100, 2));
  KMeansOptions options;
  options.sinks = 2;
  options.recent = 3;
  KMeansCompress(&cache, 0.25, options);  // 20 clusters for the 95 entries in between
  const HeadCache& head = cache.head(0, 0);
  EXPECT_LE(head.size(), 25);
  EXPECT_GE(head.size(), 5 + 17);  // the 17 x 7 grid has more distinct keys than clusters
  EXPECT_EQ(std::accumulate(head.counts.begin(), head.counts.end(), 0u), 200u);
}

TEST(KMeansTest, HeadWithinBudgetIsUnchanged) {
  KvCache cache = PointCache({{1, 2}, {3, 4}}, {1, 1});
  KMeansCompress(&cache, 1.0, KMeansOptions{});
  EXPECT_EQ(cache.head(0, 0).keys, (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace centroidkv::worker
