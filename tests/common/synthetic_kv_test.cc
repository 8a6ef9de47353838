// Tests for the synthetic KV generator: deterministic per (seed, stream), streams unrelated,
// and runs of consecutive tokens near one direction (the structure clustering exploits).
#include "centroidkv/common/synthetic_kv.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv {
namespace {

std::vector<float> Head(const SyntheticKvSpec& spec, int32_t dim, uint64_t stream) {
  std::vector<float> rows(static_cast<size_t>(spec.tokens) * dim);
  SynthesizeHead(spec, dim, stream, rows.data());
  return rows;
}

double Cosine(const float* a, const float* b, int32_t dim) {
  double dot = 0, na = 0, nb = 0;
  for (int32_t j = 0; j < dim; ++j) {
    dot += double{a[j]} * b[j];
    na += double{a[j]} * a[j];
    nb += double{b[j]} * b[j];
  }
  return dot / std::sqrt(na * nb);
}

TEST(SyntheticKvTest, SameSeedAndStreamGiveTheSameRows) {
  SyntheticKvSpec spec;
  spec.tokens = 64;
  EXPECT_EQ(Head(spec, 16, 3), Head(spec, 16, 3));
}

TEST(SyntheticKvTest, StreamsAndSeedsDiffer) {
  SyntheticKvSpec spec;
  spec.tokens = 64;
  const std::vector<float> base = Head(spec, 16, 0);
  EXPECT_NE(base, Head(spec, 16, 1));
  spec.seed = 2;
  EXPECT_NE(base, Head(spec, 16, 0));
}

// With stay = 0.9 most neighbours share a topic (cosine near 1 at low noise); with stay = 0
// and many topics most do not.
TEST(SyntheticKvTest, TokensComeInRunsNearOneDirection) {
  constexpr int32_t kDim = 64;
  auto similar_neighbours = [](const SyntheticKvSpec& spec) {
    const std::vector<float> rows = Head(spec, kDim, 0);
    int similar = 0;
    for (int32_t t = 1; t < spec.tokens; ++t) {
      similar += Cosine(&rows[(t - 1) * kDim], &rows[t * kDim], kDim) > 0.9 ? 1 : 0;
    }
    return static_cast<double>(similar) / (spec.tokens - 1);
  };
  SyntheticKvSpec runs;
  runs.tokens = 2000;
  runs.noise = 0.1;
  EXPECT_GT(similar_neighbours(runs), 0.85);
  SyntheticKvSpec scattered = runs;
  scattered.stay = 0.0;
  scattered.topics = 1000;
  EXPECT_LT(similar_neighbours(scattered), 0.05);
}

}  // namespace
}  // namespace centroidkv
