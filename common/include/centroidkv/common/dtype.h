// Element types of KV tensors and the scalar conversions between them.
// fp16 (IEEE binary16) and bf16 are widened to float exactly; narrowing rounds to nearest,
// ties to even, as the hardware does. The two OCP fp8 formats (E4M3 "fn": no infinities,
// finite maximum 448; E5M2: finite maximum 57344) widen exactly too, and narrow to nearest
// even saturating to the finite maximum (an overflow never becomes NaN or Inf, as CUDA's
// __NV_SATFINITE conversion). An fp8 tensor stands for its elements times a scale
// (LayerView::key_scales,
// CompressResult::key_scales); these conversions are of the raw, unscaled elements. Thread-safe: pure
// functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace centroidkv {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFp8E4M3, kFp8E5M2 };

constexpr bool IsFp8(DType dtype) {
  return dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2;
}

// Bytes per element: 4, 2, 2, 1, 1.
constexpr int32_t DTypeSize(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : IsFp8(dtype) ? 1 : 2;
}

// The largest finite value of an fp8 format: 448 (E4M3), 57344 (E5M2).
constexpr float Fp8MaxFinite(DType dtype) {
  return dtype == DType::kFp8E4M3 ? 448.0f : 57344.0f;
}

// "float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2".
std::string_view DTypeName(DType dtype);

inline float BFloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// fp8 (dtype kFp8E4M3 or kFp8E5M2) <-> float. Widening is exact (a table); narrowing
// rounds to nearest even and saturates to +-Fp8MaxFinite (Inf included); NaN stays NaN
// (0x7f / 0xff in both formats).
float Fp8ToFloat(uint8_t bits, DType dtype);
uint8_t FloatToFp8(float value, DType dtype);

// Reads element `index` of a buffer of `dtype` as float.
inline float LoadAsFloat(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[index];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
      return Fp8ToFloat(static_cast<const uint8_t*>(data)[index], dtype);
  }
  return 0.0f;
}

// Writes `value` rounded to `dtype` into element `index`.
inline void StoreFromFloat(void* data, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(data)[index] = value;
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(data)[index] = FloatToHalf(value);
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(data)[index] = FloatToBFloat16(value);
      return;
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
      static_cast<uint8_t*>(data)[index] = FloatToFp8(value, dtype);
      return;
  }
}

// Bulk forms, bit-identical to the scalar ones: `count` elements of a buffer of `dtype`
// from element `first` on, widened into `out`; and `count` floats rounded into a buffer of
// `dtype` from element `first` on. fp16 uses F16C when the CPU has it (the data paths of the
// service convert whole tensors; the scalar call per element was ~20% of a server's time).
void LoadAsFloats(const void* data, DType dtype, int64_t first, int64_t count, float* out);
void StoreFromFloats(void* data, DType dtype, int64_t first, int64_t count, const float* in);

// fp8 with a scale, in bulk (AVX2 when the CPU has it), bit-identical to the scalar forms:
// out[i] = Fp8ToFloat(codes[i], dtype) * scale, and codes[i] = FloatToFp8(in[i] / scale,
// dtype) (one float multiply / division each).
void WidenFp8(const uint8_t* codes, int64_t count, DType dtype, float scale, float* out);
void NarrowToFp8(const float* in, int64_t count, DType dtype, float scale, uint8_t* codes);

// The largest |in[i]| of `count` floats (0 for none; NaN ignored), AVX2 where the CPU has it.
float MaxMagnitude(const float* in, int64_t count);

// The dynamic fp8 scale of rows whose largest magnitude is `amax`: it maps amax to the
// format's maximum (1 for all-zero rows; never below FLT_MIN, so that dividing by it stays
// finite).
float Fp8ScaleFor(float amax, DType dtype);

}  // namespace centroidkv
