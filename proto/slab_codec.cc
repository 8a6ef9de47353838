// SlabWriter and SlabAssembler (slab_codec.h).
#include "centroidkv/wire/slab_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv {

int32_t SlabPayloadBytes(int64_t wanted, int64_t limit) {
  int64_t bytes = wanted;
  if (limit > 0) bytes = std::min(bytes, limit);
  bytes = std::clamp<int64_t>(bytes, 8, INT32_MAX);
  return static_cast<int32_t>(bytes - bytes % 8);
}

SlabWriter::SlabWriter(uint64_t job_id, std::vector<Tensor> tensors, int32_t slab_bytes)
    : job_id_(job_id),
      tensors_(std::move(tensors)),
      slab_bytes_(static_cast<uint64_t>(SlabPayloadBytes(slab_bytes, 0))) {
  Seek();
}

void SlabWriter::Seek() {
  while (index_ < tensors_.size() && cursor_ >= tensors_[index_].bytes) {
    ++index_;
    cursor_ = 0;
  }
}

bool SlabWriter::done() const { return index_ >= tensors_.size(); }

bool SlabWriter::Next(v1::TensorSlab* slab) {
  if (done()) return false;
  const Tensor& tensor = tensors_[index_];
  const uint64_t length = std::min(slab_bytes_, tensor.bytes - cursor_);
  slab->set_job_id(job_id_);
  slab->set_tensor(tensor.tensor);
  slab->set_byte_offset(cursor_);
  if (tensor.data != nullptr) {
    slab->set_data(static_cast<const char*>(tensor.data) + cursor_, length);
  } else {
    std::string* data = slab->mutable_data();
    data->resize(length);
    tensor.copy(cursor_, length, data->data());
  }
  cursor_ += length;
  Seek();
  return true;
}

SlabAssembler::SlabAssembler(uint64_t job_id, std::vector<Tensor> tensors, const char* side)
    : job_id_(job_id), side_(side) {
  tensors_.reserve(tensors.size());
  for (Tensor& tensor : tensors) tensors_.push_back(Progress{std::move(tensor), 0});
}

uint64_t SlabAssembler::received_bytes() const {
  uint64_t received = 0;
  for (const Progress& progress : tensors_) received += progress.received;
  return received;
}

uint64_t SlabAssembler::total_bytes() const {
  uint64_t total = 0;
  for (const Progress& progress : tensors_) total += progress.tensor.bytes;
  return total;
}

absl::Status SlabAssembler::Add(const v1::TensorSlab& slab) {
  // The tensor's name only on the error paths: Add runs once per slab on both ends.
  auto name = [&slab]() -> std::string {
    const std::string& known = v1::Tensor_Name(slab.tensor());
    return known.empty() ? absl::StrCat(static_cast<int>(slab.tensor()), " (no such tensor)")
                         : known;
  };
  auto it = std::find_if(tensors_.begin(), tensors_.end(), [&slab](const Progress& p) {
    return p.tensor.tensor == slab.tensor();
  });
  if (it == tensors_.end()) {
    return InvalidFieldError({"slab.tensor"},
                             absl::StrCat(side_, ".tensor ", name(), " is not a tensor of job ",
                                          job_id_, slab.tensor() == v1::TENSOR_COUNTS
                                                       ? " (its start_job did not set has_counts)"
                                                       : ""));
  }
  Progress& progress = *it;
  if (slab.byte_offset() < progress.received) {
    return absl::FailedPreconditionError(absl::StrCat(
        side_, ".byte_offset ", slab.byte_offset(), " of ", name(), " for job ", job_id_,
        " overlaps bytes already received (next expected offset ", progress.received, ")"));
  }
  if (slab.byte_offset() > progress.received) {
    return absl::FailedPreconditionError(
        absl::StrCat(side_, ".byte_offset ", slab.byte_offset(), " of ", name(), " for job ",
                     job_id_, " leaves a gap (next expected offset ", progress.received, ")"));
  }
  const uint64_t size = progress.tensor.bytes;
  if (slab.data().size() > size - progress.received) {
    return InvalidFieldError(
        {"slab.data"},
        absl::StrCat(side_, ".data of ", name(), " for job ", job_id_, " runs to byte ",
                     progress.received + slab.data().size(), ", past the tensor's ", size,
                     " bytes (byte-length mismatch with the shape announced)"));
  }
  if (slab.data().empty()) {
    return InvalidFieldError({"slab.data"},
                             absl::StrCat(side_, ".data for job ", job_id_, " is empty"));
  }
  std::memcpy(static_cast<char*>(progress.tensor.data) + progress.received, slab.data().data(),
              slab.data().size());
  progress.received += slab.data().size();
  return absl::OkStatus();
}

bool SlabAssembler::complete() const {
  return std::all_of(tensors_.begin(), tensors_.end(),
                     [](const Progress& p) { return p.received == p.tensor.bytes; });
}

std::string SlabAssembler::MissingTensors() const {
  std::string missing;
  for (const Progress& p : tensors_) {
    if (p.received < p.tensor.bytes) {
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", v1::Tensor_Name(p.tensor.tensor),
                      " (", p.received, " of ", p.tensor.bytes, " bytes)");
    }
  }
  return missing;
}

const char* SlabAssembler::FirstMissingField() const {
  for (const Progress& p : tensors_) {
    if (p.received < p.tensor.bytes) return p.tensor.field;
  }
  return "";
}

}  // namespace centroidkv
