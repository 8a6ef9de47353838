// The tensor-core match's pieces on the host (kernels/gpu/tile_match.h): bfloat16 rounding,
// the bf16x3 scores against the exact cosine and TileMatchBound, and the near-tie lists a
// block writes (they hold the exact best, only near ties, and overflow when they must).
// The same TileMatchBlock runs on the device with WMMA products (tests/kernels/gpu's
// CudaEngineTest and the Gpu conformance suite check that where a GPU is present).
#include "kernels/gpu/tile_match.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gpu/layer_batch.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::gpu {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;

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

// One job staged as the device stages it, with the per-pass setup run (pass 0).
class StagedJob {
 public:
  StagedJob(const RandomLayerSpec& spec, int32_t chunk)
      : layer_(RandomLayer::Generate(spec)), view_(layer_.view()) {
    CompressOptions options;
    options.chunk_size = chunk;
    options.target_ratio = 0.5;
    plan_ = *PlanLayer(view_, options, EngineLimits{});
    const BatchJob job{&plan_, &view_, &result_};
    batch_.emplace(*LayerBatch::Create({&job, 1}, MatchKernel::kTiles));
    const WorkspaceSizes& sizes = batch_->sizes();
    for (auto* block : {&input_, &work_, &small_, &owner_, &packed_}) block->clear();
    input_.resize(sizes.input / 8 + 1);
    work_.resize(sizes.work / 8 + 1);
    small_.resize(sizes.small_out / 8 + 1);
    owner_.resize(sizes.owner / 8 + 1);
    packed_.resize(sizes.packed / 8 + 1);
    arrays_ = batch_->Carve(input_.data(), work_.data(), small_.data(), owner_.data(),
                            packed_.data());
    batch_->StageInputs(input_.data());
    const PassArgs pass = batch_->Pass(0);
    for (int64_t i = 0; i < batch_->Items(StageId::kInit); ++i) {
      RunStageItem(StageId::kInit, params(), arrays_, pass, i);
    }
    for (int64_t g = 0; g < batch_->Items(StageId::kSetup); ++g) {
      RunStageItem(StageId::kSetup, params(), arrays_, pass, g);
    }
  }

  const BatchParams& params() const { return batch_->params(); }
  const BatchArrays& arrays() const { return arrays_; }

  // Runs every block of kMatchTiles.
  void MatchTiles() {
    std::vector<uint64_t> smem(MakeTileLayout(params().key_dim).bytes / 8 + 16);
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem.data()) + 127) / 128 *
                                         128);
    for (int64_t item = 0; item < TileMatchItems(params()); ++item) {
      TileMatchBlock(params(), arrays_, item, base, 0, 1);
    }
  }

  // The exact cosine of source slot `slot` of head g and destination k of its chunk.
  double Exact(int64_t g, int32_t slot, int32_t k) const {
    const RowPlace place = PlaceRow(params(), arrays_, g, SlotRow(params(), slot));
    return ExactCosine(params(), arrays_, g, 0, SlotRow(params(), slot), place.first + 2 * k + 1);
  }
  int32_t Destinations(int64_t g, int32_t slot) const {
    return PlaceRow(params(), arrays_, g, SlotRow(params(), slot)).length / 2;
  }

 private:
  RandomLayer layer_;
  LayerView view_;
  LayerPlan plan_;
  CompressResult result_;
  std::optional<LayerBatch> batch_;
  std::vector<uint64_t> input_, work_, small_, owner_, packed_;
  BatchArrays arrays_{};
};

RandomLayerSpec Keys(int32_t tokens, int32_t dim, DType dtype, int32_t prototypes, double noise,
                     uint64_t seed) {
  RandomLayerSpec spec = test::Spec(2, tokens, dim, 4, seed, dtype);
  spec.prototypes = prototypes;
  spec.noise = noise;
  return spec;
}

TEST(TileMatchTest, ScoresAreWithinTheBoundOfTheExactCosine) {
  for (const int32_t dim : {1, 4, 36, 64, 128, 200, 256}) {
    for (const double noise : {1.0, 0.01}) {  // independent rows; rows with cosines near 1
      SCOPED_TRACE("dim " + std::to_string(dim) + " noise " + std::to_string(noise));
      StagedJob job(Keys(64, dim, dim % 2 == 0 ? DType::kFloat16 : DType::kFloat32, 3, noise,
                         static_cast<uint64_t>(dim)),
                    64);
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

// For every source: the list holds its exact best destination and nothing whose exact score
// is more than 4 bounds below it (listed: float >= top - 2 bound, float within bound).
// Returns how many lists overflowed.
int ExpectListsHoldTheExactBest(const StagedJob& job) {
  const BatchParams& p = job.params();
  const BatchArrays& a = job.arrays();
  int overflowed = 0, listed_more = 0;
  for (int64_t g = 0; g < p.global_heads(); ++g) {
    for (int32_t slot = 0; slot < a.head_slots[g]; ++slot) {
      const int64_t item = g * p.slot_capacity + slot;
      const int32_t destinations = job.Destinations(g, slot);
      const int32_t count = a.match_count[item];
      if (destinations == 0) {
        EXPECT_EQ(count, 0);
        continue;
      }
      if (count == kTieOverflow) {
        ++overflowed;
        continue;
      }
      EXPECT_GE(count, 1) << "slot " << slot;
      EXPECT_LE(count, kMaxTies) << "slot " << slot;
      if (count < 1 || count > kMaxTies) continue;
      listed_more += count > 1 ? 1 : 0;
      int32_t best = 0;
      for (int32_t k = 1; k < destinations; ++k) {
        if (job.Exact(g, slot, k) > job.Exact(g, slot, best)) best = k;
      }
      const double best_score = job.Exact(g, slot, best);
      bool found = false;
      for (int32_t i = 0; i < count; ++i) {
        const int32_t k = a.match_ties[item * kMaxTies + i];
        EXPECT_TRUE(k >= 0 && k < destinations) << "slot " << slot << ": " << k;
        if (k < 0 || k >= destinations) continue;
        found = found || k == best;
        EXPECT_GE(job.Exact(g, slot, k), best_score - 4 * p.bound) << "slot " << slot;
      }
      EXPECT_TRUE(found) << "slot " << slot << ": exact best " << best << " not listed";
    }
  }
  ::testing::Test::RecordProperty("listed_more_than_one", listed_more);
  return overflowed;
}

TEST(TileMatchTest, ListsHoldTheExactBestAcrossTiles) {
  // Chunks of 300 rows: 150 sources in 3 source tiles, 150 destinations in 3 tiles; a last
  // short chunk; the default options' sink and recent window.
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    StagedJob job(Keys(700, 64, dtype, 0, 1.0, 5), 300);
    job.MatchTiles();
    EXPECT_EQ(ExpectListsHoldTheExactBest(job), 0);
  }
}

TEST(TileMatchTest, NearTiesAreListedAndTooManyOverflow) {
  {  // Three prototypes and little noise: often several destinations near the best.
    StagedJob job(Keys(256, 128, DType::kFloat32, 3, 1e-3, 9), 64);
    job.MatchTiles();
    ExpectListsHoldTheExactBest(job);
    int more = 0;
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      more += job.arrays().match_count[slot] > 1 ? 1 : 0;
    }
    EXPECT_GT(more, 0);
  }
  {  // One prototype, no noise: all 32 destinations of a chunk tie, so every list overflows.
    StagedJob job(Keys(256, 32, DType::kFloat16, 1, 0.0, 3), 64);
    job.MatchTiles();
    EXPECT_GT(ExpectListsHoldTheExactBest(job), 0);
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      EXPECT_EQ(job.arrays().match_count[slot], kTieOverflow) << "slot " << slot;
    }
  }
  {  // The same with chunks of 16: 8 destinations tie, which still fit in a list.
    StagedJob job(Keys(256, 32, DType::kFloat16, 1, 0.0, 3), 16);
    job.MatchTiles();
    for (int32_t slot = 0; slot < job.arrays().head_slots[0]; ++slot) {
      EXPECT_EQ(job.arrays().match_count[slot], kMaxTies) << "slot " << slot;
    }
  }
}

}  // namespace
}  // namespace centroidkv::gpu
