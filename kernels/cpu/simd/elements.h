// Typed element access shared by the SIMD kernel templates: row addresses, and scalar and
// vector widening of the four element types (ElemType). Included after vec_avx512.h or
// vec_avx2.h in a SIMD translation unit; internal linkage (see vec_avx512.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

template <ElemType T>
struct ElemTraits;
template <>
struct ElemTraits<ElemType::kF32> {
  using Storage = float;
};
template <>
struct ElemTraits<ElemType::kF16> {
  using Storage = uint16_t;
};
template <>
struct ElemTraits<ElemType::kBF16> {
  using Storage = uint16_t;
};
template <>
struct ElemTraits<ElemType::kF64> {
  using Storage = double;
};

template <ElemType T>
using Storage = typename ElemTraits<T>::Storage;

template <ElemType T>
const Storage<T>* RowPointer(const RowBlock& rows, int64_t row) {
  return static_cast<const Storage<T>*>(rows.data) + row * rows.stride;
}

template <ElemType T>
float WidenToFloat(const Storage<T>* p, int32_t j) {
  if constexpr (T == ElemType::kF32) {
    return p[j];
  } else if constexpr (T == ElemType::kF16) {
    return _cvtsh_ss(p[j]);
  } else if constexpr (T == ElemType::kBF16) {
    const uint32_t bits = static_cast<uint32_t>(p[j]) << 16;
    float out;
    __builtin_memcpy(&out, &bits, sizeof(out));
    return out;
  } else {
    return static_cast<float>(p[j]);
  }
}

// Exact: every float is a double, and rows of kF64 are read as they are.
template <ElemType T>
double WidenToDouble(const Storage<T>* p, int32_t j) {
  if constexpr (T == ElemType::kF64) {
    return p[j];
  } else {
    return static_cast<double>(WidenToFloat<T>(p, j));
  }
}

// V::kW elements from p + j, as float.
template <class V, ElemType T>
typename V::F LoadFloats(const Storage<T>* p, int32_t j) {
  if constexpr (T == ElemType::kF32) {
    return V::LoadF32(p + j);
  } else if constexpr (T == ElemType::kF16) {
    return V::LoadF16(p + j);
  } else if constexpr (T == ElemType::kBF16) {
    return V::LoadBF16(p + j);
  } else {
    return V::LoadF64(p + j);
  }
}

// V::kWD elements from p + j, as double.
template <class V, ElemType T>
typename V::D LoadDoubles(const Storage<T>* p, int32_t j) {
  if constexpr (T == ElemType::kF32) {
    return V::LoadDF32(p + j);
  } else if constexpr (T == ElemType::kF16) {
    return V::LoadDF16(p + j);
  } else if constexpr (T == ElemType::kBF16) {
    return V::LoadDBF16(p + j);
  } else {
    return V::LoadDF64(p + j);
  }
}

inline double MaxDouble(double a, double b) { return a > b ? a : b; }
inline float MaxFloat(float a, float b) { return a > b ? a : b; }

}  // namespace
}  // namespace centroidkv::cpu
