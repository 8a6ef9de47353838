// Tests the scalar helpers of the CUDA backend's stages (kernels/cuda/layer_stages.h) on the
// host: exact widening, the sort key order, the chunk arithmetic and the float64 cosine
// against the reference formula. The whole stage pipeline runs in the conformance suite
// (engine_conformance_test.cc, CudaStagesOnHost).
#include "kernels/cuda/layer_stages.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "gtest/gtest.h"

namespace centroidkv::cuda {
namespace {

TEST(LayerStagesTest, HalfWideningIsExactForEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float expected = HalfToFloat(static_cast<uint16_t>(bits));
    const float actual = HalfBitsToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << bits;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(actual), std::bit_cast<uint32_t>(expected)) << bits;
    }
  }
}

TEST(LayerStagesTest, BFloat16WideningIsExact) {
  for (uint32_t bits = 0; bits <= 0xffff; bits += 7) {
    EXPECT_EQ(std::bit_cast<uint32_t>(BFloat16BitsToFloat(static_cast<uint16_t>(bits))),
              std::bit_cast<uint32_t>(BFloat16ToFloat(static_cast<uint16_t>(bits))));
  }
}

// The device's float -> fp16 / bf16 rounding of result rows is the host's (common/dtype.h):
// every float whose top 16 bits are any pattern, with low bits at and around the rounding
// boundaries, and random floats.
TEST(LayerStagesTest, NarrowingToHalfAndBFloat16IsTheHostsRounding) {
  std::vector<uint32_t> patterns;
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (const uint32_t low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u,
                               0x8001u, 0xffffu}) {
      patterns.push_back(high << 16 | low);
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) patterns.push_back(rng());
  for (const uint32_t bits : patterns) {
    const float x = std::bit_cast<float>(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToHalfBits(x), FloatToHalf(x)) << std::hex << bits;
    ASSERT_EQ(FloatToBFloat16Bits(x), FloatToBFloat16(x)) << std::hex << bits;
  }
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalfBits(std::numeric_limits<float>::quiet_NaN()))));
  // bf16 ties and the ends, spelled out (the bf16 split of the tile match relies on them).
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x00000001u)), 0x0000);  // subnormal
}

TEST(LayerStagesTest, OrderKeyFollowsScoreOrder) {
  const std::vector<double> scores = {-std::numeric_limits<double>::infinity(), -1.0, -0.5,
                                      -1e-300, 0.0, 1e-300, 0.25, 0.999999, 1.0};
  for (size_t i = 0; i + 1 < scores.size(); ++i) {
    EXPECT_LT(OrderKey(scores[i]), OrderKey(scores[i + 1])) << scores[i];
  }
  EXPECT_GT(OrderKey(-1.0), uint64_t{0});  // 0 sorts below every candidate
  EXPECT_EQ(OrderKey(-0.0), OrderKey(0.0));
}

TEST(LayerStagesTest, SlotsInRangeCountsSourcesWithADestination) {
  // Chunks of 4 over 10 rows: {4, 4, 2} -> 2 + 2 + 1 sources.
  EXPECT_EQ(SlotsInRange(10, 4), 5);
  // A last chunk of one row has no destination, so no source.
  EXPECT_EQ(SlotsInRange(9, 4), 4);
  EXPECT_EQ(SlotsInRange(1, 4), 0);
  EXPECT_EQ(SlotsInRange(7, 3), 4);  // {3, 3, 1}
  EXPECT_EQ(SlotsInRange(5, 100), 3);
}

TEST(LayerStagesTest, SlotRowInvertsPlaceRow) {
  BatchParams p;
  p.num_jobs = 1;
  p.heads = 1;
  p.num_tokens = 40;
  p.chunk = 7;
  p.sink = 3;
  p.recent = 5;
  p.slot_capacity = 42;
  int32_t length = 40;
  BatchArrays a{};
  a.head_length = &length;
  for (int64_t row = 0; row < 40; ++row) {
    const RowPlace place = PlaceRow(p, a, 0, row);
    EXPECT_EQ(place.in_range, row >= 3 && row < 35) << row;
    if (!place.in_range) continue;
    EXPECT_EQ(place.source, (row - 3) % 7 % 2 == 0) << row;
    if (place.source) {
      EXPECT_EQ(SlotRow(p, place.slot), row);
    }
  }
}

// The reference engine's formula, written out independently.
double ReferenceCosine(const std::vector<float>& x, const std::vector<float>& y) {
  double dot = 0.0, nx = 0.0, ny = 0.0;
  for (size_t j = 0; j < x.size(); ++j) {
    dot += static_cast<double>(x[j]) * y[j];
    nx += static_cast<double>(x[j]) * x[j];
    ny += static_cast<double>(y[j]) * y[j];
  }
  return dot / (std::max(std::sqrt(nx), 1e-6) * std::max(std::sqrt(ny), 1e-6));
}

TEST(LayerStagesTest, ExactCosineIsTheReferenceCosineAndFloatScoresStayInTheBound) {
  constexpr int32_t kDim = 96;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  BatchParams p;
  p.num_jobs = 1;
  p.heads = 1;
  p.num_tokens = 2;
  p.key_dim = kDim;
  p.value_dim = 1;
  p.input_type = kInputF32;
  std::vector<float> keys(2 * kDim);
  BatchArrays a{};
  a.keys_in = keys.data();
  for (int trial = 0; trial < 200; ++trial) {
    for (float& k : keys) k = normal(rng) * (trial % 3 == 0 ? 1e-8f : 3.0f);
    const std::vector<float> x(keys.begin(), keys.begin() + kDim), y(keys.begin() + kDim, keys.end());
    const double exact = ExactCosine(p, a, 0, 0, 0, 1);
    EXPECT_EQ(std::bit_cast<uint64_t>(exact), std::bit_cast<uint64_t>(ReferenceCosine(x, y)));
    // The float score of rows normalised as StageNormalize does.
    std::vector<float> nx(kDim), ny(kDim);
    double sx = 0.0, sy = 0.0;
    for (int32_t j = 0; j < kDim; ++j) {
      sx += static_cast<double>(x[j]) * x[j];
      sy += static_cast<double>(y[j]) * y[j];
    }
    const double ix = 1.0 / std::max(std::sqrt(sx), 1e-6), iy = 1.0 / std::max(std::sqrt(sy), 1e-6);
    for (int32_t j = 0; j < kDim; ++j) {
      nx[j] = static_cast<float>(x[j] * ix);
      ny[j] = static_cast<float>(y[j] * iy);
    }
    EXPECT_LE(std::fabs(FloatScore(nx.data(), ny.data(), kDim) - exact), MatchBound(kDim));
  }
}

}  // namespace
}  // namespace centroidkv::cuda
