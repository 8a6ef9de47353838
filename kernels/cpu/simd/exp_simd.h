// e^x over a float array (KernelTable::exp_floats), one template over the vector traits
// (vec_avx2.h, vec_avx512.h): Cephes' expf, a degree-5 polynomial on the range-reduced
// argument times 2^k. Internal linkage (see vec_avx512.h).
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

template <class V>
void ExpFloats(float* x, int64_t count) {
  int64_t i = 0;
  for (; i + V::kW <= count; i += V::kW) V::Store(x + i, ExpVector<V>(V::Load(x + i)));
  if (i == count) return;
  float lanes[V::kW] = {};
  for (int64_t k = i; k < count; ++k) lanes[k - i] = x[k];
  V::Store(lanes, ExpVector<V>(V::Load(lanes)));
  for (int64_t k = i; k < count; ++k) x[k] = lanes[k - i];
}

}  // namespace
}  // namespace centroidkv::cpu
