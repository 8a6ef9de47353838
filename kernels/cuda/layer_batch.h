// Host side of the CUDA backend's algorithm, shared by the device engine (cuda_engine.cc)
// and its host twin (host_pipeline.h): which layer jobs batch together, the BatchParams of a
// batch, the sizes of its arrays carved out of one workspace, staging the inputs contiguously,
// the order of the stages of layer_stages.h, and turning the packed output into one
// CompressResult per job. Plain C++: no CUDA types.
// Thread-compatible: a LayerBatch is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"
#include "kernels/cuda/layer_stages.h"

namespace centroidkv::cuda {

// One layer job as the engine received it (validated and planned by ClusterEngine).
struct BatchJob {
  const LayerPlan* plan = nullptr;
  const LayerView* layer = nullptr;
  CompressResult* out = nullptr;
};

// How a batch matches sources to destinations: kTiles, the tensor-core match (kMatchTiles,
// tile_match.h) where TileMatchSupports(key_dim), else the warp match; kWarp, the
// warp match (kNormalize + kMatch: a warp per source on CUDA cores) always.
enum class MatchKernel : uint8_t { kTiles, kWarp };

// Whether two jobs can run in one batch: the same shape, dtype, layout and options (so the
// same BatchParams), whatever their data.
bool CanBatch(const BatchJob& a, const BatchJob& b);

// Byte sizes of the parts of a batch's workspace.
struct WorkspaceSizes {
  size_t input = 0;      // keys_in, values_in, counts_in, passthrough (uploaded together)
  size_t work = 0;       // everything the stages use on the device only
  size_t small_out = 0;  // head_length, out_offsets, job_passes (downloaded first)
  size_t owner = 0;      // owner (the assignment)
  size_t packed = 0;     // packed keys, values, counts (at most G * n rows)
};

class LayerBatch {
 public:
  // Checks that the jobs can batch (CanBatch) and that the batch's indices fit int32.
  static absl::StatusOr<LayerBatch> Create(std::span<const BatchJob> jobs,
                                           MatchKernel match = MatchKernel::kTiles);

  const BatchParams& params() const { return params_; }
  const WorkspaceSizes& sizes() const { return sizes_; }
  std::span<const BatchJob> jobs() const { return jobs_; }
  int64_t rows() const { return params_.global_heads() * params_.num_tokens; }
  int64_t slots() const { return params_.global_heads() * params_.slot_capacity; }
  // The passes the host launches: 0 .. last_pass (-1: none). Without a floor the lengths of
  // every pass follow from the shape, so the last one that merges is known and writes the
  // float output directly; with a floor it is max_passes - 1 (jobs that stop earlier get
  // their output from the Emit stage).
  int32_t last_pass() const { return last_pass_; }
  PassArgs Pass(int32_t pass) const;
  // Items of each stage.
  int64_t Items(StageId stage) const;

  // Points `arrays` into three blocks laid out by sizes(): `input` (sizes().input bytes),
  // `work` (sizes().work) and the outputs (small_out, owner, packed, each its own block).
  BatchArrays Carve(void* input, void* work, void* small_out, void* owner, void* packed) const;

  // Copies every job's keys, values, counts (1 where the job has none) and passthrough
  // mask into `input` (sizes().input bytes), in the layout Carve() gives it.
  void StageInputs(void* input) const;

  // Fills each job's CompressResult from the downloaded outputs: `small_out` as Carve() laid
  // it out, `owner` (G * n), `packed` rows.
  void ExtractResults(const void* small_out, const int32_t* owner, const void* packed) const;
  // Rows in the packed output, read from the downloaded small_out.
  int64_t PackedRows(const void* small_out) const;
  // The parts of the packed block that hold `rows` rows: (byte offset, bytes) of the keys,
  // the values and the counts. A download copies only these.
  std::vector<std::pair<size_t, size_t>> PackedRanges(int64_t rows) const;

 private:
  LayerBatch() = default;

  std::vector<BatchJob> jobs_;
  BatchParams params_;
  WorkspaceSizes sizes_;
  int32_t last_pass_ = -1;
  int32_t floor_on_ = 0;
  double tau_ = 0.0;
  std::vector<double> floors_;  // [max_passes]: LayerPlan::FloorForPass
};

// Runs the stages of every pass in order on an executor with
//   absl::Status Stage(StageId stage, int64_t items, const PassArgs& pass);
//   absl::Status Sort();  // per head g: the slots seg_begin[g] .. seg_end[g] sorted by
//                         // sort_keys_in descending, stable, into sort_*_out
template <typename Executor>
absl::Status RunBatchStages(const LayerBatch& batch, Executor& exec) {
  const PassArgs none{};
  auto stage = [&](StageId id, const PassArgs& pass) { return exec.Stage(id, batch.Items(id), pass); };
  const bool tiles = batch.params().match_tiles != 0;
  absl::Status status = stage(StageId::kInit, none);
  for (int32_t p = 0; status.ok() && p <= batch.last_pass(); ++p) {
    const PassArgs pass = batch.Pass(p);
    if (status.ok()) status = stage(StageId::kSetup, pass);
    if (tiles) {  // the tile match resolves each source's edge in the same launch
      if (status.ok()) status = stage(StageId::kMatchTiles, pass);
    } else {
      if (status.ok()) status = stage(StageId::kNormalize, pass);
      if (status.ok()) status = stage(StageId::kMatch, pass);
    }
    if (status.ok()) status = stage(StageId::kSelect, pass);
    if (status.ok()) status = exec.Sort();
    if (status.ok() && pass.sink_output != 0) status = stage(StageId::kOffsets, pass);
    for (StageId id : {StageId::kMarkKept, StageId::kIndexCount, StageId::kIndexPrefix,
                       StageId::kIndex, StageId::kBucket, StageId::kMerge, StageId::kOwner,
                       StageId::kFinish}) {
      if (status.ok()) status = stage(id, pass);
    }
  }
  for (StageId id : {StageId::kOffsets, StageId::kEmit}) {
    if (status.ok()) status = stage(id, none);
  }
  return status;
}

}  // namespace centroidkv::cuda
