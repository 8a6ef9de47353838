// The protocol codec, part 1: the per-job messages that are not tensor bytes (StartJob,
// the JobResult header, JobError) in domain terms, both ways. The server and every C++
// client use these and only these, so the two ends cannot drift apart. Tensor bytes travel
// as slabs (slab_codec.h). Thread-safe: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/compress_result.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/types/layer_view.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv {

// Everything a StartJob announces about one layer job, in domain terms.
struct JobAnnouncement {
  uint64_t job_id = 0;
  uint32_t layer_index = 0;
  // The input's shape; its data pointers are null. Ragged: head_offsets (below) per head.
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kHeadMajor;
  int32_t num_heads = 0;
  int32_t num_tokens = 0;  // the longest head when ragged
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  std::vector<int64_t> head_offsets;  // [H + 1] when ragged, else empty
  bool has_counts = false;
  bool has_scores = false;          // a scored job: TENSOR_SCORES follows
  int32_t num_query_heads = 0;      // a fitted job: TENSOR_QUERIES [Hq, m, dk] follows
  int32_t num_queries = 0;
  std::vector<float> key_scales;    // fp8 input: 1 or H entries each, else empty
  std::vector<float> value_scales;
  // options.compute_assignment = return_assignment; for an fp8 output_dtype,
  // options.result_dtype = output_dtype and its result scales (output_*_scales).
  CompressOptions options;
  DType output_dtype = DType::kFloat32;
  BackendKind backend = BackendKind::kAuto;
  std::chrono::milliseconds timeout{0};  // zero: none
  int32_t priority = 0;

  // The shape as a LayerView over `keys`, `values`, `counts` (counts null unless
  // has_counts), `scores` (null unless has_scores) and `queries` (null without query
  // heads; the view has their shape either way); head_offsets and the scales point into
  // this object, which must outlive the view.
  LayerView View(const void* keys, const void* values, const uint32_t* counts,
                 const float* scores = nullptr, const float* queries = nullptr) const;
};

// A client's StartJob. `layer` gives the shape (ragged when head_offsets is set) and whether
// counts go along; `output_dtype` unset = the input's dtype.
v1::StartJob StartJobToProto(uint64_t job_id, uint32_t layer_index, const LayerView& layer,
                             const CompressOptions& options, std::optional<DType> output_dtype,
                             BackendKind backend, std::chrono::milliseconds timeout,
                             int32_t priority);

// The server's reading of a StartJob: every field checked for what the wire alone can say
// (known enums, dims that fit, head_tokens consistent); errors are INVALID_ARGUMENT located
// at the field ("start_job.head_tokens", head h). Range checks of the parameters against a
// layer are the engine's (ValidateJobShape), so that remote and in-process calls agree.
absl::StatusOr<JobAnnouncement> StartJobFromProto(const v1::StartJob& start);

// The bytes of a layer job's input tensors, in the order they travel.
struct InputBytes {
  uint64_t keys = 0;
  uint64_t values = 0;
  uint64_t counts = 0;   // zero without counts
  uint64_t scores = 0;   // zero without scores
  uint64_t queries = 0;  // zero without reference queries
  uint64_t total() const { return keys + values + counts + scores + queries; }
};
// Of a layer whose data pointers say which tensors it has (counts, scores, queries).
InputBytes InputBytesOf(const LayerView& layer);
// Of an announced job (its flags say which tensors follow).
InputBytes InputBytesOf(const JobAnnouncement& job);

// The bytes of a result's output tensors, in the order they travel.
struct ResultBytes {
  uint64_t keys = 0;
  uint64_t values = 0;
  uint64_t counts = 0;
  uint64_t log_weights = 0;  // fitted jobs
  uint64_t assignment = 0;
  uint64_t total() const { return keys + values + counts + log_weights + assignment; }
};
// Of an engine result whose rows go out in `output_dtype`.
ResultBytes ResultBytesOf(const CompressResult& result, DType output_dtype);
// As a JobResult header announces them.
ResultBytes ResultBytesOf(const v1::JobResult& header);

// The worst case of a result's bytes for a job of this shape (every entry kept, each head
// padded to the longest or to pad_to; log-weights where the shape has query heads): what a
// server reserves for it before it runs.
uint64_t MaxResultBytes(const LayerView& shape, const CompressOptions& options,
                        DType output_dtype);
// The same per tensor: what a result written to shared memory needs of each span.
ResultBytes MaxResultTensorBytes(const LayerView& shape, const CompressOptions& options,
                                 DType output_dtype);

// Where a result came from and how long it took, for its header.
struct ResultProvenance {
  std::string backend;  // the engine's name
  double queue_seconds = 0.0;
  double compute_seconds = 0.0;
};

// The JobResult header of `result`, whose rows go out in `output_dtype`.
v1::JobResult JobResultHeaderToProto(uint64_t job_id, uint32_t layer_index,
                                     const CompressResult& result, DType output_dtype,
                                     const ResultProvenance& provenance);

// A header read back: `result` gets the shape, offsets, passes and the honest account, with
// its row arrays left empty (the slabs fill them); `provenance` what the server reported.
// A dtype the header does not name (a newer server) is DATA_LOSS.
absl::Status JobResultHeaderFromProto(const v1::JobResult& header, CompressResult* result,
                                      ResultProvenance* provenance);

// A job's failure on the wire: the code (checked, ToWireCode), the message and, when the
// status carries a FieldLocation, the field as the wire spells it (WireField), head, token.
v1::JobError JobErrorToProto(uint64_t job_id, const absl::Status& status);
// ... and back: the code checked (FromWireCode) and the location restored.
absl::Status StatusFromJobError(const v1::JobError& error);

}  // namespace centroidkv
