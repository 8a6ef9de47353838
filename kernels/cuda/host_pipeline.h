// The CUDA backend's stages (layer_stages.h) run on the host, item by item, with a stable
// std::sort standing in for CUB's segmented sort: the same algorithm, decisions and float64
// operation order as the device, with no GPU. It exists so that every machine (CI included)
// runs the conformance suite against the GPU algorithm; it is a test engine, never chosen by
// EngineSet. Slow (one item at a time): for tests only.
// Thread-safe: Compress() allocates its own buffers per call.
#pragma once

#include <string_view>

#include <span>

#include "centroidkv/kernels/engine.h"
#include "kernels/cuda/layer_batch.h"

namespace centroidkv::cuda {

// Runs a batch of jobs (CanBatch-compatible, validated and planned) through the stages on
// the host and fills each job's CompressResult: what one device launch sequence computes.
// warp_lanes = 32 runs each warp stage (IsWarpStage) on 32 threads that emulate a warp's
// lanes (split loops, butterfly sums, lead-lane writes), as the device does; 1 runs it
// plainly. The tile match (kMatchTiles) runs each block as one warp of one lane.
absl::Status RunBatchOnHost(std::span<const BatchJob> jobs, int32_t warp_lanes = 1,
                            MatchKernel match = MatchKernel::kTiles);

class HostPipelineEngine final : public ClusterEngine {
 public:
  explicit HostPipelineEngine(EngineLimits limits = {}, int32_t warp_lanes = 1,
                              MatchKernel match = MatchKernel::kTiles)
      : ClusterEngine(limits), warp_lanes_(warp_lanes), match_(match) {}

  std::string_view name() const override { return "cuda-stages-on-host"; }
  // The stages write the packed rows in the result dtype, as on the device (fp8 rows are
  // quantised above the backend).
  EngineCaps caps() const override { return {.writes_half_rows = true}; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;

 private:
  int32_t warp_lanes_;
  MatchKernel match_;
};

}  // namespace centroidkv::cuda
