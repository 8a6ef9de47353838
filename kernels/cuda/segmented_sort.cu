// Step 6's ordering on the device: CUB's stable segmented sort of each head's candidate
// keys (OrderKey(score), descending; equal keys keep slot order, i.e. source ascending).
// Alone in its file: CUB's templates are the slowest part of the build.
#include <cub/device/device_segmented_sort.cuh>

#include "kernels/cuda/layer_kernels.h"

namespace centroidkv::cuda {

namespace {

cudaError_t Sort(const BatchParams& params, const BatchArrays& arrays, void* d_scratch,
                 size_t* scratch_bytes, cudaStream_t stream) {
  const int64_t items = params.global_heads() * params.slot_capacity;
  return cub::DeviceSegmentedSort::StableSortPairsDescending(
      d_scratch, *scratch_bytes, arrays.sort_keys_in, arrays.sort_keys_out, arrays.sort_values_in,
      arrays.sort_values_out, items, params.global_heads(), arrays.seg_begin, arrays.seg_end,
      stream);
}

}  // namespace

cudaError_t SegmentedSortScratchBytes(const BatchParams& params, size_t* bytes) {
  *bytes = 0;
  const BatchArrays none{};
  return Sort(params, none, nullptr, bytes, nullptr);
}

cudaError_t LaunchSegmentedSort(const BatchParams& params, const BatchArrays& arrays,
                                void* d_scratch, size_t scratch_bytes, cudaStream_t stream) {
  const cudaError_t error = Sort(params, arrays, d_scratch, &scratch_bytes, stream);
  if (error != cudaSuccess) return error;
  return cudaPeekAtLastError();
}

}  // namespace centroidkv::cuda
