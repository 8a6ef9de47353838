// fp8 elements of a RowBlock (kernel_table.h) for the CPU engine's code compiled without SIMD
// flags: their dtype, and each code widened as the reference widens it (common/dtype.h's
// value of the code times the row's scale, one float multiply). The SIMD levels widen in
// their own loads (simd/fp8_bits.h), to the same floats.
#pragma once

#include <cstdint>

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

// The dtype of fp8 rows (type kE4M3 or kE5M2).
inline DType Fp8DTypeOf(ElemType type) {
  return type == ElemType::kE4M3 ? DType::kFp8E4M3 : DType::kFp8E5M2;
}

// A code of fp8 `rows`, widened.
inline float WidenFp8Element(const RowBlock& rows, uint8_t code) {
  return Fp8ToFloat(code, Fp8DTypeOf(rows.type)) * rows.scale;
}

}  // namespace centroidkv::cpu
