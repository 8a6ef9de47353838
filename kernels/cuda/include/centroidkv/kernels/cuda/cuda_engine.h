// The CUDA backend: SPEC.md section 2 on an NVIDIA GPU, with exactly the reference engine's
// decisions and float64 merge order (kernels/cuda/layer_stages.h says how), behind the
// ClusterEngine interface. No CUDA types here (pimpl, as FAISS's GpuIndexFlat): the service
// and the factory include this header without the CUDA toolkit.
//
// Work: Compress() queues the job and waits. Worker threads, each with its own CUDA stream,
// pinned host buffers and device workspace, take the queue's first job together with every
// queued job that batches with it (same shape and options, up to a size limit) and run them
// as one sequence of launches: upload, every pass on the device without a host round trip,
// one small download of the lengths, then the packed result. With two workers the upload
// and download of one batch overlap the kernels of the next.
//
// Errors: CUDA errors become absl::Status, never an abort; out of memory is
// RESOURCE_EXHAUSTED for the jobs of that batch only (a batch that does not fit is retried
// job by job). Thread-safe: Compress() may be called from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::cuda {

struct CudaEngineOptions {
  int32_t device = 0;            // CUDA device ordinal
  int32_t workers = 2;           // streams (and threads) working on batches concurrently
  int32_t max_batch_jobs = 16;   // jobs per batch at most
  int64_t max_batch_input_bytes = int64_t{1} << 30;  // keys + values of a batch, at most
  // Match on the tensor cores (tile_match.h) where the key dimension allows; false: the warp
  // match on CUDA cores for every batch. The environment variable CKV_CUDA_MATCH=warp sets
  // it to false (scripts/gpu-check.sh runs the suite both ways).
  bool tensor_core_match = true;
};

class CudaEngine final : public ClusterEngine {
 public:
  // FAILED_PRECONDITION ("no CUDA device: ...") when the device cannot be used.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(EngineLimits limits = {},
                                                            CudaEngineOptions options = {});
  ~CudaEngine() override;

  std::string_view name() const override { return device_.backend; }
  // The packed rows are written in the result dtype on the device (half the bytes to write
  // and to download for fp16 / bf16). fp8 rows are quantised above the backend
  // (kernels/fp8_rows.h).
  EngineCaps caps() const override { return {.writes_half_rows = true}; }
  const DeviceInfo& device() const { return device_; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;

 private:
  class Impl;  // queue, workers, streams and buffers (cuda_engine.cc)

  CudaEngine(EngineLimits limits, DeviceInfo device);

  DeviceInfo device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace centroidkv::cuda
