// Typed element access shared by the SIMD kernel templates: rows, and scalar and vector
// widening of every element type (ElemType), fp8 codes with their row's scale; and the one
// switch from a run-time ElemType to the typed templates. Included after vec_avx512.h or
// vec_avx2.h in a SIMD translation unit; internal linkage (see vec_avx512.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/fp8_bits.h"

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
template <>
struct ElemTraits<ElemType::kE4M3> {
  using Storage = uint8_t;
};
template <>
struct ElemTraits<ElemType::kE5M2> {
  using Storage = uint8_t;
};

template <ElemType T>
using Storage = typename ElemTraits<T>::Storage;

// One row of a RowBlock of type T: its first element, and the scale of an fp8 row.
template <ElemType T>
struct TypedRow {
  const Storage<T>* data;
  float scale;
};

template <ElemType T>
TypedRow<T> RowAt(const RowBlock& rows, int64_t row) {
  return {static_cast<const Storage<T>*>(rows.data) + row * rows.stride, rows.scale};
}

template <ElemType T>
float WidenToFloat(TypedRow<T> row, int32_t j) {
  const Storage<T>* p = row.data;
  if constexpr (T == ElemType::kF32) {
    return p[j];
  } else if constexpr (T == ElemType::kF16) {
    return _cvtsh_ss(p[j]);
  } else if constexpr (T == ElemType::kBF16) {
    const uint32_t bits = static_cast<uint32_t>(p[j]) << 16;
    float out;
    __builtin_memcpy(&out, &bits, sizeof(out));
    return out;
  } else if constexpr (IsFp8Elem(T)) {
    return _cvtsh_ss(Fp8HalfBits<T>(p[j])) * Fp8HalfFactor(T) * row.scale;
  } else {
    return static_cast<float>(p[j]);
  }
}

// Exact: every float is a double, and rows of kF64 are read as they are.
template <ElemType T>
double WidenToDouble(TypedRow<T> row, int32_t j) {
  if constexpr (T == ElemType::kF64) {
    return row.data[j];
  } else {
    return static_cast<double>(WidenToFloat<T>(row, j));
  }
}

// V::kW elements from element j on, as float.
template <class V, ElemType T>
typename V::F LoadFloats(TypedRow<T> row, int32_t j) {
  const Storage<T>* p = row.data + j;
  if constexpr (T == ElemType::kF32) {
    return V::LoadF32(p);
  } else if constexpr (T == ElemType::kF16) {
    return V::LoadF16(p);
  } else if constexpr (T == ElemType::kBF16) {
    return V::LoadBF16(p);
  } else if constexpr (IsFp8Elem(T)) {
    return V::template LoadFp8<T>(p, row.scale);
  } else {
    return V::LoadF64(p);
  }
}

// V::kWD elements from element j on, as double.
template <class V, ElemType T>
typename V::D LoadDoubles(TypedRow<T> row, int32_t j) {
  const Storage<T>* p = row.data + j;
  if constexpr (T == ElemType::kF32) {
    return V::LoadDF32(p);
  } else if constexpr (T == ElemType::kF16) {
    return V::LoadDF16(p);
  } else if constexpr (T == ElemType::kBF16) {
    return V::LoadDBF16(p);
  } else if constexpr (IsFp8Elem(T)) {
    return V::template LoadDFp8<T>(p, row.scale);
  } else {
    return V::LoadDF64(p);
  }
}

// Calls fn.template operator()<T>() with the ElemType of `type` as a template argument:
// the one switch from a RowBlock's run-time type to the typed kernels.
template <typename Fn>
decltype(auto) WithElemType(ElemType type, Fn&& fn) {
  switch (type) {
    case ElemType::kF32:
      return fn.template operator()<ElemType::kF32>();
    case ElemType::kF16:
      return fn.template operator()<ElemType::kF16>();
    case ElemType::kBF16:
      return fn.template operator()<ElemType::kBF16>();
    case ElemType::kE4M3:
      return fn.template operator()<ElemType::kE4M3>();
    case ElemType::kE5M2:
      return fn.template operator()<ElemType::kE5M2>();
    case ElemType::kF64:
      break;
  }
  return fn.template operator()<ElemType::kF64>();
}

inline double MaxDouble(double a, double b) { return a > b ? a : b; }
inline float MaxFloat(float a, float b) { return a > b ? a : b; }

}  // namespace
}  // namespace centroidkv::cpu
