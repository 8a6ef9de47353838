// CUDA runtime errors as absl::Status (never an abort, unlike FAISS's CUDA_VERIFY or ggml's
// CUDA_CHECK): out of device or pinned memory is RESOURCE_EXHAUSTED (that job only); no
// device or no usable driver is FAILED_PRECONDITION; everything else is INTERNAL, naming the
// operation and cudaGetErrorString. Thread-safe: pure functions.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace centroidkv::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace centroidkv::cuda

// Returns from the enclosing function (absl::Status or StatusOr) when `expr` fails.
#define CKV_CUDA_RETURN_IF_ERROR(expr, what)                                   \
  do {                                                                         \
    if (const cudaError_t ckv_cuda_error_ = (expr); ckv_cuda_error_ != cudaSuccess) { \
      return ::centroidkv::cuda::CudaStatus(ckv_cuda_error_, (what));           \
    }                                                                          \
  } while (false)
