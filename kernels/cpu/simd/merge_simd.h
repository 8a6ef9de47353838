// The exact merge and row conversion kernels (kernel_table.h) as templates over a vector
// traits class V: count-weighted sums in float64 with the reference engine's operation order
// (every lane is one element j, so vectorising over j changes no rounding), and the division
// by the total count through V::DivideExact. Internal linkage (see vec_avx512.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/elements.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

template <class V, typename Out>
void StoreDoubles(Out* p, typename V::D x) {
  if constexpr (sizeof(Out) == sizeof(float)) {
    V::StoreDAsFloat(p, x);
  } else {
    V::StoreD(p, x);
  }
}

// Two terms of count 1 into float: the reference computes (x0 + x1) / 2 in float64 and
// rounds to float. For float inputs x0, x1 that equals (x0 + x1) * 0.5 computed in float:
// rounding the exact sum to double and then to float is the same as rounding it to float
// once (Figueroa, "When is double rounding innocuous?", 1995: 53 >= 2 * 24 + 1), and
// halving is exact unless the result is subnormal. Vectors where the float sum overflows or
// the result may be subnormal take the float64 path.
template <class V, ElemType T>
void MeanOfPairToFloat(const Storage<T>* x0, const Storage<T>* x1, int32_t dim, float* out) {
  using F = typename V::F;
  constexpr int32_t W = V::kW, WD = V::kWD;
  const F half = V::Set1(0.5f);
  int32_t j = 0;
  for (; j + W <= dim; j += W) {
    const F sum = V::Add(LoadFloats<V, T>(x0, j), LoadFloats<V, T>(x1, j));
    if (!V::HalfSumUnsafe(sum)) {
      V::Store(out + j, V::Mul(sum, half));
      continue;
    }
    for (int32_t k = j; k < j + W; k += WD) {
      const typename V::D s = V::AddD(LoadDoubles<V, T>(x0, k), LoadDoubles<V, T>(x1, k));
      V::StoreDAsFloat(out + k, V::MulD(s, V::Set1D(0.5)));
    }
  }
  for (; j < dim; ++j) {
    out[j] = static_cast<float>((WidenToDouble<T>(x0, j) + WidenToDouble<T>(x1, j)) * 0.5);
  }
}

// The general float64 merge. kPowerOfTwo: the total is a power of two, so dividing by it is
// multiplying by its exact reciprocal.
template <class V, ElemType T, typename Out, bool kPowerOfTwo>
void MergeTermsInDouble(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms,
                        double total, int32_t dim, Out* out) {
  using D = typename V::D;
  constexpr int32_t WD = V::kWD;
  const D t = V::Set1D(total);
  const D y = V::Set1D(1.0 / total);
  const D half_t = V::Set1D(0.5 * total);
  auto quotient = [&](D sum) {
    return kPowerOfTwo ? V::MulD(sum, y) : V::DivideExact(sum, t, y, half_t);
  };
  int32_t j = 0;
  for (; j + 2 * WD <= dim; j += 2 * WD) {
    const Storage<T>* row = RowPointer<T>(rows, terms[0].row);
    D c = V::Set1D(terms[0].count);
    D s0 = V::MulD(c, LoadDoubles<V, T>(row, j));
    D s1 = V::MulD(c, LoadDoubles<V, T>(row, j + WD));
    for (int32_t k = 1; k < num_terms; ++k) {
      row = RowPointer<T>(rows, terms[k].row);
      c = V::Set1D(terms[k].count);
      s0 = V::AddD(s0, V::MulD(c, LoadDoubles<V, T>(row, j)));
      s1 = V::AddD(s1, V::MulD(c, LoadDoubles<V, T>(row, j + WD)));
    }
    StoreDoubles<V>(out + j, quotient(s0));
    StoreDoubles<V>(out + j + WD, quotient(s1));
  }
  for (; j + WD <= dim; j += WD) {
    D s =
        V::MulD(V::Set1D(terms[0].count), LoadDoubles<V, T>(RowPointer<T>(rows, terms[0].row), j));
    for (int32_t k = 1; k < num_terms; ++k) {
      s = V::AddD(s, V::MulD(V::Set1D(terms[k].count),
                             LoadDoubles<V, T>(RowPointer<T>(rows, terms[k].row), j)));
    }
    StoreDoubles<V>(out + j, quotient(s));
  }
  for (; j < dim; ++j) {
    double s = terms[0].count * WidenToDouble<T>(RowPointer<T>(rows, terms[0].row), j);
    for (int32_t k = 1; k < num_terms; ++k) {
      s += terms[k].count * WidenToDouble<T>(RowPointer<T>(rows, terms[k].row), j);
    }
    out[j] = static_cast<Out>(s / total);
  }
}

// Sums c_k * row_k term by term in float64 (the reference's order), then divides by the
// total, correctly rounded; every lane is one element j, so vectorising over j changes no
// rounding. Multiplying by a count of 1 is exact, so the code does it regardless.
template <class V, ElemType T, typename Out>
void MergeRowTyped(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms, double total,
                   int32_t dim, Out* out) {
  if constexpr (sizeof(Out) == sizeof(float) && T != ElemType::kF64) {
    if (num_terms == 2 && terms[0].count == 1.0 && terms[1].count == 1.0) {
      return MeanOfPairToFloat<V, T>(RowPointer<T>(rows, terms[0].row),
                                     RowPointer<T>(rows, terms[1].row), dim, out);
    }
  }
  const auto integer_total = static_cast<uint64_t>(total);
  if ((integer_total & (integer_total - 1)) == 0) {
    MergeTermsInDouble<V, T, Out, true>(rows, terms, num_terms, total, dim, out);
  } else {
    MergeTermsInDouble<V, T, Out, false>(rows, terms, num_terms, total, dim, out);
  }
}

template <class V, typename Out>
void MergeRow(const RowBlock* rows, const MergeTerm* terms, int32_t num_terms, double total,
              int32_t dim, Out* out) {
  switch (rows->type) {
    case ElemType::kF32:
      return MergeRowTyped<V, ElemType::kF32>(*rows, terms, num_terms, total, dim, out);
    case ElemType::kF16:
      return MergeRowTyped<V, ElemType::kF16>(*rows, terms, num_terms, total, dim, out);
    case ElemType::kBF16:
      return MergeRowTyped<V, ElemType::kBF16>(*rows, terms, num_terms, total, dim, out);
    case ElemType::kF64:
      return MergeRowTyped<V, ElemType::kF64>(*rows, terms, num_terms, total, dim, out);
  }
}

template <class V, ElemType T>
void ConvertRowTyped(const Storage<T>* row, int32_t dim, float* out) {
  constexpr int32_t W = V::kW;
  int32_t j = 0;
  for (; j + W <= dim; j += W) V::Store(out + j, LoadFloats<V, T>(row, j));
  for (; j < dim; ++j) out[j] = WidenToFloat<T>(row, j);
}

template <class V, ElemType T>
void ConvertRowTyped(const Storage<T>* row, int32_t dim, double* out) {
  constexpr int32_t WD = V::kWD;
  int32_t j = 0;
  for (; j + WD <= dim; j += WD) V::StoreD(out + j, LoadDoubles<V, T>(row, j));
  for (; j < dim; ++j) out[j] = WidenToDouble<T>(row, j);
}

template <class V, typename Out>
void ConvertRow(const RowBlock* rows, int64_t row, int32_t dim, Out* out) {
  switch (rows->type) {
    case ElemType::kF32:
      return ConvertRowTyped<V, ElemType::kF32>(RowPointer<ElemType::kF32>(*rows, row), dim, out);
    case ElemType::kF16:
      return ConvertRowTyped<V, ElemType::kF16>(RowPointer<ElemType::kF16>(*rows, row), dim, out);
    case ElemType::kBF16:
      return ConvertRowTyped<V, ElemType::kBF16>(RowPointer<ElemType::kBF16>(*rows, row), dim, out);
    case ElemType::kF64:
      return ConvertRowTyped<V, ElemType::kF64>(RowPointer<ElemType::kF64>(*rows, row), dim, out);
  }
}

template <class V>
void ConvertRows(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out) {
  for (int32_t i = 0; i < count; ++i) {
    float* dst = out + static_cast<int64_t>(i) * dim;
    switch (rows->type) {
      case ElemType::kF32:
        ConvertRowTyped<V, ElemType::kF32>(RowPointer<ElemType::kF32>(*rows, first + i), dim, dst);
        break;
      case ElemType::kF16:
        ConvertRowTyped<V, ElemType::kF16>(RowPointer<ElemType::kF16>(*rows, first + i), dim, dst);
        break;
      case ElemType::kBF16:
        ConvertRowTyped<V, ElemType::kBF16>(RowPointer<ElemType::kBF16>(*rows, first + i), dim,
                                            dst);
        break;
      case ElemType::kF64:
        ConvertRowTyped<V, ElemType::kF64>(RowPointer<ElemType::kF64>(*rows, first + i), dim, dst);
        break;
    }
  }
}

}  // namespace
}  // namespace centroidkv::cpu
