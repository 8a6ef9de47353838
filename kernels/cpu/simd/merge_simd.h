// The exact merge and row conversion kernels (kernel_table.h) as templates over a vector
// traits class V: count-weighted sums in float64 with the reference engine's operation order
// (every lane is one element j, so vectorising over j changes no rounding), and a quotient
// by the total count that is the correctly rounded one (see MergeTermsInDouble). Internal
// linkage (see vec_avx512.h).
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
// halving is exact unless the result is subnormal. A row where some float sum overflows or
// some result may be subnormal (V::HalfSums, tested once per row) is done again in float64.
template <class V, ElemType T>
void MeanOfPairToFloat(TypedRow<T> x0, TypedRow<T> x1, int32_t dim, float* out) {
  using F = typename V::F;
  constexpr int32_t W = V::kW, WD = V::kWD;
  const F half = V::Set1(0.5f);
  typename V::HalfSums sums = V::NoHalfSums();
  int32_t j = 0;
  for (; j + W <= dim; j += W) {
    const F sum = V::Add(LoadFloats<V, T>(x0, j), LoadFloats<V, T>(x1, j));
    V::FoldHalfSum(sum, &sums);
    V::Store(out + j, V::Mul(sum, half));
  }
  const int32_t vectors_end = j;
  if (V::AnyHalfSumUnsafe(sums)) {
    for (int32_t k = 0; k < vectors_end; k += WD) {
      const typename V::D s = V::AddD(LoadDoubles<V, T>(x0, k), LoadDoubles<V, T>(x1, k));
      V::StoreDAsFloat(out + k, V::MulD(s, V::Set1D(0.5)));
    }
  }
  for (; j < dim; ++j) {
    out[j] = static_cast<float>((WidenToDouble<T>(x0, j) + WidenToDouble<T>(x1, j)) * 0.5);
  }
}

// The general float64 merge. kUnitCounts: every count is 1, and 1 * x is x exactly, so the
// products are skipped. kPowerOfTwo: the total is a power of two, so dividing by it is
// multiplying by its exact reciprocal. Otherwise, into float, the quotient is s * RN(1/t),
// within three ulps of the correctly rounded s / t, which rounds to the same float unless it
// lies next to a rounding boundary of float (V::MayRoundToFloatOtherwise, a few vectors in
// 10^7 on random data): such a row is done again with the exact division (kExactDivision;
// returns whether it must be). Into double, the division is V::DivideExact.
template <class V, ElemType T, typename Out, bool kPowerOfTwo, bool kUnitCounts,
          bool kExactDivision = false>
bool MergeTermsInDouble(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms,
                        double total, int32_t dim, Out* out) {
  using D = typename V::D;
  constexpr int32_t WD = V::kWD;
  const D t = V::Set1D(total);
  const D y = V::Set1D(1.0 / total);
  const D half_t = V::Set1D(0.5 * total);
  bool redo = false;
  auto quotient = [&](D sum) {
    if constexpr (kPowerOfTwo) {
      return V::MulD(sum, y);
    } else if constexpr (sizeof(Out) == sizeof(float) && !kExactDivision) {
      const D q = V::MulD(sum, y);
      redo |= V::MayRoundToFloatOtherwise(q);
      return q;
    } else {
      return V::DivideExact(sum, t, y, half_t);
    }
  };
  auto term = [](double count, D x) { return kUnitCounts ? x : V::MulD(V::Set1D(count), x); };
  int32_t j = 0;
  for (; j + 2 * WD <= dim; j += 2 * WD) {
    TypedRow<T> row = RowAt<T>(rows, terms[0].row);
    D s0 = term(terms[0].count, LoadDoubles<V, T>(row, j));
    D s1 = term(terms[0].count, LoadDoubles<V, T>(row, j + WD));
    for (int32_t k = 1; k < num_terms; ++k) {
      row = RowAt<T>(rows, terms[k].row);
      s0 = V::AddD(s0, term(terms[k].count, LoadDoubles<V, T>(row, j)));
      s1 = V::AddD(s1, term(terms[k].count, LoadDoubles<V, T>(row, j + WD)));
    }
    StoreDoubles<V>(out + j, quotient(s0));
    StoreDoubles<V>(out + j + WD, quotient(s1));
  }
  for (; j + WD <= dim; j += WD) {
    D s = term(terms[0].count, LoadDoubles<V, T>(RowAt<T>(rows, terms[0].row), j));
    for (int32_t k = 1; k < num_terms; ++k) {
      s = V::AddD(s, term(terms[k].count, LoadDoubles<V, T>(RowAt<T>(rows, terms[k].row), j)));
    }
    StoreDoubles<V>(out + j, quotient(s));
  }
  for (; j < dim; ++j) {
    double s = terms[0].count * WidenToDouble<T>(RowAt<T>(rows, terms[0].row), j);
    for (int32_t k = 1; k < num_terms; ++k) {
      s += terms[k].count * WidenToDouble<T>(RowAt<T>(rows, terms[k].row), j);
    }
    out[j] = static_cast<Out>(s / total);
  }
  return redo;
}

template <class V, ElemType T, typename Out, bool kPowerOfTwo, bool kUnitCounts>
void MergeTermsInDoubleExact(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms,
                             double total, int32_t dim, Out* out) {
  if (MergeTermsInDouble<V, T, Out, kPowerOfTwo, kUnitCounts>(rows, terms, num_terms, total, dim,
                                                              out)) {
    MergeTermsInDouble<V, T, Out, kPowerOfTwo, kUnitCounts, true>(rows, terms, num_terms, total,
                                                                  dim, out);
  }
}

template <class V, ElemType T, typename Out, bool kPowerOfTwo>
void MergeTermsWithTotal(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms,
                         double total, int32_t dim, Out* out) {
  bool unit_counts = true;
  for (int32_t k = 0; k < num_terms; ++k) unit_counts &= terms[k].count == 1.0;
  if (unit_counts) {
    MergeTermsInDoubleExact<V, T, Out, kPowerOfTwo, true>(rows, terms, num_terms, total, dim, out);
  } else {
    MergeTermsInDoubleExact<V, T, Out, kPowerOfTwo, false>(rows, terms, num_terms, total, dim, out);
  }
}

// Sums c_k * row_k term by term in float64 (the reference's order), then divides by the
// total, correctly rounded; every lane is one element j, so vectorising over j changes no
// rounding.
template <class V, ElemType T, typename Out>
void MergeRowTyped(const RowBlock& rows, const MergeTerm* terms, int32_t num_terms, double total,
                   int32_t dim, Out* out) {
  if constexpr (sizeof(Out) == sizeof(float) && T != ElemType::kF64) {
    if (num_terms == 2 && terms[0].count == 1.0 && terms[1].count == 1.0) {
      return MeanOfPairToFloat<V, T>(RowAt<T>(rows, terms[0].row),
                                     RowAt<T>(rows, terms[1].row), dim, out);
    }
  }
  const auto integer_total = static_cast<uint64_t>(total);
  if ((integer_total & (integer_total - 1)) == 0) {
    MergeTermsWithTotal<V, T, Out, true>(rows, terms, num_terms, total, dim, out);
  } else {
    MergeTermsWithTotal<V, T, Out, false>(rows, terms, num_terms, total, dim, out);
  }
}

template <class V, typename Out>
void MergeRow(const RowBlock* rows, const MergeTerm* terms, int32_t num_terms, double total,
              int32_t dim, Out* out) {
  WithElemType(rows->type, [&]<ElemType T>() {
    MergeRowTyped<V, T>(*rows, terms, num_terms, total, dim, out);
  });
}

template <class V, ElemType T>
void ConvertRowTyped(TypedRow<T> row, int32_t dim, float* out) {
  constexpr int32_t W = V::kW;
  int32_t j = 0;
  for (; j + W <= dim; j += W) V::Store(out + j, LoadFloats<V, T>(row, j));
  for (; j < dim; ++j) out[j] = WidenToFloat<T>(row, j);
}

template <class V, ElemType T>
void ConvertRowTyped(TypedRow<T> row, int32_t dim, double* out) {
  constexpr int32_t WD = V::kWD;
  int32_t j = 0;
  for (; j + WD <= dim; j += WD) V::StoreD(out + j, LoadDoubles<V, T>(row, j));
  for (; j < dim; ++j) out[j] = WidenToDouble<T>(row, j);
}

template <class V, typename Out>
void ConvertRow(const RowBlock* rows, int64_t row, int32_t dim, Out* out) {
  WithElemType(rows->type,
               [&]<ElemType T>() { ConvertRowTyped<V, T>(RowAt<T>(*rows, row), dim, out); });
}

template <class V>
void ConvertRows(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out) {
  WithElemType(rows->type, [&]<ElemType T>() {
    for (int32_t i = 0; i < count; ++i) {
      ConvertRowTyped<V, T>(RowAt<T>(*rows, first + i), dim, out + static_cast<int64_t>(i) * dim);
    }
  });
}

}  // namespace
}  // namespace centroidkv::cpu
