// Scalar fp16 <-> fp32 conversion (IEEE binary16, round to nearest even), written out
// bit by bit so that it runs on any x86-64 without F16C, and the bulk forms, which use F16C
// when the CPU has it (same results: F16C rounds to nearest even and quiets NaNs the same).
// fp8 (OCP E4M3 / E5M2) <-> fp32: widening by a table, narrowing bit by bit.
#include "centroidkv/common/dtype.h"

#include <array>
#include <cmath>

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
    case DType::kFp8E4M3:
      return "fp8_e4m3";
    case DType::kFp8E5M2:
      return "fp8_e5m2";
  }
  return "unknown";
}

namespace {

// The layout of an fp8 format: mantissa bits, exponent bias, the largest finite code.
struct Fp8Format {
  int mantissa_bits;
  int bias;
  uint8_t max_code;
};

constexpr Fp8Format kE4M3{3, 7, 0x7e};
constexpr Fp8Format kE5M2{2, 15, 0x7b};

const Fp8Format& FormatOf(DType dtype) { return dtype == DType::kFp8E4M3 ? kE4M3 : kE5M2; }

// The value of every code of a format, from its definition.
std::array<float, 256> Fp8Table(const Fp8Format& format, bool has_infinity) {
  std::array<float, 256> table{};
  const int m_bits = format.mantissa_bits;
  for (int code = 0; code < 256; ++code) {
    const int magnitude = code & 0x7f;
    const int exponent = magnitude >> m_bits;
    const int mantissa = magnitude & ((1 << m_bits) - 1);
    float value;
    if (magnitude > format.max_code) {
      value = has_infinity && mantissa == 0 ? HUGE_VALF : std::nanf("");
    } else if (exponent == 0) {
      value = std::ldexp(static_cast<float>(mantissa), 1 - format.bias - m_bits);
    } else {
      value = std::ldexp(static_cast<float>((1 << m_bits) + mantissa), exponent - format.bias - m_bits);
    }
    table[code] = (code & 0x80) ? -value : value;
  }
  return table;
}

}  // namespace

float Fp8ToFloat(uint8_t bits, DType dtype) {
  static const std::array<float, 256> e4m3 = Fp8Table(kE4M3, /*has_infinity=*/false);
  static const std::array<float, 256> e5m2 = Fp8Table(kE5M2, /*has_infinity=*/true);
  return dtype == DType::kFp8E4M3 ? e4m3[bits] : e5m2[bits];
}

uint8_t FloatToFp8(float value, DType dtype) {
  const Fp8Format& format = FormatOf(dtype);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  float magnitude;
  std::memcpy(&magnitude, &abs_bits, sizeof(magnitude));
  if (magnitude >= Fp8MaxFinite(dtype)) return static_cast<uint8_t>(sign | format.max_code);
  const int m_bits = format.mantissa_bits;
  const int min_normal_exponent = 1 - format.bias;
  if (magnitude < std::ldexp(1.0f, min_normal_exponent)) {
    // Subnormal (or zero): multiples of 2^(min_normal_exponent - m_bits), scaled exactly
    // to an integer part and a fraction, rounded to nearest even. 2^m_bits is the smallest
    // normal code, so a carry is still correct.
    const float scaled = std::ldexp(magnitude, m_bits - min_normal_exponent);
    auto code = static_cast<uint32_t>(scaled);
    const float fraction = scaled - static_cast<float>(code);
    if (fraction > 0.5f || (fraction == 0.5f && (code & 1u))) ++code;
    return static_cast<uint8_t>(sign | code);
  }
  // Normal: keep m_bits of the float's 23 mantissa bits, rounded to nearest even (a carry
  // into the exponent is still correct), and rebias the exponent.
  const int shift = 23 - m_bits;
  uint32_t kept = abs_bits >> shift;
  const uint32_t remainder = abs_bits & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (kept & 1u))) ++kept;
  const uint32_t code = kept - (static_cast<uint32_t>(127 - format.bias) << m_bits);
  return static_cast<uint8_t>(sign | (code > format.max_code ? format.max_code : code));
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
    case DType::kFp8E4M3:
    case DType::kFp8E5M2: {
      const uint8_t* in = static_cast<const uint8_t*>(data) + first;
      for (int64_t i = 0; i < count; ++i) out[i] = Fp8ToFloat(in[i], dtype);
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
    case DType::kFp8E4M3:
    case DType::kFp8E5M2: {
      uint8_t* out = static_cast<uint8_t*>(data) + first;
      for (int64_t i = 0; i < count; ++i) out[i] = FloatToFp8(in[i], dtype);
      return;
    }
  }
}

}  // namespace centroidkv
