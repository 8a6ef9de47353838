// The CUDA backend's scalar helpers, the same on host and device: float64 operations that
// are never fused, bit casts, fp16 / bf16 widening and rounding, the result store in the
// requested dtype, the sort key of a score, the float match bounds, and the source slots of
// a range.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// Scalar helpers (tested on the host in tests/kernels/cuda/layer_stages_test.cc).

// Correctly rounded float64 operations that the device compiler may not fuse.
CKV_HD double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
CKV_HD double AddRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CKV_HD double DivRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
CKV_HD double SqrtRn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

// The bits of one value as another type of the same size (memcpy: a register move on both
// host and device).
template <typename To, typename From>
CKV_HD To BitCast(From value) {
  static_assert(sizeof(To) == sizeof(From), "BitCast between types of one size");
  To out;
  memcpy(&out, &value, sizeof(out));
  return out;
}
CKV_HD float BitsToFloat(uint32_t bits) { return BitCast<float>(bits); }
CKV_HD uint32_t FloatToBits(float value) { return BitCast<uint32_t>(value); }

// float to bfloat16, rounded to nearest even (finite inputs; NaN stays NaN), as bits.
CKV_HD uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = FloatToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float to IEEE binary16, rounded to nearest even (overflow to infinity, NaN stays NaN), as
// bits: the same rounding as the host's FloatToHalf (common/dtype.h).
CKV_HD uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = FloatToBits(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16: infinity
  if (magnitude >= 0x38800000u) {  // normal in binary16 (>= 2^-14), or rounding up to infinity
    const uint32_t odd = (magnitude >> 13) & 1u;
    return sign | static_cast<uint16_t>((magnitude - 0x38000000u + 0xfffu + odd) >> 13);
  }
  // Subnormal or zero: adding 0.5 leaves the value in units of 2^-24, rounded to nearest even
  // by the float addition itself.
  const float aligned = BitsToFloat(magnitude) + 0.5f;
  return sign | static_cast<uint16_t>(FloatToBits(aligned) - 0x3f000000u);
}

CKV_HD uint64_t DoubleToBits(double value) { return BitCast<uint64_t>(value); }

// IEEE binary16 to float, exactly (subnormals, infinities and NaNs included).
CKV_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

CKV_HD float BFloat16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// Element `index` of a packed result array of `type`: the float rounded once (fp16 / bf16).
CKV_HD void StoreResult(void* rows, int32_t type, int64_t index, float value) {
  switch (type) {
    case kInputF16: static_cast<uint16_t*>(rows)[index] = FloatToHalfBits(value); return;
    case kInputBF16: static_cast<uint16_t*>(rows)[index] = FloatToBFloat16Bits(value); return;
    default: static_cast<float*>(rows)[index] = value; return;
  }
}

// A key whose unsigned order is the order of the (non-NaN) scores; 0 is below every score.
CKV_HD uint64_t OrderKey(double score) {
  if (score == 0.0) score = 0.0;  // -0 and +0 compare equal in the reference
  const uint64_t bits = DoubleToBits(score);
  return (bits >> 63) != 0 ? ~bits : (bits | (uint64_t{1} << 63));
}

// |float score - exact score| <= MatchBound(dim) (see layer_stages.h's file comment).
CKV_HD double MatchBound(int32_t dim) {
  return (2.0 * dim + 16.0) * 5.9604644775390625e-8;  // 2^-24
}

// The bound for scores from tensor-core tiles (tile_match.h): bf16x3 products of rows
// normalised in float64 and rounded to float, accumulated in the tensor cores' float32:
//   2^-14 + (24 dim + 64) 2^-24.
// The derivation is kernels/cpu/soft_match.h's for the CPU's matrix engine (normalisation,
// the split hi + lo, the dropped lo lo' and tau terms: below 2^-14 + (dim / 16 + 12) u), with
// the accumulation allowed far more: tensor cores add products in groups, aligning them to
// the group's largest exponent and truncating (measured by Fasi et al., "Numerical behavior
// of NVIDIA tensor cores", 2021: a few units of 2^-23 per group), so each of the 3 dim
// products and accumulations is allowed 8 u = 2^-21 relative to the sum of the magnitudes
// (<= 1.01 by Cauchy-Schwarz): 24 dim u. A wider bound costs only more exact rescoring.
CKV_HD double TileMatchBound(int32_t dim) {
  return 6.103515625e-05 + (24.0 * dim + 64.0) * 5.9604644775390625e-8;  // 2^-14, 2^-24
}

// Source slots of a compressible range of `length` rows cut into chunks of `chunk`.
CKV_HD int32_t SlotsInRange(int64_t length, int32_t chunk) {
  if (length < 2) return 0;
  const int64_t half = (chunk + 1) / 2;
  const int64_t full = length / chunk, rest = length % chunk;
  return static_cast<int32_t>(full * half + (rest >= 2 ? (rest + 1) / 2 : 0));
}

}  // namespace centroidkv::cuda
