// Whether a finished result fits its output dtype: a float32 job asked for fp16 (or bf16)
// rows must not come back with values rounded to Inf. The centroids are means of finite
// inputs, so only a value beyond the output dtype's range can overflow; such a job fails
// with OUT_OF_RANGE naming output_dtype and the tensor, and is reported as a JobError.
// Thread-compatible: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::service {

// OK, or OUT_OF_RANGE if a key or value row of `result` is (or, for float32 rows, would
// round to) Inf in `output_dtype`. Cheap: one pass over the result's rows, read from
// `row_target` when the engine wrote them there (result.rows_in_target).
absl::Status CheckResultFitsDType(const CompressResult& result, DType output_dtype,
                                  uint64_t job_id, const ResultRowTarget* row_target = nullptr);

}  // namespace centroidkv::service
