// Element types of KV tensors and the scalar conversions between them.
// fp16 (IEEE binary16) and bf16 are widened to float exactly; narrowing rounds to nearest,
// ties to even, as the hardware does. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace centroidkv {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// Bytes per element: 4, 2, 2.
constexpr int32_t DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// "float32", "float16", "bfloat16".
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

// Reads element `index` of a buffer of `dtype` as float.
inline float LoadAsFloat(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[index];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[index]);
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
  }
}

// Bulk forms, bit-identical to the scalar ones: `count` elements of a buffer of `dtype`
// from element `first` on, widened into `out`; and `count` floats rounded into a buffer of
// `dtype` from element `first` on. fp16 uses F16C when the CPU has it (the data paths of the
// service convert whole tensors; the scalar call per element was ~20% of a server's time).
void LoadAsFloats(const void* data, DType dtype, int64_t first, int64_t count, float* out);
void StoreFromFloats(void* data, DType dtype, int64_t first, int64_t count, const float* in);

}  // namespace centroidkv
