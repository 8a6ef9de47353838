// The kMatchTiles kernel (tile_match.h): blocks of kTileWarps warps, each running
// TileMatchBlock for one (head, chunk, source tile) after another, and its launcher.
#include <algorithm>

#include "kernels/cuda/layer_kernels.h"
#include "kernels/cuda/tile_match.h"

namespace centroidkv::cuda {
namespace {

constexpr int kTileThreads = kTileWarps * 32;
// Enough blocks for every multiprocessor several times over; more items loop.
constexpr int64_t kMaxTileBlocks = 132 * 16;

__global__ void __launch_bounds__(kTileThreads)
    TileMatchKernel(const BatchParams params, const BatchArrays arrays, const PassArgs pass,
                    int64_t items) {
  extern __shared__ __align__(128) char smem[];
  const auto warp = static_cast<int32_t>(threadIdx.x / 32);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {  // block-uniform
    TileMatchBlock(params, arrays, pass, item, smem, warp, kTileWarps);
    __syncthreads();  // the next item reuses the shared memory
  }
}

}  // namespace

cudaError_t LaunchTileMatch(const BatchParams& params, const BatchArrays& arrays,
                            const PassArgs& pass, cudaStream_t stream) {
  const int64_t items = TileMatchItems(params);
  if (items <= 0) return cudaSuccess;
  const int bytes = MakeTileLayout(params.key_dim).bytes;
  cudaError_t status = cudaFuncSetAttribute(
      TileMatchKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status != cudaSuccess) return status;
  const auto blocks = static_cast<unsigned>(std::min(items, kMaxTileBlocks));
  TileMatchKernel<<<blocks, kTileThreads, static_cast<size_t>(bytes), stream>>>(params, arrays,
                                                                                pass, items);
  return cudaPeekAtLastError();
}

}  // namespace centroidkv::cuda
