// StartJob validation and in-order slab assembly.
#include "service/incoming_job.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/wire/wire_convert.h"

namespace centroidkv::service {
namespace {

absl::StatusOr<int32_t> Dim(uint32_t value, const char* field, bool zero_allowed = false) {
  const std::string name = absl::StrCat("start_job.", field);
  if (value == 0 && !zero_allowed) {
    return InvalidFieldError({name}, absl::StrCat(name, " must be positive"));
  }
  if (value > static_cast<uint32_t>(INT32_MAX)) {
    return InvalidFieldError({name}, absl::StrCat(name, " is too large"));
  }
  return static_cast<int32_t>(value);
}

// `status` located at `field` unless it already names one.
absl::Status Located(const absl::Status& status, const std::string& field) {
  if (status.ok() || GetFieldLocation(status).has_value()) return status;
  return FieldError(status.code(), {field}, status.message());
}

// An engine error (fields named the engine's way) with the wire's field name and prefix.
absl::Status FromEngine(const absl::Status& status) {
  std::optional<FieldLocation> location = GetFieldLocation(status);
  if (!location.has_value()) return WithPrefix(status, "start_job: ");
  location->field = WireField(location->field);
  return FieldError(status.code(), *location, absl::StrCat("start_job: ", status.message()));
}

std::string TensorName(v1::Tensor tensor) { return v1::Tensor_Name(tensor); }

// Freed input buffers kept for the next job of the same size. Bounded: buffers under
// kMinPooled bytes are not kept (the heap serves them well), and at most max_retained_
// bytes are held idle (SetIdleInputBytesLimit). Thread-safe.
class InputBufferPool {
 public:
  static constexpr uint64_t kMinPooled = uint64_t{1} << 20;

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
      while (retained_ + size > max_retained_ && !free_.empty()) {
        // Make room by dropping the oldest buffer (a shape not seen lately).
        retained_ -= free_.front().first;
        delete[] free_.front().second;
        free_.erase(free_.begin());
      }
      if (retained_ + size <= max_retained_) {
        free_.emplace_back(size, bytes);
        retained_ += size;
        return;
      }
    }
    delete[] bytes;
  }
  void SetLimit(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    max_retained_ = bytes;
    while (retained_ > max_retained_ && !free_.empty()) {
      retained_ -= free_.front().first;
      delete[] free_.front().second;
      free_.erase(free_.begin());
    }
  }

 private:
  std::mutex mu_;
  uint64_t max_retained_ = kDefaultIdleInputBytes;
  std::vector<std::pair<uint64_t, uint8_t*>> free_;  // oldest first
  uint64_t retained_ = 0;
};

}  // namespace

void SetIdleInputBytesLimit(uint64_t bytes) { InputBufferPool::Get().SetLimit(bytes); }

void InputBufferDeleter::operator()(uint8_t* bytes) const {
  InputBufferPool::Get().Give(bytes, size);
}

void IncomingJob::TensorBuffer::Allocate(uint64_t n) {
  bytes = std::unique_ptr<uint8_t[], InputBufferDeleter>(InputBufferPool::Get().Take(n),
                                                         InputBufferDeleter{n});
  size = n;
}

uint64_t MaxResultBytes(const LayerView& shape, const CompressOptions& options,
                        DType output_dtype) {
  // Every entry kept, each head padded to the longest (num_tokens) or to pad_to.
  const uint64_t length = std::max<uint64_t>(uint64_t(shape.num_tokens),
                                             uint64_t(std::max(options.pad_to, 0)));
  const uint64_t rows = uint64_t(shape.num_heads) * length;
  uint64_t bytes = rows * (uint64_t(shape.key_dim) + shape.value_dim) * DTypeSize(output_dtype);
  bytes += rows * sizeof(uint32_t);  // counts
  if (options.compute_assignment) bytes += uint64_t(shape.TotalRows()) * sizeof(int32_t);
  return bytes;
}

absl::StatusOr<std::unique_ptr<IncomingJob>> IncomingJob::Create(const v1::StartJob& start,
                                                                 const ServerOptions& options) {
  std::unique_ptr<IncomingJob> job(new IncomingJob());
  job->job_id_ = start.job_id();
  job->layer_index_ = start.layer_index();
  job->has_counts_ = start.has_counts();
  job->priority_ = start.priority();
  if (start.timeout_ms() > 0) {
    job->deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(start.timeout_ms());
  }

  LayerView& view = job->view_;
  {
    absl::StatusOr<DType> dtype = DTypeFromProto(start.dtype(), "start_job.dtype");
    if (!dtype.ok()) return Located(dtype.status(), "start_job.dtype");
    view.dtype = *dtype;
  }
  {
    absl::StatusOr<TensorLayout> layout = LayoutFromProto(start.layout());
    if (!layout.ok()) return Located(layout.status(), "start_job.layout");
    view.layout = *layout;
  }
  const bool ragged = start.head_tokens_size() > 0;
  CKV_ASSIGN_OR_RETURN(view.num_heads, Dim(start.num_heads(), "num_heads"));
  CKV_ASSIGN_OR_RETURN(view.num_tokens, Dim(start.num_tokens(), "num_tokens", ragged));
  CKV_ASSIGN_OR_RETURN(view.key_dim, Dim(start.key_dim(), "key_dim"));
  CKV_ASSIGN_OR_RETURN(view.value_dim, Dim(start.value_dim(), "value_dim"));
  if (ragged) {
    if (static_cast<uint32_t>(start.head_tokens_size()) != start.num_heads()) {
      return InvalidFieldError(
          {"start_job.head_tokens"},
          absl::StrCat("start_job.head_tokens has ", start.head_tokens_size(),
                       " entries; it needs one per head (num_heads ", start.num_heads(), ")"));
    }
    job->head_offsets_.assign(1, 0);
    uint32_t longest = 0;
    for (int32_t h = 0; h < start.head_tokens_size(); ++h) {
      const uint32_t tokens = start.head_tokens(h);
      if (tokens == 0 || tokens > static_cast<uint32_t>(INT32_MAX)) {
        return InvalidFieldError({"start_job.head_tokens", h},
                                 absl::StrCat("start_job.head_tokens of head ", h, " is ",
                                              tokens, "; every head needs at least one entry"));
      }
      longest = std::max(longest, tokens);
      job->head_offsets_.push_back(job->head_offsets_.back() + tokens);
    }
    if (start.num_tokens() != 0 && start.num_tokens() != longest) {
      return InvalidFieldError(
          {"start_job.num_tokens"},
          absl::StrCat("start_job.num_tokens is ", start.num_tokens(),
                       "; with head_tokens it must be 0 or the longest head (", longest, ")"));
    }
    view.num_tokens = static_cast<int32_t>(longest);
    view.head_offsets = job->head_offsets_.data();
  }
  job->output_dtype_ = view.dtype;
  if (start.output_dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<DType> output = DTypeFromProto(start.output_dtype(), "start_job.output_dtype");
    if (!output.ok()) return Located(output.status(), "start_job.output_dtype");
    job->output_dtype_ = *output;
  }
  {
    absl::StatusOr<BackendKind> backend = BackendFromProto(start.backend());
    if (!backend.ok()) return Located(backend.status(), "start_job.backend");
    job->backend_ = *backend;
  }
  {
    absl::StatusOr<CompressOptions> parsed = OptionsFromProto(start.params());
    if (!parsed.ok()) return FromEngine(parsed.status());
    job->options_ = *std::move(parsed);
  }
  job->options_.compute_assignment = start.return_assignment();
  job->options_.pad_heads = start.pad_heads();
  CKV_ASSIGN_OR_RETURN(job->options_.pad_to, Dim(start.pad_to(), "pad_to", true));
  job->options_.exact_target = start.exact_target();
  if (start.output_layout() != v1::LAYOUT_UNSPECIFIED) {
    absl::StatusOr<TensorLayout> layout = LayoutFromProto(start.output_layout());
    if (!layout.ok()) {
      return InvalidFieldError({"start_job.output_layout"},
                               absl::StrCat("start_job.output_layout is ",
                                            static_cast<int>(start.output_layout()),
                                            ", not a known layout"));
    }
    job->options_.output_layout = *layout;
  }
  if (absl::Status shape = ValidateJobShape(view, job->options_, options.engine_limits);
      !shape.ok()) {
    return FromEngine(shape);
  }

  const uint64_t rows = uint64_t(view.TotalRows());
  const uint64_t key_bytes = rows * view.key_dim * DTypeSize(view.dtype);
  const uint64_t value_bytes = rows * view.value_dim * DTypeSize(view.dtype);
  const uint64_t count_bytes = job->has_counts_ ? rows * sizeof(uint32_t) : 0;
  const uint64_t input_bytes = key_bytes + value_bytes + count_bytes;
  if (input_bytes > options.max_job_bytes) {
    return FieldError(absl::StatusCode::kResourceExhausted, {"start_job.num_tokens"},
                      absl::StrCat("start_job: the job's input is ", input_bytes,
                                   " bytes, above the server's max_job_bytes ",
                                   options.max_job_bytes,
                                   "; split the layer or raise --max-job-bytes"));
  }
  job->footprint_bytes_ = input_bytes + MaxResultBytes(view, job->options_, job->output_dtype_);

  job->keys_.size = key_bytes;
  job->values_.size = value_bytes;
  job->counts_.size = count_bytes;
  return job;
}

void IncomingJob::AllocateInput() {
  if (allocated_) return;
  allocated_ = true;
  keys_.Allocate(keys_.size);
  values_.Allocate(values_.size);
  counts_.Allocate(counts_.size);
  view_.keys = keys_.bytes.get();
  view_.values = values_.bytes.get();
  view_.counts = has_counts_ ? reinterpret_cast<const uint32_t*>(counts_.bytes.get()) : nullptr;
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
    return InvalidFieldError({"slab.tensor"}, absl::StrCat(
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
    return InvalidFieldError({"slab.data"}, absl::StrCat(
        "slab.data of ", TensorName(slab.tensor()), " for job ", job_id_, " runs to byte ",
        buffer->received + slab.data().size(), ", past the tensor's ", size,
        " bytes (byte-length mismatch with the shape in start_job)"));
  }
  if (slab.data().empty()) {
    return InvalidFieldError({"slab.data"},
                             absl::StrCat("slab.data for job ", job_id_, " is empty"));
  }
  AllocateInput();
  std::memcpy(buffer->bytes.get() + buffer->received, slab.data().data(), slab.data().size());
  buffer->received += slab.data().size();
  return absl::OkStatus();
}

std::string IncomingJob::MissingTensors() const {
  std::string missing;
  auto note = [&missing](const TensorBuffer& buffer, const char* name) {
    if (buffer.received < buffer.size) {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", name, " (", buffer.received, " of ",
                      buffer.size, " bytes)");
    }
  };
  note(keys_, "TENSOR_KEYS");
  note(values_, "TENSOR_VALUES");
  note(counts_, "TENSOR_COUNTS");
  return missing;
}

const char* IncomingJob::FirstMissingField() const {
  if (keys_.received < keys_.size) return "keys";
  if (values_.received < values_.size) return "values";
  return "counts";
}

bool IncomingJob::complete() const {
  return keys_.received == keys_.size && values_.received == values_.size &&
         counts_.received == counts_.size;
}

}  // namespace centroidkv::service
