// One CUDA stream with the buffers it reuses from batch to batch (device workspace, pinned
// host staging), running a batch of layer jobs in steps: Prepare (plan, size and reserve
// memory), Upload (stage the inputs in pinned memory, copy them to the device), Compute (every
// stage of every pass, queued on the stream without waiting), Finish (download the lengths,
// then the packed result; fill each job's CompressResult). Run() does all four. CudaEngine's
// workers use Run(); the GPU benchmark times the steps one by one.
// Thread-compatible: one thread uses a StreamWorker at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/layer_batch.h"

namespace centroidkv::cuda {

// A device (or pinned host) block that grows on demand and is reused.
class CudaBlock {
 public:
  explicit CudaBlock(bool pinned) : pinned_(pinned) {}
  ~CudaBlock() { Release(); }
  CudaBlock(const CudaBlock&) = delete;
  CudaBlock& operator=(const CudaBlock&) = delete;

  // RESOURCE_EXHAUSTED when the memory is not there.
  absl::Status Reserve(size_t bytes);
  void* data() const { return data_; }
  char* bytes() const { return static_cast<char*>(data_); }

 private:
  void Release();

  bool pinned_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class StreamWorker {
 public:
  StreamWorker() = default;
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Creates the stream on `device`; its batches match with `match`.
  absl::Status Init(int32_t device, MatchKernel match = MatchKernel::kTiles);

  // The four steps for jobs that CanBatch together.
  absl::Status Run(std::span<const BatchJob> jobs);

  absl::Status Prepare(std::span<const BatchJob> jobs);
  absl::Status Upload();
  absl::Status Compute();
  absl::Status Finish();

  // Compute() once more with every launch between two CUDA events, then waits: seconds per
  // stage name (summed over passes), in the order the stages first ran. For benchmarks.
  absl::StatusOr<std::vector<std::pair<std::string, double>>> ProfileCompute();

  cudaStream_t stream() const { return stream_; }

 private:
  int32_t device_ = 0;
  MatchKernel match_ = MatchKernel::kTiles;
  cudaStream_t stream_ = nullptr;
  std::optional<LayerBatch> batch_;
  size_t sort_bytes_ = 0;
  CudaBlock d_input_{false}, d_work_{false}, d_small_{false}, d_owner_{false}, d_packed_{false},
      d_sort_{false};
  CudaBlock h_input_{true}, h_small_{true}, h_owner_{true}, h_packed_{true};
};

}  // namespace centroidkv::cuda
