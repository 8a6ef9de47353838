// Jobs by reference to shared memory: RegionSpans both ways and their wire checks
// (region_codec.h).
#include "centroidkv/wire/region_codec.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv {
namespace {

void SpanToProto(const RegionSpan& span, v1::RegionSpan* out) {
  out->set_region_id(span.region_id);
  out->set_offset(span.offset);
  out->set_bytes(span.bytes);
}

RegionSpan SpanFromProto(const v1::RegionSpan& span) {
  return RegionSpan{span.region_id(), span.offset(), span.bytes()};
}

// One span checked: `exact` bytes (or at least `minimum` when not exact), its offset a
// multiple of `alignment`, its end within 64 bits.
absl::Status CheckSpan(const RegionSpan& span, const std::string& field, uint64_t wanted,
                       bool exact, uint64_t alignment) {
  if (exact ? span.bytes != wanted : span.bytes < wanted) {
    return InvalidFieldError(
        {field + ".bytes"},
        absl::StrCat(field, ".bytes is ", span.bytes, "; the job needs ",
                     exact ? "exactly " : "at least ", wanted, " bytes there",
                     exact ? "" : " (its largest possible result)"));
  }
  if (alignment > 1 && span.offset % alignment != 0) {
    return InvalidFieldError({field + ".offset"},
                             absl::StrCat(field, ".offset ", span.offset,
                                          " is not a multiple of the element size ", alignment));
  }
  if (span.offset + span.bytes < span.offset) {
    return InvalidFieldError({field + ".offset"},
                             absl::StrCat(field, ": offset + bytes overflows"));
  }
  return absl::OkStatus();
}

// A span the job has only sometimes (counts in, the assignment out): present exactly when
// `expected` (what the StartJob's other fields say), then checked as CheckSpan.
absl::Status ReadOptionalSpan(bool expected, bool present, const v1::RegionSpan& wire,
                              const std::string& field, const char* what, uint64_t wanted,
                              bool exact, uint64_t alignment, std::optional<RegionSpan>* out) {
  if (expected != present) {
    return InvalidFieldError({field}, absl::StrCat(field,
                                                   expected ? " is missing; the job has "
                                                            : " is set, but the job has no ",
                                                   what));
  }
  if (!present) return absl::OkStatus();
  *out = SpanFromProto(wire);
  return CheckSpan(**out, field, wanted, exact, alignment);
}

struct NamedSpan {
  RegionSpan span;
  std::string field;
};

bool Overlap(const RegionSpan& a, const RegionSpan& b) {
  return a.region_id == b.region_id && a.bytes > 0 && b.bytes > 0 &&
         a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

}  // namespace

void RegionInputToProto(const RegionInputSpans& spans, v1::StartJob* start) {
  v1::RegionInput* input = start->mutable_region_input();
  SpanToProto(spans.keys, input->mutable_keys());
  SpanToProto(spans.values, input->mutable_values());
  if (spans.counts.has_value()) SpanToProto(*spans.counts, input->mutable_counts());
}

void RegionOutputToProto(const RegionOutputSpans& spans, v1::StartJob* start) {
  v1::RegionOutput* output = start->mutable_region_output();
  SpanToProto(spans.keys, output->mutable_out_keys());
  SpanToProto(spans.values, output->mutable_out_values());
  SpanToProto(spans.counts, output->mutable_out_counts());
  if (spans.assignment.has_value()) SpanToProto(*spans.assignment, output->mutable_assignment());
  if (spans.log_weights.has_value()) {
    SpanToProto(*spans.log_weights, output->mutable_log_weights());
  }
}

absl::StatusOr<JobRegions> JobRegionsFromProto(const v1::StartJob& start,
                                               const JobAnnouncement& job) {
  JobRegions regions;
  std::vector<NamedSpan> inputs;
  static const uint32_t kCounts = 1;  // any non-null pointer: the shape has counts
  const LayerView shape = job.View(nullptr, nullptr, job.has_counts ? &kCounts : nullptr);
  if (start.has_region_input()) {
    const v1::RegionInput& wire = start.region_input();
    const InputBytes bytes = InputBytesOf(shape);
    const uint64_t element = uint64_t(DTypeSize(job.dtype));
    RegionInputSpans spans;
    spans.keys = SpanFromProto(wire.keys());
    spans.values = SpanFromProto(wire.values());
    if (absl::Status s = CheckSpan(spans.keys, "start_job.region_input.keys", bytes.keys, true,
                                   element);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckSpan(spans.values, "start_job.region_input.values", bytes.values,
                                   true, element);
        !s.ok()) {
      return s;
    }
    inputs.push_back({spans.keys, "start_job.region_input.keys"});
    inputs.push_back({spans.values, "start_job.region_input.values"});
    if (absl::Status s = ReadOptionalSpan(job.has_counts, wire.has_counts(), wire.counts(),
                                          "start_job.region_input.counts",
                                          "counts (has_counts)", bytes.counts, true,
                                          sizeof(uint32_t), &spans.counts);
        !s.ok()) {
      return s;
    }
    if (spans.counts.has_value()) {
      inputs.push_back({*spans.counts, "start_job.region_input.counts"});
    }
    regions.input = spans;
  }
  if (start.has_region_output()) {
    const v1::RegionOutput& wire = start.region_output();
    const ResultBytes most = MaxResultTensorBytes(shape, job.options, job.output_dtype);
    const uint64_t element = uint64_t(DTypeSize(job.output_dtype));
    RegionOutputSpans spans;
    spans.keys = SpanFromProto(wire.out_keys());
    spans.values = SpanFromProto(wire.out_values());
    spans.counts = SpanFromProto(wire.out_counts());
    std::vector<NamedSpan> outputs = {{spans.keys, "start_job.region_output.out_keys"},
                                      {spans.values, "start_job.region_output.out_values"},
                                      {spans.counts, "start_job.region_output.out_counts"}};
    const uint64_t wanted[] = {most.keys, most.values, most.counts};
    const uint64_t alignment[] = {element, element, sizeof(uint32_t)};
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (absl::Status s = CheckSpan(outputs[i].span, outputs[i].field, wanted[i], false,
                                     alignment[i]);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = ReadOptionalSpan(
            job.options.compute_assignment, wire.has_assignment(), wire.assignment(),
            "start_job.region_output.assignment", "assignment (return_assignment)",
            most.assignment, false, sizeof(int32_t), &spans.assignment);
        !s.ok()) {
      return s;
    }
    if (spans.assignment.has_value()) {
      outputs.push_back({*spans.assignment, "start_job.region_output.assignment"});
    }
    if (absl::Status s = ReadOptionalSpan(
            job.num_query_heads > 0, wire.has_log_weights(), wire.log_weights(),
            "start_job.region_output.log_weights", "reference queries (fit.num_query_heads)",
            most.log_weights, false, sizeof(float), &spans.log_weights);
        !s.ok()) {
      return s;
    }
    if (spans.log_weights.has_value()) {
      outputs.push_back({*spans.log_weights, "start_job.region_output.log_weights"});
    }
    // The server writes every output span: none may share a byte with another span.
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::vector<NamedSpan> others(outputs.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                    outputs.end());
      others.insert(others.end(), inputs.begin(), inputs.end());
      for (const NamedSpan& other : others) {
        if (Overlap(outputs[i].span, other.span)) {
          return InvalidFieldError(
              {outputs[i].field},
              absl::StrCat(outputs[i].field, " (region ", outputs[i].span.region_id, " bytes ",
                           outputs[i].span.offset, "..",
                           outputs[i].span.offset + outputs[i].span.bytes, ") overlaps ",
                           other.field, "; output spans must not share bytes with any other "
                           "span of the job"));
        }
      }
    }
    regions.output = spans;
  }
  return regions;
}

}  // namespace centroidkv
