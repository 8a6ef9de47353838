// Test helper for the CUDA backend's match stages: one layer job staged as the device stages
// it (LayerBatch's workspace in host memory, pass 0 set up), the exact cosines of its
// source-destination pairs, and the property every near-tie list must have. Used by the
// host tests of the tile match (tile_match_test.cc) and by its device test
// (cuda_engine_test.cc), which uploads the same workspace and reads the device's lists back.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cuda/layer_batch.h"
#include "kernels/cuda/tile_match.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::cuda {

// H = 2 heads of `tokens` random keys (value_dim 4), `prototypes` / `noise` as in
// RandomLayerSpec.
test::RandomLayerSpec TileTestKeys(int32_t tokens, int32_t dim, DType dtype, int32_t prototypes,
                                   double noise, uint64_t seed);

class StagedJob {
 public:
  // The job (rho = 0.5, chunk `chunk`, default sink and recent), staged, with kInit and
  // kSetup of pass 0 run on the host.
  StagedJob(const test::RandomLayerSpec& spec, int32_t chunk);

  const LayerBatch& batch() const { return *batch_; }
  const BatchParams& params() const { return batch_->params(); }
  const BatchArrays& arrays() const { return arrays_; }
  // The staged input block and the work block (LayerBatch::Carve's layout).
  const void* input() const { return input_.data(); }
  void* work() { return work_.data(); }

  // Runs every block of kMatchTiles on the host.
  void MatchTiles();

  // The exact cosine of source slot `slot` of head g and destination k of its chunk.
  double Exact(int64_t g, int32_t slot, int32_t k) const;
  int32_t Destinations(int64_t g, int32_t slot) const;

 private:
  test::RandomLayer layer_;
  LayerView view_;
  LayerPlan plan_;
  CompressResult result_;
  std::optional<LayerBatch> batch_;
  std::vector<uint64_t> input_, work_, small_, owner_, packed_;
  BatchArrays arrays_{};
};

// EXPECTs of every source's near-tie list (match_count / match_ties): it holds the source's
// exact best destination and nothing whose exact score is more than 4 bounds below it (a
// listed score is within 2 bounds of the best float score, each within a bound of the
// exact one). Returns how many lists overflowed.
int ExpectListsHoldTheExactBest(const StagedJob& job);

}  // namespace centroidkv::cuda
