// fp8 codes as fp16 bit patterns, for the SIMD kernels' fp8 loads (vec_avx2.h,
// vec_avx512.h, elements.h): F16C then widens them to float, exactly, as it widens fp16
// rows. Internal linkage (see vec_avx512.h).
//
// E5M2 is the top byte of an fp16 (same exponent width and bias): code << 8, infinities and
// NaN included. E4M3's magnitude shifted into fp16's place, (code & 0x7f) << 7, is an fp16
// of exactly value / 2^8 (its bias is 15 against E4M3's 7, and E4M3's subnormals land on
// fp16 subnormals with the same shift), so value = fp16 x 256; its NaN code (S.1111.111)
// gets an all-ones fp16 exponent, so that it widens to NaN as the reference's table gives.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

// What the widened fp16 is multiplied by (exactly) to give the code's value.
constexpr float Fp8HalfFactor(ElemType type) { return type == ElemType::kE4M3 ? 256.0f : 1.0f; }

// `codes`: any integer vector (GCC vector extension, or an __m128i / __m256i) of codes
// zero-extended to 16-bit lanes; returns the fp16 bits of each, in the same type.
template <ElemType T, typename Bits>
Bits Fp8HalfBits(Bits codes) {
  typedef uint16_t Lanes __attribute__((vector_size(sizeof(Bits))));
  const Lanes c = (Lanes)codes;  // NOLINT: a vector cast, the same bits
  if constexpr (T == ElemType::kE5M2) {
    return (Bits)(c << 8);  // NOLINT
  } else {
    const Lanes magnitude = c & 0x7f;
    const Lanes nan = (Lanes)(magnitude == 0x7f) & 0x7c00;  // NOLINT
    return (Bits)(((c & 0x80) << 8) | (magnitude << 7) | nan);  // NOLINT
  }
}

// One code.
template <ElemType T>
uint16_t Fp8HalfBits(uint8_t code) {
  if constexpr (T == ElemType::kE5M2) {
    return static_cast<uint16_t>(code << 8);
  } else {
    const uint32_t magnitude = code & 0x7fu;
    return static_cast<uint16_t>(((code & 0x80u) << 8) | (magnitude << 7) |
                                 (magnitude == 0x7fu ? 0x7c00u : 0u));
  }
}

}  // namespace
}  // namespace centroidkv::cpu
