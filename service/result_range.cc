// CheckResultFitsDType: the largest magnitude of each tensor, rounded once to the output
// dtype (the same rounding the encoder or engine applies), must stay finite.
#include "service/result_range.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv::service {
namespace {

// True if an fp16 / bf16 element has an all-ones exponent (Inf: the inputs were finite).
bool AnyHalfInf(const std::vector<uint16_t>& bits, DType dtype) {
  const uint16_t exponent = dtype == DType::kFloat16 ? 0x7c00u : 0x7f80u;
  uint16_t found = 0;
  for (uint16_t b : bits) found |= static_cast<uint16_t>((b & exponent) == exponent);
  return found != 0;
}

// True if some float of `rows` rounds to Inf in `dtype` (rounding is monotonic in the
// magnitude, so the largest magnitude decides).
bool AnyFloatOverflows(const std::vector<float>& rows, DType dtype) {
  float largest = 0.0f;
  for (float x : rows) largest = std::fmax(largest, std::fabs(x));
  uint16_t bits = 0;
  StoreFromFloat(&bits, dtype, 0, largest);
  return std::isinf(LoadAsFloat(&bits, dtype, 0));
}

}  // namespace

absl::Status CheckResultFitsDType(const CompressResult& result, DType output_dtype,
                                  uint64_t job_id) {
  if (output_dtype == DType::kFloat32) return absl::OkStatus();
  struct Tensor {
    const char* name;
    const std::vector<float>& rows;
    const std::vector<uint16_t>& half_rows;
  };
  const Tensor tensors[] = {{"keys", result.keys, result.half_keys},
                            {"values", result.values, result.half_values}};
  for (const Tensor& tensor : tensors) {
    const bool overflows = result.dtype == DType::kFloat32
                               ? AnyFloatOverflows(tensor.rows, output_dtype)
                               : AnyHalfInf(tensor.half_rows, result.dtype);
    if (overflows) {
      const std::string dtype(DTypeName(output_dtype));
      return FieldError(
          absl::StatusCode::kOutOfRange, {"start_job.output_dtype"},
          absl::StrCat("output_dtype ", dtype, " cannot hold the ", std::string(tensor.name),
                       " of job ", job_id,
                       "'s result (a value beyond its finite range would become Inf); ask "
                       "for a wider output_dtype"));
    }
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::service
