// The CPU engine's check that input rows hold no Inf or NaN (an all-ones exponent field; fp8:
// a NaN code, or a scale that makes a value overflow), as one template with internal linkage
// that each kernel translation unit compiles with its own instruction set (kernels_scalar.cc,
// simd/make_table.h). Integer bit tests in fixed-length blocks, which the compiler vectorises
// at -O2.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

// Whether fp8 rows first .. first + count - 1 widen to finite floats (no code times the
// scale overflows), code by code; defined in kernels_scalar.cc, compiled without SIMD flags
// (this header is compiled for every level).
bool Fp8RowsWidenFinite(const RowBlock& rows, int64_t first, int32_t count, int32_t dim);

namespace {  // NOLINT(build/namespaces): one copy per kernel translation unit, by design

// Whether none of `count` consecutive elements has every bit of `mask` set: vectors of the
// including translation unit's native width (GCC vector extensions) with one running OR,
// reduced once at the end. The width matters: a 64-byte vector in an AVX2 unit is lowered
// to lane-by-lane code through the stack, ~5x slower than two ymm (measured).
#if defined(__AVX512F__)
constexpr int kNativeVectorBytes = 64;
#elif defined(__AVX2__)
constexpr int kNativeVectorBytes = 32;
#else
constexpr int kNativeVectorBytes = 16;
#endif

template <typename Bits>
struct NativeVector {
  typedef Bits type __attribute__((vector_size(kNativeVectorBytes)));
};

template <typename Bits>
bool NoneAllOnes(const Bits* bits, int64_t count, Bits mask) {
  using Vec = typename NativeVector<Bits>::type;
  using Mask = decltype(Vec{} == Vec{});
  constexpr int64_t kLanes = kNativeVectorBytes / sizeof(Bits);
  const Vec m = Vec{} + mask;
  Mask found = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Vec x;
    __builtin_memcpy(&x, bits + i, sizeof(x));
    found |= (x & m) == m;
  }
  bool any = false;
  for (int64_t k = 0; k < kLanes; ++k) any |= found[k] != 0;
  for (; i < count; ++i) any |= (bits[i] & mask) == mask;
  return !any;
}

template <typename Bits>
bool RowsFiniteTyped(const RowBlock& rows, int64_t first, int32_t count, int32_t dim, Bits mask) {
  const Bits* base = static_cast<const Bits*>(rows.data) + first * rows.stride;
  if (rows.stride == dim) return NoneAllOnes(base, int64_t{count} * dim, mask);
  bool finite = true;
  for (int32_t i = 0; i < count; ++i) finite &= NoneAllOnes(base + i * rows.stride, dim, mask);
  return finite;
}

// fp8 rows: no NaN code (nor, E5M2, Inf), and no code whose value times the scale overflows
// to Inf. That needs a look at each code only when the format's largest value would
// (scales above ~1e33).
bool RowsFiniteFp8(const RowBlock& rows, int64_t first, int32_t count, int32_t dim) {
  const bool e4m3 = rows.type == ElemType::kE4M3;
  const uint8_t special = e4m3 ? 0x7f : 0x7c;
  if (!RowsFiniteTyped<uint8_t>(rows, first, count, dim, special)) return false;
  const float largest = e4m3 ? 448.0f : 57344.0f;
  if (largest * rows.scale <= 3.4028234663852886e38f) return true;
  return Fp8RowsWidenFinite(rows, first, count, dim);
}

// KernelTable::rows_finite.
bool RowsFinite(const RowBlock* rows, int64_t first, int32_t count, int32_t dim) {
  switch (rows->type) {
    case ElemType::kE4M3:
    case ElemType::kE5M2:
      return RowsFiniteFp8(*rows, first, count, dim);
    case ElemType::kF32:
      return RowsFiniteTyped<uint32_t>(*rows, first, count, dim, 0x7f800000u);
    case ElemType::kF16:
      return RowsFiniteTyped<uint16_t>(*rows, first, count, dim, 0x7c00u);
    case ElemType::kBF16:
      return RowsFiniteTyped<uint16_t>(*rows, first, count, dim, 0x7f80u);
    case ElemType::kF64:
      return RowsFiniteTyped<uint64_t>(*rows, first, count, dim, 0x7ff0000000000000u);
  }
  return false;
}

}  // namespace
}  // namespace centroidkv::cpu
