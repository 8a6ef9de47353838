// Tests of kernels/cpu/edge_decisions.cc on what hostile input can do to it: keys that a
// client changes in shared memory after the engine checked them can give NaN scores, and a
// NaN best match must not become an index outside the chunk, nor a NaN score a sort with an
// inconsistent order (found by UBSan in ShmRegionTest.InputScribbledDuringJobsNeverCrashes...).
#include "kernels/cpu/edge_decisions.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd_dispatch.h"
#include "kernels/cpu/soft_match.h"

namespace centroidkv::cpu {
namespace {

constexpr int32_t kDim = 8;
constexpr int32_t kLength = 10;  // 5 sources, 5 destinations

std::vector<float> RandomKeys(int32_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> keys(static_cast<size_t>(rows) * kDim);
  for (float& x : keys) x = normal(rng);
  return keys;
}

// One chunk of kLength random float keys, matched at this CPU's level.
struct MatchedChunk {
  explicit MatchedChunk(uint64_t seed)
      : kernels(KernelsFor(DetectSimdLevel())),
        keys(RandomKeys(kLength, seed)),
        rows{keys.data(), ElemType::kF32, kDim},
        scorer(kernels, rows, kDim),
        matches(kLength) {
    matcher.Match(kernels, rows, 0, kLength, kDim, matches.data());
  }

  // ResolveChunkEdges with no floor.
  bool Resolve(std::vector<Edge>* edges) {
    edges->assign(kLength, Edge{});
    return ResolveChunkEdges(matches.data(), &matcher, 0, -std::numeric_limits<double>::infinity(),
                             MatchErrorBound(kernels, kDim), scorer, edges->data());
  }

  const KernelTable& kernels;
  std::vector<float> keys;
  RowBlock rows;
  ExactScorer scorer;
  ChunkMatcher matcher;
  std::vector<RowMatch> matches;
};

TEST(ResolveChunkEdgesTest, FiniteMatchesGiveEveryEdgeInsideTheChunk) {
  MatchedChunk chunk(1);
  std::vector<Edge> edges;
  EXPECT_TRUE(chunk.Resolve(&edges));
  for (int32_t i = 0; i < chunk.matcher.sources(); ++i) {
    EXPECT_EQ(edges[i].source, 2 * i);
    EXPECT_EQ(edges[i].destination % 2, 1) << "source " << i;
    EXPECT_GE(edges[i].destination, 1);
    EXPECT_LT(edges[i].destination, kLength);
    EXPECT_TRUE(edges[i].candidate);
  }
}

TEST(ResolveChunkEdgesTest, NonFiniteMatchGivesNoEdgeAndIsReported) {
  MatchedChunk chunk(2);
  // What ReduceTop2 returns when every lane of a source is NaN: no lane equals the maximum.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  chunk.matches[1] = RowMatch{0x7fffffff, nan, nan};
  chunk.matches[3] = RowMatch{2, nan, -1.0f};  // a valid index, a NaN score
  std::vector<Edge> edges;
  EXPECT_FALSE(chunk.Resolve(&edges));
  for (int32_t i : {1, 3}) {
    EXPECT_EQ(edges[i].source, 2 * i);
    EXPECT_EQ(edges[i].destination, -1) << "source " << i;
    EXPECT_FALSE(edges[i].candidate);
  }
  for (int32_t i : {0, 2, 4}) {
    EXPECT_GE(edges[i].destination, 1) << "source " << i;
    EXPECT_LT(edges[i].destination, kLength);
    EXPECT_TRUE(edges[i].candidate);
  }
}

TEST(OrderSourcesTest, NaNScoresSortLastAndTheRestStayInOrder) {
  // More than 16 sources, so that std::sort (which an inconsistent order can drive outside
  // its range) does the sorting, not the insertion sort.
  const KernelTable& kernels = KernelsFor(DetectSimdLevel());
  const std::vector<float> keys = RandomKeys(2, 3);
  const ExactScorer scorer(kernels, RowBlock{keys.data(), ElemType::kF32, kDim}, kDim);
  constexpr int32_t kCount = 40;
  std::vector<Edge> edges(kCount);
  std::vector<int32_t> slots(kCount);
  for (int32_t k = 0; k < kCount; ++k) {
    edges[k].source = 2 * k;
    edges[k].exact = true;  // nothing to rescore
    edges[k].score = k % 3 == 0 ? std::numeric_limits<double>::quiet_NaN() : 0.01 * (k % 7);
    slots[k] = kCount - 1 - k;
  }
  OrderSources(edges.data(), slots, 1e-6, scorer);
  int32_t first_nan = kCount;
  for (int32_t k = 0; k < kCount; ++k) {
    if (std::isnan(edges[slots[k]].score)) {
      first_nan = std::min(first_nan, k);
      continue;
    }
    EXPECT_LT(k, first_nan) << "a finite score after a NaN one";
    if (k > 0 && !std::isnan(edges[slots[k - 1]].score)) {
      const Edge& x = edges[slots[k - 1]];
      const Edge& y = edges[slots[k]];
      EXPECT_TRUE(x.score > y.score || (x.score == y.score && x.source < y.source)) << k;
    }
  }
  EXPECT_EQ(first_nan, kCount - 14);  // k = 0, 3, ..., 39: 14 NaN scores
  for (int32_t k = first_nan + 1; k < kCount; ++k) {
    EXPECT_LT(edges[slots[k - 1]].source, edges[slots[k]].source);
  }
}

}  // namespace
}  // namespace centroidkv::cpu
