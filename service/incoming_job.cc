// StartJob validation and in-order slab assembly.
#include "service/incoming_job.h"

#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/wire/wire_convert.h"

namespace centroidkv::service {
namespace {

absl::StatusOr<int32_t> Dim(uint32_t value, const char* field) {
  if (value == 0) {
    return absl::InvalidArgumentError(absl::StrCat("start_job.", field, " must be positive"));
  }
  if (value > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("start_job.", field, " is too large"));
  }
  return static_cast<int32_t>(value);
}

std::string TensorName(v1::Tensor tensor) { return v1::Tensor_Name(tensor); }

// Freed input buffers kept for the next job of the same size. Bounded: buffers under
// kMinPooled bytes are not kept (the heap serves them well), and at most kMaxRetained bytes
// are held idle. Thread-safe.
class InputBufferPool {
 public:
  static constexpr uint64_t kMinPooled = uint64_t{1} << 20;
  static constexpr uint64_t kMaxRetained = uint64_t{512} << 20;

  static InputBufferPool& Get() {
    static InputBufferPool* const pool = new InputBufferPool();  // never destroyed
    return *pool;
  }
  uint8_t* Take(uint64_t size) {
    if (size >= kMinPooled) {
      // The most recently freed buffer of the size first: its pages are likely still cached.
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
        if (it->first == size) {
          uint8_t* bytes = it->second;
          free_.erase(std::next(it).base());
          retained_ -= size;
          return bytes;
        }
      }
    }
    return new uint8_t[size];  // default-initialised: not zeroed
  }
  void Give(uint8_t* bytes, uint64_t size) {
    if (size >= kMinPooled) {
      std::lock_guard<std::mutex> lock(mu_);
      if (retained_ + size > kMaxRetained && !free_.empty()) {
        // Make room by dropping the oldest buffer (a shape not seen lately).
        retained_ -= free_.front().first;
        delete[] free_.front().second;
        free_.erase(free_.begin());
      }
      if (retained_ + size <= kMaxRetained) {
        free_.emplace_back(size, bytes);
        retained_ += size;
        return;
      }
    }
    delete[] bytes;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint8_t*>> free_;  // oldest first
  uint64_t retained_ = 0;
};

}  // namespace

void InputBufferDeleter::operator()(uint8_t* bytes) const {
  InputBufferPool::Get().Give(bytes, size);
}

void IncomingJob::TensorBuffer::Allocate(uint64_t n) {
  bytes = std::unique_ptr<uint8_t[], InputBufferDeleter>(InputBufferPool::Get().Take(n),
                                                         InputBufferDeleter{n});
  size = n;
}

uint64_t MaxResultBytes(const LayerView& shape, DType output_dtype, bool with_assignment) {
  const uint64_t rows = uint64_t(shape.num_heads) * uint64_t(shape.num_tokens);
  uint64_t bytes = rows * (uint64_t(shape.key_dim) + shape.value_dim) * DTypeSize(output_dtype);
  bytes += rows * sizeof(uint32_t);  // counts
  if (with_assignment) bytes += rows * sizeof(int32_t);
  return bytes;
}

absl::StatusOr<std::unique_ptr<IncomingJob>> IncomingJob::Create(const v1::StartJob& start,
                                                                 const ServerOptions& options) {
  std::unique_ptr<IncomingJob> job(new IncomingJob());
  job->job_id_ = start.job_id();
  job->layer_index_ = start.layer_index();
  job->has_counts_ = start.has_counts();

  LayerView& view = job->view_;
  CKV_ASSIGN_OR_RETURN(view.dtype, DTypeFromProto(start.dtype(), "start_job.dtype"));
  CKV_ASSIGN_OR_RETURN(view.layout, LayoutFromProto(start.layout()));
  CKV_ASSIGN_OR_RETURN(view.num_heads, Dim(start.num_heads(), "num_heads"));
  CKV_ASSIGN_OR_RETURN(view.num_tokens, Dim(start.num_tokens(), "num_tokens"));
  CKV_ASSIGN_OR_RETURN(view.key_dim, Dim(start.key_dim(), "key_dim"));
  CKV_ASSIGN_OR_RETURN(view.value_dim, Dim(start.value_dim(), "value_dim"));
  job->output_dtype_ = view.dtype;
  if (start.output_dtype() != v1::DTYPE_UNSPECIFIED) {
    CKV_ASSIGN_OR_RETURN(job->output_dtype_,
                         DTypeFromProto(start.output_dtype(), "start_job.output_dtype"));
  }
  CKV_ASSIGN_OR_RETURN(job->backend_, BackendFromProto(start.backend()));
  CKV_ASSIGN_OR_RETURN(job->options_, OptionsFromProto(start.params()));
  job->options_.compute_assignment = start.return_assignment();
  {
    absl::Status shape_status =
        ValidateJobShape(view, job->options_, options.engine_limits);
    if (!shape_status.ok()) {
      return absl::Status(shape_status.code(),
                          absl::StrCat("start_job: ", shape_status.message()));
    }
  }

  const uint64_t rows = uint64_t(view.num_heads) * uint64_t(view.num_tokens);
  const uint64_t key_bytes = rows * view.key_dim * DTypeSize(view.dtype);
  const uint64_t value_bytes = rows * view.value_dim * DTypeSize(view.dtype);
  const uint64_t count_bytes = job->has_counts_ ? rows * sizeof(uint32_t) : 0;
  const uint64_t input_bytes = key_bytes + value_bytes + count_bytes;
  if (input_bytes > options.max_job_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "start_job: the job's input is ", input_bytes, " bytes, above the server's max_job_bytes ",
        options.max_job_bytes, "; split the layer or raise --max-job-bytes"));
  }
  job->footprint_bytes_ =
      input_bytes + MaxResultBytes(view, job->output_dtype_, start.return_assignment());

  job->keys_.Allocate(key_bytes);
  job->values_.Allocate(value_bytes);
  job->counts_.Allocate(count_bytes);
  view.keys = job->keys_.bytes.get();
  view.values = job->values_.bytes.get();
  view.counts = job->has_counts_ ? reinterpret_cast<const uint32_t*>(job->counts_.bytes.get())
                                 : nullptr;
  return job;
}

IncomingJob::TensorBuffer* IncomingJob::BufferFor(v1::Tensor tensor) {
  switch (tensor) {
    case v1::TENSOR_KEYS:
      return &keys_;
    case v1::TENSOR_VALUES:
      return &values_;
    case v1::TENSOR_COUNTS:
      return has_counts_ ? &counts_ : nullptr;
    default:
      return nullptr;
  }
}

absl::Status IncomingJob::AddSlab(const v1::TensorSlab& slab) {
  TensorBuffer* buffer = BufferFor(slab.tensor());
  if (buffer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab.tensor ", TensorName(slab.tensor()), " is not an input of job ", job_id_,
        slab.tensor() == v1::TENSOR_COUNTS ? " (its start_job did not set has_counts)" : ""));
  }
  const uint64_t size = buffer->size;
  if (slab.byte_offset() < buffer->received) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slab.byte_offset ", slab.byte_offset(), " of ", TensorName(slab.tensor()), " for job ",
        job_id_, " overlaps bytes already received (next expected offset ", buffer->received,
        ")"));
  }
  if (slab.byte_offset() > buffer->received) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slab.byte_offset ", slab.byte_offset(), " of ", TensorName(slab.tensor()), " for job ",
        job_id_, " leaves a gap (next expected offset ", buffer->received, ")"));
  }
  if (slab.data().size() > size - buffer->received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab.data of ", TensorName(slab.tensor()), " for job ", job_id_, " runs to byte ",
        buffer->received + slab.data().size(), ", past the tensor's ", size,
        " bytes (byte-length mismatch with the shape in start_job)"));
  }
  if (slab.data().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slab.data for job ", job_id_, " is empty"));
  }
  std::memcpy(buffer->bytes.get() + buffer->received, slab.data().data(), slab.data().size());
  buffer->received += slab.data().size();
  return absl::OkStatus();
}

bool IncomingJob::complete() const {
  return keys_.received == keys_.size && values_.received == values_.size &&
         counts_.received == counts_.size;
}

}  // namespace centroidkv::service
