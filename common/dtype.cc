// Scalar fp16 <-> fp32 conversion (IEEE binary16, round to nearest even), written out
// bit by bit so that it runs on any x86-64 without F16C, and the bulk forms, which use F16C
// when the CPU has it (same results: F16C rounds to nearest even and quiets NaNs the same).
// fp8 (OCP E4M3 / E5M2) <-> fp32: widening by a table, narrowing bit by bit.
#include "centroidkv/common/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

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

// The AVX2 forms of WidenFp8 / NarrowToFp8 for one format: 8 elements at a time, the same
// arithmetic as the scalar code (exact bit manipulation, then one IEEE multiply or
// division), so the same bits; the caller does the tail.
#if defined(__x86_64__)
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

struct Fp8Lanes {
  int mantissa_bits;
  int bias;
  int max_code;
  bool e4m3;
};

Fp8Lanes LanesOf(DType dtype) {
  return dtype == DType::kFp8E4M3 ? Fp8Lanes{3, 7, 0x7e, true} : Fp8Lanes{2, 15, 0x7b, false};
}

__attribute__((target("avx2"))) int64_t WidenFp8Avx2(const uint8_t* codes, int64_t count,
                                                     DType dtype, float scale, float* out) {
  const Fp8Lanes f = LanesOf(dtype);
  const __m256i magnitude_mask = _mm256_set1_epi32(0x7f);
  const __m256i sign_mask = _mm256_set1_epi32(0x80);
  const __m256i rebias = _mm256_set1_epi32((127 - f.bias) << 23);
  const __m256i smallest_normal = _mm256_set1_epi32(1 << f.mantissa_bits);
  const __m256 subnormal_unit = _mm256_set1_ps(std::ldexp(1.0f, 1 - f.bias - f.mantissa_bits));
  const __m256i top = _mm256_set1_epi32(f.max_code);  // codes above it are Inf / NaN
  const __m256i infinity_code = _mm256_set1_epi32(0x7c);
  const __m256 nan = _mm256_set1_ps(std::nanf(""));
  const __m256 infinity = _mm256_set1_ps(HUGE_VALF);
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i x =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    const __m256i magnitude = _mm256_and_si256(x, magnitude_mask);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, sign_mask), 24);
    const __m256 normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(magnitude, 23 - f.mantissa_bits), rebias));
    const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), subnormal_unit);
    __m256 v = _mm256_blendv_ps(
        normal, subnormal, _mm256_castsi256_ps(_mm256_cmpgt_epi32(smallest_normal, magnitude)));
    const __m256i special = _mm256_cmpgt_epi32(magnitude, top);
    __m256 special_value = nan;
    if (!f.e4m3) {
      special_value = _mm256_blendv_ps(
          nan, infinity, _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, infinity_code)));
    }
    v = _mm256_blendv_ps(v, special_value, _mm256_castsi256_ps(special));
    v = _mm256_or_ps(v, _mm256_castsi256_ps(sign));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(v, s));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t NarrowToFp8Avx2(const float* in, int64_t count,
                                                        DType dtype, float scale,
                                                        uint8_t* codes) {
  const Fp8Lanes f = LanesOf(dtype);
  const int shift = 23 - f.mantissa_bits;
  const int min_normal_exponent = 1 - f.bias;
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i nan_above = _mm256_set1_epi32(0x7f800000);
  const __m256i max_bits = _mm256_set1_epi32(std::bit_cast<int32_t>(Fp8MaxFinite(dtype)));
  const __m256i normal_bits =
      _mm256_set1_epi32(std::bit_cast<int32_t>(std::ldexp(1.0f, min_normal_exponent)));
  const __m256 to_subnormal = _mm256_set1_ps(std::ldexp(1.0f, f.mantissa_bits - min_normal_exponent));
  const __m256i half_minus_one = _mm256_set1_epi32((1 << (shift - 1)) - 1);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i rebias = _mm256_set1_epi32((127 - f.bias) << f.mantissa_bits);
  const __m256i max_code = _mm256_set1_epi32(f.max_code);
  const __m256i nan_code = _mm256_set1_epi32(0x7f);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_div_ps(_mm256_loadu_ps(in + i), s));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(bits, 31), 7);
    const __m256i magnitude = _mm256_and_si256(bits, abs_mask);
    // Normal: keep mantissa_bits, nearest even (a carry into the exponent is correct).
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(magnitude, shift), one);
    const __m256i kept = _mm256_srli_epi32(
        _mm256_add_epi32(magnitude, _mm256_add_epi32(half_minus_one, odd)), shift);
    __m256i code = _mm256_sub_epi32(kept, rebias);
    // Subnormal: the magnitude scaled exactly to units of the smallest subnormal, rounded
    // to nearest even whatever the rounding mode.
    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(magnitude), to_subnormal);
    const __m256i subnormal = _mm256_cvttps_epi32(
        _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    code = _mm256_blendv_epi8(code, subnormal, _mm256_cmpgt_epi32(normal_bits, magnitude));
    const __m256i saturated = _mm256_or_si256(_mm256_cmpgt_epi32(magnitude, max_bits),
                                              _mm256_cmpeq_epi32(magnitude, max_bits));
    code = _mm256_blendv_epi8(code, max_code, saturated);
    code = _mm256_blendv_epi8(code, nan_code, _mm256_cmpgt_epi32(magnitude, nan_above));
    code = _mm256_or_si256(code, sign);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code),
                                           _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(words, words));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t MaxMagnitudeAvx2(const float* in, int64_t count,
                                                         float* found) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {  // max_ps keeps the running max when a lane is NaN
    m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(in + i), abs_mask), m0);
    m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(in + i + 8), abs_mask), m1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (float lane : lanes) *found = std::max(*found, lane);
  return i;
}
#endif

}  // namespace

float MaxMagnitude(const float* in, int64_t count) {
  float found = 0.0f;
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasAvx2()) i = MaxMagnitudeAvx2(in, count, &found);
#endif
  for (; i < count; ++i) {
    const float x = std::fabs(in[i]);
    if (x > found) found = x;
  }
  return found;
}

float Fp8ScaleFor(float amax, DType dtype) {
  return amax > 0.0f ? std::max(amax / Fp8MaxFinite(dtype), std::numeric_limits<float>::min())
                     : 1.0f;
}

void WidenFp8(const uint8_t* codes, int64_t count, DType dtype, float scale, float* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasAvx2()) i = WidenFp8Avx2(codes, count, dtype, scale, out);
#endif
  for (; i < count; ++i) out[i] = Fp8ToFloat(codes[i], dtype) * scale;
}

void NarrowToFp8(const float* in, int64_t count, DType dtype, float scale, uint8_t* codes) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasAvx2()) i = NarrowToFp8Avx2(in, count, dtype, scale, codes);
#endif
  for (; i < count; ++i) codes[i] = FloatToFp8(in[i] / scale, dtype);
}

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
    case DType::kFp8E5M2:
      WidenFp8(static_cast<const uint8_t*>(data) + first, count, dtype, 1.0f, out);
      return;
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
    case DType::kFp8E5M2:
      NarrowToFp8(in, count, dtype, 1.0f, static_cast<uint8_t*>(data) + first);
      return;
  }
}

}  // namespace centroidkv
