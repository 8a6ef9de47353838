// IncomingJob: a StartJob checked against the limits, and its input buffers.
#include "service/incoming_job.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
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

PooledInput Allocate(InputPool* inputs, uint64_t size) {
  if (inputs != nullptr) return inputs->Acquire(size);
  return PooledInput(new uint8_t[size], InputReturner{nullptr, size});
}

}  // namespace

absl::StatusOr<std::unique_ptr<IncomingJob>> IncomingJob::Create(const v1::StartJob& start,
                                                                 const ServerOptions& options,
                                                                 InputPool* inputs) {
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
  job->footprint_bytes_ =
      bytes.total() + MaxResultBytes(shape, spec.options, spec.output_dtype);

  job->keys_ = Allocate(inputs, bytes.keys);
  job->values_ = Allocate(inputs, bytes.values);
  job->counts_ = Allocate(inputs, bytes.counts);
  job->view_ = spec.View(job->keys_.get(), job->values_.get(),
                         reinterpret_cast<const uint32_t*>(job->counts_.get()));
  std::vector<SlabAssembler::Tensor> tensors = {
      {v1::TENSOR_KEYS, job->keys_.get(), bytes.keys, "keys"},
      {v1::TENSOR_VALUES, job->values_.get(), bytes.values, "values"}};
  if (spec.has_counts) {
    tensors.push_back({v1::TENSOR_COUNTS, job->counts_.get(), bytes.counts, "counts"});
  }
  job->slabs_.emplace(spec.job_id, std::move(tensors));
  return job;
}

}  // namespace centroidkv::service
