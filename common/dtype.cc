// Scalar fp16 <-> fp32 conversion (IEEE binary16, round to nearest even), written out
// bit by bit so that it runs on any x86-64 without F16C, and the bulk forms, which use F16C
// when the CPU has it (same results: F16C rounds to nearest even and quiets NaNs the same).
#include "centroidkv/common/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "centroidkv/common/cpu_features.h"
#endif

namespace centroidkv {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1fu) {  // Inf or NaN
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    out = sign;
  } else {  // subnormal: renormalise
    uint32_t shifted_exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --shifted_exponent;
    }
    out = sign | (shifted_exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {  // NaN: quiet, keep the top mantissa bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  }
  if (abs_bits >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs_bits < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or 0
    if (abs_bits < 0x33000000u) {  // below half of the smallest subnormal (2^-25)
      return sign;
    }
    const uint32_t exponent = abs_bits >> 23;
    const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) {
      ++half_mantissa;
    }
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t half = ((abs_bits >> 13) - (112u << 10));
  const uint32_t remainder = abs_bits & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) {
    ++half;  // may carry into the exponent, which is still correct
  }
  return static_cast<uint16_t>(sign | half);
}

namespace {

#if defined(__x86_64__)
bool HasF16c() {
  static const bool has = __builtin_cpu_supports("avx") && CpuHasF16c();
  return has;
}

__attribute__((target("avx,f16c"))) int64_t HalvesToFloatsF16c(const uint16_t* in,
                                                                int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t FloatsToHalvesF16c(const float* in, int64_t count,
                                                                uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  return i;
}
#endif

}  // namespace

void LoadAsFloats(const void* data, DType dtype, int64_t first, int64_t count, float* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out, static_cast<const float*>(data) + first,
                  sizeof(float) * static_cast<size_t>(count));
      return;
    case DType::kFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(data) + first;
      int64_t i = 0;
#if defined(__x86_64__)
      if (HasF16c()) i = HalvesToFloatsF16c(in, count, out);
#endif
      for (; i < count; ++i) out[i] = HalfToFloat(in[i]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(data) + first;
      for (int64_t i = 0; i < count; ++i) out[i] = BFloat16ToFloat(in[i]);
      return;
    }
  }
}

void StoreFromFloats(void* data, DType dtype, int64_t first, int64_t count, const float* in) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(static_cast<float*>(data) + first, in,
                  sizeof(float) * static_cast<size_t>(count));
      return;
    case DType::kFloat16: {
      uint16_t* out = static_cast<uint16_t*>(data) + first;
      int64_t i = 0;
#if defined(__x86_64__)
      if (HasF16c()) i = FloatsToHalvesF16c(in, count, out);
#endif
      for (; i < count; ++i) out[i] = FloatToHalf(in[i]);
      return;
    }
    case DType::kBFloat16: {
      uint16_t* out = static_cast<uint16_t*>(data) + first;
      for (int64_t i = 0; i < count; ++i) out[i] = FloatToBFloat16(in[i]);
      return;
    }
  }
}

}  // namespace centroidkv
