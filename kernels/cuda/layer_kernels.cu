// The stage kernels: one thin __global__ entry per stage of layer_stages.h, each a
// grid-stride loop over the stage's items, and the launcher that picks it.
#include "kernels/cuda/layer_kernels.h"

#include <algorithm>

namespace centroidkv::cuda {
namespace {

constexpr int kBlockThreads = 256;
// Enough blocks to fill any current GPU several times over; larger stages loop.
constexpr int64_t kMaxBlocks = 132 * 64;

/// @param[in] params  the batch's shape and options
/// @param[in,out] arrays  device arrays (layer_stages.h documents each one's size)
/// @param[in] pass  this pass's floor and sink
/// @param[in] items  the stage's item count
// Threads that share one item: a warp for warp stages (layer_stages.h), else one thread.
template <StageId kStage>
constexpr int kThreadsPerItem = IsWarpStage(kStage) ? 32 : 1;

template <StageId kStage>
__global__ void __launch_bounds__(kBlockThreads)
    StageKernel(const BatchParams params, const BatchArrays arrays, const PassArgs pass,
                int64_t items) {
  constexpr int kShare = kThreadsPerItem<kStage>;
  // Every lane of a warp has the same item (warp stages), so the loop is warp-uniform.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / kShare;
  for (int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kShare;
       item < items; item += stride) {
    RunStageItem(kStage, params, arrays, pass, item);
  }
}

template <StageId kStage>
cudaError_t Launch(const BatchParams& params, const BatchArrays& arrays, const PassArgs& pass,
                   int64_t items, cudaStream_t stream) {
  if (items <= 0) return cudaSuccess;
  const int64_t threads = items * kThreadsPerItem<kStage>;
  const int64_t blocks = std::min<int64_t>((threads + kBlockThreads - 1) / kBlockThreads, kMaxBlocks);
  StageKernel<kStage><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(params, arrays,
                                                                                  pass, items);
  return cudaPeekAtLastError();
}

}  // namespace

cudaError_t LaunchStage(StageId id, const BatchParams& params, const BatchArrays& arrays,
                        const PassArgs& pass, int64_t items, cudaStream_t stream) {
  switch (id) {
    case StageId::kInit: return Launch<StageId::kInit>(params, arrays, pass, items, stream);
    case StageId::kSetup: return Launch<StageId::kSetup>(params, arrays, pass, items, stream);
    case StageId::kNormalize:
      return Launch<StageId::kNormalize>(params, arrays, pass, items, stream);
    case StageId::kMatch: return Launch<StageId::kMatch>(params, arrays, pass, items, stream);
    case StageId::kSelect: return Launch<StageId::kSelect>(params, arrays, pass, items, stream);
    case StageId::kMarkKept:
      return Launch<StageId::kMarkKept>(params, arrays, pass, items, stream);
    case StageId::kIndexCount:
      return Launch<StageId::kIndexCount>(params, arrays, pass, items, stream);
    case StageId::kIndexPrefix:
      return Launch<StageId::kIndexPrefix>(params, arrays, pass, items, stream);
    case StageId::kIndex: return Launch<StageId::kIndex>(params, arrays, pass, items, stream);
    case StageId::kBucket: return Launch<StageId::kBucket>(params, arrays, pass, items, stream);
    case StageId::kMerge: return Launch<StageId::kMerge>(params, arrays, pass, items, stream);
    case StageId::kOwner: return Launch<StageId::kOwner>(params, arrays, pass, items, stream);
    case StageId::kFinish: return Launch<StageId::kFinish>(params, arrays, pass, items, stream);
    case StageId::kEmit: return Launch<StageId::kEmit>(params, arrays, pass, items, stream);
    case StageId::kOffsets: return Launch<StageId::kOffsets>(params, arrays, pass, items, stream);
    case StageId::kMatchTiles: return LaunchTileMatch(params, arrays, pass, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace centroidkv::cuda
