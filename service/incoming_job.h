// One layer job being received on a Compress stream: the StartJob checked and translated
// into engine terms, and the buffers its slabs are assembled into. Slabs of a tensor must
// arrive in order (each starts where the previous one ended). Errors name the wire field.
// Thread-compatible: owned by one stream, handed to one worker task when complete.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/engine_factory.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "service/server_options.h"

namespace centroidkv::service {

// The most bytes of freed input buffers the process keeps for reuse (default 512 MiB).
// Process-wide; a server sets it to at most its --max-total-bytes, so idle inputs add at
// most one budget's worth to its memory.
constexpr uint64_t kDefaultIdleInputBytes = uint64_t{512} << 20;
void SetIdleInputBytesLimit(uint64_t bytes);

// Returns a job's input buffer of `size` bytes to the pool (incoming_job.cc).
struct InputBufferDeleter {
  uint64_t size = 0;
  void operator()(uint8_t* bytes) const;
};

class IncomingJob {
 public:
  // Validates `start` (dtype, layout, dims, parameters, size limits). RESOURCE_EXHAUSTED
  // when the job exceeds max_job_bytes. Allocates nothing big: a job waiting for the memory
  // budget holds no input buffer.
  static absl::StatusOr<std::unique_ptr<IncomingJob>> Create(const v1::StartJob& start,
                                                             const ServerOptions& options);
  // Takes the input buffers (from the pool of freed ones); the stream calls it once the
  // job's footprint is reserved. AddSlab calls it too if it has not run. Idempotent.
  void AllocateInput();

  // Copies one slab into place. FAILED_PRECONDITION for an overlap or a gap (framing: the
  // stream ends), INVALID_ARGUMENT naming slab.tensor / slab.data for a tensor the job does
  // not have or bytes past the tensor's end (the job fails, the stream goes on).
  absl::Status AddSlab(const v1::TensorSlab& slab);

  bool complete() const;
  // The input tensors still short of bytes, e.g. "TENSOR_VALUES (0 of 4096 bytes)".
  std::string MissingTensors() const;
  // The first of them as a JobError field: "keys", "values" or "counts".
  const char* FirstMissingField() const;
  int32_t priority() const { return priority_; }
  // From StartJob.timeout_ms, counted from Create(); nullopt = none.
  std::optional<std::chrono::steady_clock::time_point> deadline() const { return deadline_; }
  uint64_t job_id() const { return job_id_; }
  uint32_t layer_index() const { return layer_index_; }
  BackendKind backend() const { return backend_; }
  DType output_dtype() const { return output_dtype_; }
  const CompressOptions& options() const { return options_; }
  // Input bytes plus the most the result can take: what the stream reserves for this job.
  uint64_t footprint_bytes() const { return footprint_bytes_; }
  // Borrowed view of the assembled input (its tensors null before AllocateInput); valid
  // while this object lives.
  const LayerView& view() const { return view_; }

 private:
  // Input bytes come from a small process-wide pool of freed input buffers (exact sizes: the
  // layers of a model share a shape) and are not zero-filled: every byte is written by a
  // slab before the job is complete. Zeroing and faulting in fresh buffers per job was
  // ~10-30% of a server's CPU samples (docs/service-bench.md).
  struct TensorBuffer {
    std::unique_ptr<uint8_t[], InputBufferDeleter> bytes;
    uint64_t size = 0;
    uint64_t received = 0;
    void Allocate(uint64_t n);
  };
  IncomingJob() = default;
  TensorBuffer* BufferFor(v1::Tensor tensor);

  uint64_t job_id_ = 0;
  uint32_t layer_index_ = 0;
  BackendKind backend_ = BackendKind::kAuto;
  DType output_dtype_ = DType::kFloat32;
  CompressOptions options_;
  bool has_counts_ = false;
  int32_t priority_ = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  std::vector<int64_t> head_offsets_;  // ragged input: [H + 1], view_.head_offsets
  TensorBuffer keys_, values_, counts_;  // sizes set by Create, bytes by AllocateInput
  bool allocated_ = false;
  uint64_t footprint_bytes_ = 0;
  LayerView view_;
};

// Worst-case bytes of a job's result (every entry kept, padded as asked), for the stream's
// reservation.
uint64_t MaxResultBytes(const LayerView& shape, const CompressOptions& options,
                        DType output_dtype);

}  // namespace centroidkv::service
