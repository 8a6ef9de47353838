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

// The float32 copies an fp8 job makes above the backend (kernels/fp8_rows.h): the widened
// input, and the float result rows before they are quantised. Part of the job's footprint,
// so that fp8 jobs stay within the server's memory bound too.
uint64_t Fp8StagingBytes(const LayerView& shape, const CompressOptions& options,
                         DType output_dtype) {
  const uint64_t row_floats = uint64_t(shape.key_dim) + uint64_t(shape.value_dim);
  uint64_t bytes = 0;
  if (IsFp8(shape.dtype)) bytes += uint64_t(shape.TotalRows()) * row_floats * sizeof(float);
  if (IsFp8(output_dtype)) {
    const ResultBytes rows = MaxResultTensorBytes(shape, options, DType::kFloat32);
    bytes += rows.keys + rows.values;
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
  InputBytes bytes = InputBytesOf(shape);
  if (spec.has_counts) bytes.counts = uint64_t(shape.TotalRows()) * sizeof(uint32_t);
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
                          Fp8StagingBytes(shape, spec.options, spec.output_dtype);
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
  view_ = job_.View(keys_.get(), values_.get(), reinterpret_cast<const uint32_t*>(counts_.get()));
  if (regions_.has_value() && regions_->has_input()) {
    if (regions_->counts().has_value()) {
      std::memcpy(counts_.get(), regions_->counts()->data, bytes_.counts);
    }
    view_ = job_.View(regions_->keys().data, regions_->values().data,
                      reinterpret_cast<const uint32_t*>(counts_.get()));
  }
  MakeAssembler();  // no slab has arrived yet: AddSlab allocates first
}

void IncomingJob::MakeAssembler() {
  if (regions_.has_value() && regions_->has_input()) {
    slabs_.emplace(job_.job_id, std::vector<SlabAssembler::Tensor>{});  // complete: no slabs
    return;
  }
  std::vector<SlabAssembler::Tensor> tensors = {
      {v1::TENSOR_KEYS, keys_.get(), bytes_.keys, "keys"},
      {v1::TENSOR_VALUES, values_.get(), bytes_.values, "values"}};
  if (job_.has_counts) {
    tensors.push_back({v1::TENSOR_COUNTS, counts_.get(), bytes_.counts, "counts"});
  }
  slabs_.emplace(job_.job_id, std::move(tensors));
}

}  // namespace centroidkv::service
