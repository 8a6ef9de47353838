// The protocol codec, part 3: jobs by reference to shared memory. A StartJob may name its
// input tensors, and where its result goes, as spans of regions the client registered
// (RegisterRegion); these are those spans in domain terms, both ways, and every check the
// wire alone can make (sizes against the job's shape, element alignment, outputs that
// overlap each other or the input). Whether a region exists and holds a span is the
// server's (service/shm/region_table.h). Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/types/layer_view.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "centroidkv/wire/job_codec.h"

namespace centroidkv {

// [offset, offset + bytes) of the region `region_id`.
struct RegionSpan {
  uint64_t region_id = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Where a job's input tensors are read in place (StartJob.region_input).
struct RegionInputSpans {
  RegionSpan keys;
  RegionSpan values;
  std::optional<RegionSpan> counts;  // with counts
};

// Where a job's result tensors are written (StartJob.region_output).
struct RegionOutputSpans {
  RegionSpan keys;
  RegionSpan values;
  RegionSpan counts;
  std::optional<RegionSpan> assignment;   // with the assignment
  std::optional<RegionSpan> log_weights;  // a fitted job
};

void RegionInputToProto(const RegionInputSpans& spans, v1::StartJob* start);
void RegionOutputToProto(const RegionOutputSpans& spans, v1::StartJob* start);

// A job's spans, either or both absent (the slab path).
struct JobRegions {
  std::optional<RegionInputSpans> input;
  std::optional<RegionOutputSpans> output;
  bool any() const { return input.has_value() || output.has_value(); }
};

// The spans of a StartJob read by StartJobFromProto as `job`, checked: input spans hold
// exactly their tensor's bytes (counts present iff has_counts), output spans at least the
// largest result (MaxResultTensorBytes; assignment present iff return_assignment,
// log_weights iff the job is fitted), offsets
// are multiples of the element size, and no output span overlaps another span of the job.
// INVALID_ARGUMENT located at the field ("start_job.region_input.keys.bytes",
// "start_job.region_output.out_values", ...).
absl::StatusOr<JobRegions> JobRegionsFromProto(const v1::StartJob& start,
                                               const JobAnnouncement& job);

}  // namespace centroidkv
