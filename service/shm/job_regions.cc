// JobRegionMemory: spans to mapped memory, and the result written in place.
#include "service/shm/job_regions.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "service/result_encoder.h"

namespace centroidkv::service {
namespace {

// Whether `mapped` may still be used: FAILED_PRECONDITION naming `field`.region_id if not.
absl::Status CheckRegionUsable(const MappedRegion& mapped, const std::string& field,
                               uint64_t region_id) {
  if (mapped.truncated()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, {field + ".region_id"},
                      absl::StrCat(field, ".region_id: region ", region_id, " ('",
                                   mapped.name(), "') was truncated by its owner while a job "
                                   "used it; the server no longer sees its file (unregister "
                                   "it and register a new one)"));
  }
  if (absl::Status backed = mapped.CheckStillBacked(); !backed.ok()) {
    return FieldError(backed.code(), {field + ".region_id"},
                      absl::StrCat(field, ".region_id: ", backed.message()));
  }
  return absl::OkStatus();
}

// One span of the owner's regions as memory; its mapping joins `held`.
absl::StatusOr<MappedSpan> MapSpan(const RegionSpan& span, const char* field,
                                   const RegionTable& table, const std::string& owner_key,
                                   std::vector<std::shared_ptr<MappedRegion>>* held) {
  const std::string name = field;
  absl::StatusOr<std::shared_ptr<MappedRegion>> region = table.Find(owner_key, span.region_id);
  if (!region.ok()) {
    return FieldError(region.status().code(), {name + ".region_id"},
                      absl::StrCat(name, ".region_id: ", region.status().message()));
  }
  const MappedRegion& mapped = **region;
  if (span.offset > mapped.size() || span.bytes > mapped.size() - span.offset) {
    return FieldError(absl::StatusCode::kOutOfRange, {name + ".offset"},
                      absl::StrCat(name, ": bytes ", span.offset, "..", span.offset + span.bytes,
                                   " are outside region ", span.region_id, " ('",
                                   mapped.name(), "', ", mapped.size(), " bytes)"));
  }
  if (absl::Status usable = CheckRegionUsable(mapped, name, span.region_id); !usable.ok()) {
    return usable;
  }
  MappedSpan out{mapped.data() + span.offset, span.bytes, field, span.region_id, &mapped};
  held->push_back(*std::move(region));
  return out;
}

}  // namespace

absl::StatusOr<JobRegionMemory> JobRegionMemory::Resolve(const JobRegions& spans,
                                                         const RegionTable& table,
                                                         const std::string& owner_key) {
  JobRegionMemory memory;
  auto map = [&](const RegionSpan& span, const char* field,
                 std::optional<MappedSpan>* out) -> absl::Status {
    absl::StatusOr<MappedSpan> mapped = MapSpan(span, field, table, owner_key, &memory.held_);
    if (!mapped.ok()) return mapped.status();
    *out = *mapped;
    return absl::OkStatus();
  };
  if (spans.input.has_value()) {
    const RegionInputSpans& in = *spans.input;
    if (absl::Status s = map(in.keys, "start_job.region_input.keys", &memory.keys_); !s.ok()) {
      return s;
    }
    if (absl::Status s = map(in.values, "start_job.region_input.values", &memory.values_);
        !s.ok()) {
      return s;
    }
    if (in.counts.has_value()) {
      if (absl::Status s = map(*in.counts, "start_job.region_input.counts", &memory.counts_);
          !s.ok()) {
        return s;
      }
    }
  }
  if (spans.output.has_value()) {
    const RegionOutputSpans& out = *spans.output;
    if (absl::Status s = map(out.keys, "start_job.region_output.out_keys", &memory.out_keys_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            map(out.values, "start_job.region_output.out_values", &memory.out_values_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            map(out.counts, "start_job.region_output.out_counts", &memory.out_counts_);
        !s.ok()) {
      return s;
    }
    if (out.assignment.has_value()) {
      if (absl::Status s = map(*out.assignment, "start_job.region_output.assignment",
                               &memory.assignment_);
          !s.ok()) {
        return s;
      }
    }
    if (out.log_weights.has_value()) {
      if (absl::Status s = map(*out.log_weights, "start_job.region_output.log_weights",
                               &memory.out_log_weights_);
          !s.ok()) {
        return s;
      }
    }
  }
  return memory;
}

std::optional<ResultRowTarget> JobRegionMemory::RowTarget() const {
  if (!out_keys_.has_value() || !out_values_.has_value()) return std::nullopt;
  return ResultRowTarget{out_keys_->data, out_keys_->bytes, out_values_->data,
                         out_values_->bytes};
}

absl::Status JobRegionMemory::WriteResult(const CompressResult& result,
                                          DType output_dtype) const {
  const std::vector<SlabWriter::Tensor> tensors = ResultTensors(result, output_dtype);
  const std::optional<MappedSpan>* targets[] = {&out_keys_, &out_values_, &out_counts_,
                                                &out_log_weights_, &assignment_};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SlabWriter::Tensor& tensor = tensors[i];
    const bool rows = i < 2;  // out_keys, out_values
    if (tensor.bytes == 0 || (rows && result.rows_in_target)) continue;
    const std::optional<MappedSpan>& target = *targets[i];
    if (!target.has_value() || tensor.bytes > target->bytes) {
      return absl::InternalError(absl::StrCat("result tensor ", v1::Tensor_Name(tensor.tensor),
                                              " (", tensor.bytes,
                                              " bytes) does not fit its output span"));
    }
    if (tensor.data != nullptr) {
      std::memcpy(target->data, tensor.data, tensor.bytes);
    } else {
      tensor.copy(0, tensor.bytes, reinterpret_cast<char*>(target->data));
    }
  }
  return absl::OkStatus();
}

std::vector<const MappedSpan*> JobRegionMemory::Spans() const {
  std::vector<const MappedSpan*> spans;
  for (const std::optional<MappedSpan>* span :
       {&keys_, &values_, &counts_, &out_keys_, &out_values_, &out_counts_, &out_log_weights_,
        &assignment_}) {
    if (span->has_value()) spans.push_back(&**span);
  }
  return spans;
}

absl::Status JobRegionMemory::CheckUsable() const {
  for (const MappedSpan* span : Spans()) {
    if (absl::Status usable = CheckRegionUsable(*span->region, span->field, span->region_id);
        !usable.ok()) {
      return usable;
    }
  }
  return absl::OkStatus();
}

absl::Status JobRegionMemory::CheckIntact(uint64_t job_id) const {
  const std::vector<const MappedSpan*> spans = Spans();
  for (const MappedSpan* span : spans) {
    const MappedRegion& region = *span->region;
    if (!region.truncated() && region.CheckStillBacked().ok()) continue;
    // Name the span the fault hit, if it hit one of this job's spans in the region.
    const MappedSpan* named = span;
    const uintptr_t fault = region.fault_address();
    for (const MappedSpan* other : spans) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(other->data);
      if (other->region == &region && fault >= begin && fault - begin < other->bytes) {
        named = other;
        break;
      }
    }
    return FieldError(
        absl::StatusCode::kDataLoss, {named->field},
        absl::StrCat(named->field, ": region ", named->region_id, " ('", region.name(),
                     "') was truncated by its owner while job ", job_id, " used it",
                     region.truncated() ? " (the server's access faulted and read or wrote "
                                          "zero pages instead)"
                                        : "",
                     "; the result is void (unregister the region and register a new one)"));
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::service
