// StagedJob and the near-tie list check (staged_job.h).
#include "tests/kernels/cuda/staged_job.h"

#include "gtest/gtest.h"

namespace centroidkv::cuda {

test::RandomLayerSpec TileTestKeys(int32_t tokens, int32_t dim, DType dtype, int32_t prototypes,
                                   double noise, uint64_t seed) {
  test::RandomLayerSpec spec = test::Spec(2, tokens, dim, 4, seed, dtype);
  spec.prototypes = prototypes;
  spec.noise = noise;
  return spec;
}

StagedJob::StagedJob(const test::RandomLayerSpec& spec, int32_t chunk)
    : layer_(test::RandomLayer::Generate(spec)), view_(layer_.view()) {
  CompressOptions options;
  options.chunk_size = chunk;
  options.target_ratio = 0.5;
  plan_ = *PlanLayer(view_, options, EngineLimits{});
  const BatchJob job{&plan_, &view_, &result_};
  batch_.emplace(*LayerBatch::Create({&job, 1}, MatchKernel::kTiles));
  const WorkspaceSizes& sizes = batch_->sizes();
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

void StagedJob::MatchTiles() {
  std::vector<uint64_t> smem(MakeTileLayout(params().key_dim).bytes / 8 + 16);
  char* base =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem.data()) + 127) / 128 * 128);
  for (int64_t item = 0; item < TileMatchItems(params()); ++item) {
    TileMatchBlock(params(), arrays_, batch_->Pass(0), item, base, 0, 1);
  }
}

double StagedJob::Exact(int64_t g, int32_t slot, int32_t k) const {
  const RowPlace place = PlaceRow(params(), arrays_, g, SlotRow(params(), slot));
  return ExactCosine(params(), arrays_, g, 0, SlotRow(params(), slot), place.first + 2 * k + 1);
}

int32_t StagedJob::Destinations(int64_t g, int32_t slot) const {
  return PlaceRow(params(), arrays_, g, SlotRow(params(), slot)).length / 2;
}

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

}  // namespace centroidkv::cuda
