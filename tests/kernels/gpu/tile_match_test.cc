// The tensor-core match's pieces on the host (kernels/gpu/tile_match.h): bfloat16 rounding,
// the bf16x3 scores against the exact cosine and TileMatchBound, and the near-tie lists a
// block writes (they hold the exact best, only near ties, and overflow when they must).
// The same TileMatchBlock runs on the device with WMMA products (tests/kernels/gpu's
// CudaEngineTest and the Gpu conformance suite check that where a GPU is present).
#include "kernels/gpu/tile_match.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gpu/layer_batch.h"
#include "tests/kernels/gpu/staged_job.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::gpu {
namespace {


float Bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest bfloat16, ties to even, by comparing the two neighbours in double.
uint16_t NearestBFloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t down = bits & 0xffff0000u, up = down + 0x10000u;
  const double below = std::abs(static_cast<double>(x) - Bits(down));
  const double above = std::abs(static_cast<double>(Bits(up)) - x);
  if (below != above) return static_cast<uint16_t>((below < above ? down : up) >> 16);
  return static_cast<uint16_t>(((down >> 16) & 1u) == 0 ? down >> 16 : up >> 16);
}

TEST(TileMatchTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(Bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBFloat16Bits(Bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(FloatToBFloat16Bits(Bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16Bits(Bits(0x00000001u)), 0x0000);  // smallest subnormal
  std::mt19937 rng(16);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    if ((bits & 0x7f800000u) >= 0x7f000000u) bits &= 0xbfffffffu;  // finite, no overflow
    const float x = Bits(bits);
    ASSERT_EQ(FloatToBFloat16Bits(x), NearestBFloat16(x)) << std::hex << bits;
  }
}

TEST(TileMatchTest, ScoresAreWithinTheBoundOfTheExactCosine) {
  for (const int32_t dim : {1, 4, 36, 64, 128, 200, 256}) {
    for (const double noise : {1.0, 0.01}) {  // independent rows; rows with cosines near 1
      SCOPED_TRACE("dim " + std::to_string(dim) + " noise " + std::to_string(noise));
      const DType dtype = dim % 2 == 0 ? DType::kFloat16 : DType::kFloat32;
      StagedJob job(TileTestKeys(64, dim, dtype, 3, noise, static_cast<uint64_t>(dim)), 64);
      const BatchParams& p = job.params();
      const TileLayout l = MakeTileLayout(dim);
      std::vector<uint16_t> hi(32 * static_cast<size_t>(l.pitch) + 64);
      std::vector<uint16_t> lo(hi.size());
      std::vector<float> scores(16 * kScorePitch);
      // Sources 0 .. 15 and destinations 0 .. 15 of head 1's first chunk.
      const int64_t first = PlaceRow(p, job.arrays(), 1, SlotRow(p, 0)).first;
      for (int32_t i = 0; i < 16; ++i) {
        LoadSplitRow(p, job.arrays(), 1, 0, SlotRow(p, i), hi.data() + i * l.pitch,
                     lo.data() + i * l.pitch);
        LoadSplitRow(p, job.arrays(), 1, 0, first + 2 * i + 1, hi.data() + (16 + i) * l.pitch,
                     lo.data() + (16 + i) * l.pitch);
      }
      WarpTileScores(hi.data(), lo.data(), hi.data() + 16 * l.pitch, lo.data() + 16 * l.pitch,
                     l.pitch, TileDepth(dim), 1, scores.data());
      double worst = 0.0;
      for (int32_t s = 0; s < 16; ++s) {
        for (int32_t k = 0; k < 16; ++k) {
          const double exact = job.Exact(1, s, k);
          worst = std::max(worst, std::abs(scores[s * kScorePitch + k] - exact));
        }
      }
      EXPECT_LE(worst, TileMatchBound(dim));
      // bf16x3 keeps about 16 bits: far inside the bound, far from float's exactness.
      EXPECT_LT(worst, TileMatchBound(dim) / 4);
      if (dim >= 36) {
        EXPECT_GT(worst, 0.0);
      }
    }
  }
}

TEST(TileMatchTest, ListsHoldTheExactBestAcrossTiles) {
  // Chunks of 300 rows: 150 sources in 3 source tiles, 150 destinations in 3 tiles; a last
  // short chunk; the default options' sink and recent window.
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    StagedJob job(TileTestKeys(700, 64, dtype, 0, 1.0, 5), 300);
    job.MatchTiles();
    EXPECT_EQ(ExpectListsHoldTheExactBest(job), 0);
  }
}

TEST(TileMatchTest, NearTiesAreListedAndTooManyOverflow) {
  {  // Three prototypes and little noise: often several destinations near the best.
    StagedJob job(TileTestKeys(256, 128, DType::kFloat32, 3, 1e-3, 9), 64);
    job.MatchTiles();
    ExpectListsHoldTheExactBest(job);
    int more = 0;
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      more += job.arrays().match_count[slot] > 1 ? 1 : 0;
    }
    EXPECT_GT(more, 0);
  }
  {  // One prototype, no noise: all 32 destinations of a chunk tie, so every list overflows.
    StagedJob job(TileTestKeys(256, 32, DType::kFloat16, 1, 0.0, 3), 64);
    job.MatchTiles();
    EXPECT_GT(ExpectListsHoldTheExactBest(job), 0);
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      EXPECT_EQ(job.arrays().match_count[slot], kTieOverflow) << "slot " << slot;
    }
  }
  {  // The same with chunks of 16: 8 destinations tie, which still fit in a list.
    StagedJob job(TileTestKeys(256, 32, DType::kFloat16, 1, 0.0, 3), 16);
    job.MatchTiles();
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      EXPECT_EQ(job.arrays().match_count[slot], kMaxTies) << "slot " << slot;
    }
  }
}

}  // namespace
}  // namespace centroidkv::gpu
