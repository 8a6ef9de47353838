// Entry points of the CUDA backend's device code (ggml's three tiers: the __global__ kernels
// and their launchers live in layer_kernels.cu and segmented_sort.cu; these are the
// launchers, called by cuda_engine.cc). Each takes device pointers (BatchArrays) and a
// stream, queues its work and returns the launch's cudaError_t; none synchronises.
// Include only from the CUDA backend's own sources (it pulls in the CUDA runtime API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/layer_stages.h"

namespace centroidkv::cuda {

// One launch running `items` items of stage `id` (a grid-stride loop over RunStageItem).
cudaError_t LaunchStage(StageId id, const BatchParams& params, const BatchArrays& arrays,
                        const PassArgs& pass, int64_t items, cudaStream_t stream);

// Stage kMatchTiles (tile_match.h): one block per (head, chunk, source tile), tensor cores.
cudaError_t LaunchTileMatch(const BatchParams& params, const BatchArrays& arrays,
                            const PassArgs& pass, cudaStream_t stream);

// Scratch bytes LaunchSegmentedSort needs for a batch of `params`'s shape.
cudaError_t SegmentedSortScratchBytes(const BatchParams& params, size_t* bytes);

// Per head g: slots seg_begin[g] .. seg_end[g] of sort_keys_in / sort_values_in sorted by
// key, descending and stable (CUB DeviceSegmentedSort), into sort_keys_out / sort_values_out.
// `d_scratch` holds SegmentedSortScratchBytes() bytes.
cudaError_t LaunchSegmentedSort(const BatchParams& params, const BatchArrays& arrays,
                                void* d_scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace centroidkv::cuda
