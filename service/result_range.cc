// CheckResultFitsDType: the largest magnitude of each tensor, rounded once to the output
// dtype (the same rounding the encoder or engine applies), must stay finite.
#include "service/result_range.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv::service {
namespace {

// True if an fp16 / bf16 element has an all-ones exponent (Inf: the inputs were finite).
bool AnyHalfInf(const uint16_t* bits, size_t count, DType dtype) {
  const uint16_t exponent = dtype == DType::kFloat16 ? 0x7c00u : 0x7f80u;
  uint16_t found = 0;
  for (size_t i = 0; i < count; ++i) {
    found |= static_cast<uint16_t>((bits[i] & exponent) == exponent);
  }
  return found != 0;
}

// The smallest float bit pattern (sign cleared) that rounds to Inf in `dtype`, found once by
// bisection over the encoder's own rounding (StoreFromFloat), which is monotonic in the
// magnitude: 65520.0f for fp16, 0x7f7f8000 for bf16.
int32_t OverflowThreshold(DType dtype) {
  auto overflows = [dtype](uint32_t magnitude_bits) {
    float x;
    std::memcpy(&x, &magnitude_bits, sizeof(x));
    uint16_t rounded = 0;
    StoreFromFloat(&rounded, dtype, 0, x);
    return std::isinf(LoadAsFloat(&rounded, dtype, 0));
  };
  uint32_t low = 0, high = 0x7f800000u;  // overflows(high): +Inf itself
  while (low + 1 < high) {
    const uint32_t middle = low + (high - low) / 2;
    (overflows(middle) ? high : low) = middle;
  }
  return static_cast<int32_t>(high);
}

// True if some float of `rows` rounds to Inf in `dtype`. The magnitudes are compared as
// integers (a finite float's bits with the sign cleared order as its magnitude), four at a
// time with SSE2 (the x86-64 baseline; GCC -O2 leaves the scalar reduction unvectorized,
// and the scalar fmax pass cost ~25% of the transport floor's server CPU).
bool AnyFloatOverflows(const std::vector<float>& rows, DType dtype) {
  static const int32_t kHalf = OverflowThreshold(DType::kFloat16);
  static const int32_t kBFloat = OverflowThreshold(DType::kBFloat16);
  const int32_t threshold = dtype == DType::kFloat16 ? kHalf : kBFloat;
  const size_t n = rows.size();
  const float* data = rows.data();
  size_t i = 0;
  int32_t found = 0;
#if defined(__SSE2__)
  const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
  const __m128i below = _mm_set1_epi32(threshold - 1);
  __m128i any = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i));
    any = _mm_or_si128(any, _mm_cmpgt_epi32(_mm_and_si128(bits, magnitude), below));
  }
  found = _mm_movemask_epi8(any);
#endif
  for (; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    found |= static_cast<int32_t>((bits & 0x7fffffff) >= threshold);
  }
  return found != 0;
}

}  // namespace

absl::Status CheckResultFitsDType(const CompressResult& result, DType output_dtype,
                                  uint64_t job_id, const ResultRowTarget* row_target) {
  // fp8 saturates to its finite maximum: nothing overflows.
  if (output_dtype == DType::kFloat32 || IsFp8(output_dtype)) return absl::OkStatus();
  struct Tensor {
    const char* name;
    const std::vector<float>& rows;
    const uint16_t* half_rows;
    size_t half_count;
  };
  // Rows the engine wrote into the caller's memory are in the output dtype already.
  const bool in_target = result.rows_in_target && row_target != nullptr;
  const Tensor tensors[] = {
      {"keys", result.keys,
       in_target ? static_cast<const uint16_t*>(row_target->keys) : result.half_keys.data(),
       result.key_elements()},
      {"values", result.values,
       in_target ? static_cast<const uint16_t*>(row_target->values) : result.half_values.data(),
       result.value_elements()}};
  using Check = CompressResult::RoundingCheck;
  const Check checks[] = {result.key_rounding, result.value_rounding};
  for (size_t t = 0; t < 2; ++t) {
    const Tensor& tensor = tensors[t];
    // The engine rounded the rows to this dtype itself and saw each rounding: no second
    // read of the rows (which, streamed out past the caches, would come from memory).
    const bool known = result.dtype == output_dtype && checks[t] != Check::kNotChecked;
    const bool overflows = known ? checks[t] == Check::kOverflows
                           : result.dtype == DType::kFloat32
                               ? AnyFloatOverflows(tensor.rows, output_dtype)
                               : AnyHalfInf(tensor.half_rows, tensor.half_count, result.dtype);
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
