// The fit's elementwise kernels (KernelTable::fit_add_max / fit_exp_sub_sum), one template
// over the vector traits (vec_avx2.h, vec_avx512.h): e^x is Cephes' expf, a degree-5
// polynomial on the range-reduced argument times 2^k. Internal linkage (see vec_avx512.h).
#pragma once

#include <cstdint>

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

template <class V>
typename V::F ExpVector(typename V::F x) {
  using F = typename V::F;
  x = V::Min(V::Max(x, V::Set1(-87.3f)), V::Set1(88.7f));
  const F k = V::RoundNearest(V::Mul(x, V::Set1(1.44269504088896341f)));
  // x - k ln 2, with ln 2 in two parts so that the reduction is exact enough.
  x = V::Fma(k, V::Set1(-0.693359375f), x);
  x = V::Fma(k, V::Set1(2.12194440e-4f), x);
  F p = V::Set1(1.9875691500e-4f);
  p = V::Fma(p, x, V::Set1(1.3981999507e-3f));
  p = V::Fma(p, x, V::Set1(8.3334519073e-3f));
  p = V::Fma(p, x, V::Set1(4.1665795894e-2f));
  p = V::Fma(p, x, V::Set1(1.6666665459e-1f));
  p = V::Fma(p, x, V::Set1(5.0000001201e-1f));
  p = V::Fma(p, V::Mul(x, x), V::Add(x, V::Set1(1.0f)));
  return V::Mul(p, V::Pow2(k));
}

// x[i] += bias[i] for i < count; returns the largest x[i] (-inf for count 0).
template <class V>
float AddMax(float* x, const float* bias, int64_t count) {
  using F = typename V::F;
  F top = V::Set1(-__builtin_inff());
  int64_t i = 0;
  for (; i + V::kW <= count; i += V::kW) {
    const F y = V::Add(V::Load(x + i), V::Load(bias + i));
    V::Store(x + i, y);
    top = V::Max(top, y);
  }
  float best = V::HMax(top);
  for (; i < count; ++i) {
    x[i] += bias[i];
    best = x[i] > best ? x[i] : best;
  }
  return best;
}

// x[i] = e^(x[i] - shift) for i < count; returns their sum (lanes added in float).
template <class V>
float ExpSubSum(float* x, float shift, int64_t count) {
  using F = typename V::F;
  const F minus_shift = V::Set1(-shift);
  F sum = V::Zero();
  int64_t i = 0;
  for (; i + V::kW <= count; i += V::kW) {
    const F y = ExpVector<V>(V::Add(V::Load(x + i), minus_shift));
    V::Store(x + i, y);
    sum = V::Add(sum, y);
  }
  float total = V::HSum(sum);
  if (i < count) {
    float lanes[V::kW];
    for (int64_t k = 0; k < V::kW; ++k) lanes[k] = -__builtin_inff();
    for (int64_t k = i; k < count; ++k) lanes[k - i] = x[k] - shift;
    V::Store(lanes, ExpVector<V>(V::Load(lanes)));
    for (int64_t k = i; k < count; ++k) {
      x[k] = lanes[k - i];
      total += lanes[k - i];
    }
  }
  return total;
}

}  // namespace
}  // namespace centroidkv::cpu
