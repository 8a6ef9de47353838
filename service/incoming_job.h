// One layer job being received on a Compress stream: its StartJob read by the codec
// (StartJobFromProto) and checked against the engine's and the server's limits, and the
// input buffers its slabs are assembled into (SlabAssembler: in order, errors name the wire
// field). A job by reference to shared memory (StartJob.region_input / region_output) reads
// its keys and values in place from the client's region instead (only its counts are
// copied: the engine sizes its result by them, so the client must not change them mid-job)
// and is complete at once (a scored or fitted job once its scores and queries arrive: they
// always come as slabs). Thread-compatible: owned by one stream, handed to one worker task
// when complete.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "centroidkv/wire/job_codec.h"
#include "centroidkv/wire/slab_codec.h"
#include "service/input_pool.h"
#include "service/server_options.h"
#include "service/shm/job_regions.h"
#include "service/shm/region_table.h"

namespace centroidkv::service {

class IncomingJob {
 public:
  // Validates `start` (dtype, layout, dims, parameters, size limits). RESOURCE_EXHAUSTED
  // when the job exceeds max_job_bytes. Allocates nothing big: a job waiting for the memory
  // budget holds no input buffer. `inputs` (null: the heap) serves AllocateInput.
  // `regions`: the stream's owner of shared memory regions, and the table (null: none
  // on this stream; a StartJob naming regions is then FAILED_PRECONDITION).
  struct RegionAccess {
    const RegionTable* table = nullptr;
    std::string owner_key;
  };
  static absl::StatusOr<std::unique_ptr<IncomingJob>> Create(
      const v1::StartJob& start, const ServerOptions& options, InputPool* inputs = nullptr,
      const RegionAccess* regions = nullptr);
  // Takes the input buffers; the stream calls it once the job's footprint is reserved.
  // AddSlab calls it too if it has not run. Idempotent.
  void AllocateInput();

  // Copies one slab into place (SlabAssembler::Add: FAILED_PRECONDITION for an overlap or a
  // gap ends the stream; INVALID_ARGUMENT naming slab.tensor / slab.data fails the job).
  absl::Status AddSlab(const v1::TensorSlab& slab) {
    AllocateInput();
    return slabs_->Add(slab);
  }

  bool complete() const { return slabs_->complete(); }
  // The input tensors still short of bytes, e.g. "TENSOR_VALUES (0 of 4096 bytes)".
  std::string MissingTensors() const { return slabs_->MissingTensors(); }
  // The first of them as a JobError field: "keys", "values", "counts", "scores", "queries".
  const char* FirstMissingField() const { return slabs_->FirstMissingField(); }
  // Input bytes received so far, and expected in all.
  uint64_t received_bytes() const { return slabs_->received_bytes(); }
  uint64_t input_bytes() const { return slabs_->total_bytes(); }
  int32_t priority() const { return job_.priority; }
  // From StartJob.timeout_ms, counted from Create(); nullopt = none.
  std::optional<std::chrono::steady_clock::time_point> deadline() const { return deadline_; }
  uint64_t job_id() const { return job_.job_id; }
  uint32_t layer_index() const { return job_.layer_index; }
  BackendKind backend() const { return job_.backend; }
  DType output_dtype() const { return job_.output_dtype; }
  const CompressOptions& options() const { return job_.options; }
  // Input bytes plus the most the result can take: what the stream reserves for this job.
  uint64_t footprint_bytes() const { return footprint_bytes_; }
  // Borrowed view of the assembled input (its tensors null before AllocateInput); valid
  // while this object lives.
  const LayerView& view() const { return view_; }
  // The job writes its result to shared memory (region_output) instead of slabs.
  bool writes_to_region() const { return regions_.has_value() && regions_->has_output(); }
  // Where the engine may write the result's rows: the output region's key and value spans.
  std::optional<ResultRowTarget> RowTarget() const {
    return regions_.has_value() ? regions_->RowTarget() : std::nullopt;
  }
  // Copies the result into the output region (writes_to_region()), but for rows the engine
  // wrote there itself.
  absl::Status WriteResultToRegion(const CompressResult& result) const {
    return regions_->WriteResult(result, job_.output_dtype);
  }
  // Shared memory checks (JobRegionMemory): before the engine runs, FAILED_PRECONDITION if
  // a region's file shrank or a region was spoilt since the StartJob arrived; after the job
  // (and its writes to the output region), DATA_LOSS naming the span if a region was
  // truncated meanwhile. OK for a job without regions.
  absl::Status CheckRegionsUsable() const {
    return regions_.has_value() ? regions_->CheckUsable() : absl::OkStatus();
  }
  absl::Status CheckRegionsIntact() const {
    return regions_.has_value() ? regions_->CheckIntact(job_.job_id) : absl::OkStatus();
  }

 private:
  IncomingJob() = default;

  // The assembler over the input buffers (before AllocateInput: over null buffers of the
  // right sizes, which only answer complete() / MissingTensors()).
  void MakeAssembler();

  JobAnnouncement job_;
  InputPool* inputs_ = nullptr;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  InputBytes bytes_;
  bool allocated_ = false;
  PooledInput keys_, values_, counts_, scores_, queries_;
  std::optional<SlabAssembler> slabs_;
  uint64_t footprint_bytes_ = 0;
  LayerView view_;
  std::optional<JobRegionMemory> regions_;  // holds the job's mappings
};

}  // namespace centroidkv::service
