// The tensor-core match's pieces on the host (kernels/cuda/tile_match.h): the bf16x3 scores
// against the exact cosine and TileMatchBound, and the near-tie lists a block writes (they
// hold the exact best, only near ties, and overflow when they must). Its bf16 rounding is
// checked against the host's in layer_stages_test.cc.
// The same TileMatchBlock runs on the device with WMMA products (tests/kernels/cuda's
// CudaEngineTest and the Cuda conformance suite check that where a GPU is present).
#include "kernels/cuda/tile_match.h"

#include <cmath>
#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/layer_batch.h"
#include "tests/kernels/cuda/staged_job.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::cuda {
namespace {

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
}  // namespace centroidkv::cuda
