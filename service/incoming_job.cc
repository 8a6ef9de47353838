// IncomingJob: a StartJob checked against the limits, and its input buffers.
#include "service/incoming_job.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/wire/region_codec.h"
#include "centroidkv/wire/wire_convert.h"

namespace centroidkv::service {
namespace {

// An engine error (fields named the engine's way) with the wire's field name and prefix.
absl::Status FromEngine(const absl::Status& status) {
  std::optional<FieldLocation> location = GetFieldLocation(status);
  if (!location.has_value()) return WithPrefix(status, "start_job: ");
  location->field = WireField(location->field);
  return FieldError(status.code(), *location, absl::StrCat("start_job: ", status.message()));
}

// The copies a job makes above the backend: for fp8, the widened input and the float result
// rows before they are quantised (kernels/fp8_rows.h); for budgeted heads, the float rows
// gathered per head and stitched (kernels/budgeted_heads.h); for a fit, each head's input
// and rows in float64 and its queries' features (kernels/fit/). Part of the job's
// footprint, so that these jobs stay within the server's memory bound too.
uint64_t StagingBytes(const LayerView& shape, const CompressOptions& options,
                      DType output_dtype, bool scored) {
  const uint64_t row_floats = uint64_t(shape.key_dim) + uint64_t(shape.value_dim);
  const uint64_t rows = uint64_t(shape.TotalRows());
  uint64_t bytes = 0;
  if (IsFp8(shape.dtype)) bytes += rows * row_floats * sizeof(float);
  const ResultBytes result_rows = MaxResultTensorBytes(shape, options, DType::kFloat32);
  if (IsFp8(output_dtype)) bytes += result_rows.keys + result_rows.values;
  if (scored || !options.head_budgets.empty()) {
    bytes += 2 * (result_rows.keys + result_rows.values) + rows * 2 * sizeof(int32_t);
  }
  if (shape.num_query_heads > 0) {
    const uint64_t group_queries = uint64_t(shape.QueryGroup()) * uint64_t(shape.num_queries);
    bytes += rows * (row_floats + group_queries + 4) * sizeof(double) +
             result_rows.keys + result_rows.values;
  }
  return bytes;
}

PooledInput Allocate(InputPool* inputs, uint64_t size) {
  if (inputs != nullptr) return inputs->Acquire(size);
  return PooledInput(new uint8_t[size], InputReturner{nullptr, size});
}

}  // namespace

absl::StatusOr<std::unique_ptr<IncomingJob>> IncomingJob::Create(const v1::StartJob& start,
                                                                 const ServerOptions& options,
                                                                 InputPool* inputs,
                                                                 const RegionAccess* regions) {
  absl::StatusOr<JobAnnouncement> announced = StartJobFromProto(start);
  if (!announced.ok()) return announced.status();
  std::unique_ptr<IncomingJob> job(new IncomingJob());
  job->job_ = *std::move(announced);
  const JobAnnouncement& spec = job->job_;
  if (spec.timeout.count() > 0) job->deadline_ = std::chrono::steady_clock::now() + spec.timeout;

  // The shape alone first, before any data arrives.
  const LayerView shape = spec.View(nullptr, nullptr, nullptr);
  if (absl::Status checked = ValidateJobShape(shape, spec.options, options.engine_limits);
      !checked.ok()) {
    return FromEngine(checked);
  }
  InputBytes bytes = InputBytesOf(spec);
  if (bytes.total() > options.max_job_bytes) {
    return FieldError(absl::StatusCode::kResourceExhausted, {"start_job.num_tokens"},
                      absl::StrCat("start_job: the job's input is ", bytes.total(),
                                   " bytes, above the server's max_job_bytes ",
                                   options.max_job_bytes,
                                   "; split the layer or raise --max-job-bytes"));
  }
  absl::StatusOr<JobRegions> spans = JobRegionsFromProto(start, spec);
  if (!spans.ok()) return spans.status();
  if (spans->any()) {
    if (regions == nullptr || regions->table == nullptr) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition,
          {spans->input.has_value() ? "start_job.region_input" : "start_job.region_output"},
          "start_job: shared memory regions are not available on this stream (offered only "
          "to clients on the server's unix socket); send the tensors as slabs");
    }
    absl::StatusOr<JobRegionMemory> memory =
        JobRegionMemory::Resolve(*spans, *regions->table, regions->owner_key);
    if (!memory.ok()) return memory.status();
    job->regions_ = *std::move(memory);
    // Keys and values are read in place: only the counts are buffered.
    if (job->regions_->has_input()) bytes.keys = bytes.values = 0;
  }
  job->footprint_bytes_ = bytes.total() + MaxResultBytes(shape, spec.options, spec.output_dtype) +
                          StagingBytes(shape, spec.options, spec.output_dtype, spec.has_scores);
  job->inputs_ = inputs;
  job->bytes_ = bytes;
  job->view_ = shape;
  job->MakeAssembler();
  return job;
}

void IncomingJob::AllocateInput() {
  if (allocated_) return;
  allocated_ = true;
  keys_ = Allocate(inputs_, bytes_.keys);
  values_ = Allocate(inputs_, bytes_.values);
  counts_ = Allocate(inputs_, bytes_.counts);
  scores_ = Allocate(inputs_, bytes_.scores);
  queries_ = Allocate(inputs_, bytes_.queries);
  const auto* counts = reinterpret_cast<const uint32_t*>(counts_.get());
  const auto* scores = reinterpret_cast<const float*>(scores_.get());
  const auto* queries = reinterpret_cast<const float*>(queries_.get());
  view_ = job_.View(keys_.get(), values_.get(), counts, scores, queries);
  if (regions_.has_value() && regions_->has_input()) {
    if (regions_->counts().has_value()) {
      std::memcpy(counts_.get(), regions_->counts()->data, bytes_.counts);
    }
    view_ = job_.View(regions_->keys().data, regions_->values().data, counts, scores, queries);
  }
  MakeAssembler();  // no slab has arrived yet: AddSlab allocates first
}

void IncomingJob::MakeAssembler() {
  std::vector<SlabAssembler::Tensor> tensors;
  // In shared memory, keys, values and counts are read in place; scores and queries
  // always come as slabs.
  if (!regions_.has_value() || !regions_->has_input()) {
    tensors.push_back({v1::TENSOR_KEYS, keys_.get(), bytes_.keys, "keys"});
    tensors.push_back({v1::TENSOR_VALUES, values_.get(), bytes_.values, "values"});
    if (job_.has_counts) {
      tensors.push_back({v1::TENSOR_COUNTS, counts_.get(), bytes_.counts, "counts"});
    }
  }
  if (job_.has_scores) {
    tensors.push_back({v1::TENSOR_SCORES, scores_.get(), bytes_.scores, "scores"});
  }
  if (job_.num_query_heads > 0) {
    tensors.push_back({v1::TENSOR_QUERIES, queries_.get(), bytes_.queries, "queries"});
  }
  slabs_.emplace(job_.job_id, std::move(tensors));
}

}  // namespace centroidkv::service
