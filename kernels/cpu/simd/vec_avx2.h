// AVX2 (+ FMA + F16C) vector traits for the shared kernel templates (soft_match_simd.h,
// merge_simd.h). Include only from a translation unit compiled with -mavx2 -mfma -mf16c
// (simd/kernels_avx2.cc). Everything here has internal linkage (see vec_avx512.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/fp8_bits.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

struct Avx2 {
  static constexpr int32_t kW = 8;
  static constexpr int32_t kWD = 4;
  static constexpr int32_t kRowBlock = 6;
  static constexpr int32_t kPanelBlock = 2;
  static constexpr const char* kName = "avx2";
  using F = __m256;
  using I = __m256i;
  using M = __m256;  // compare result, all ones per true lane
  using D = __m256d;

  static F Zero() { return _mm256_setzero_ps(); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F Bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static M Greater(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M FirstLanes(int32_t n) {
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  static F Select(M m, F if_false, F if_true) { return _mm256_blendv_ps(if_false, if_true, m); }
  static I SelectI(M m, I if_false, I if_true) {
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(if_false), _mm256_castsi256_ps(if_true), m));
  }
  static I Iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static I AddI(I a, int32_t b) { return _mm256_add_epi32(a, _mm256_set1_epi32(b)); }
  static void StoreI(int32_t* p, I x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
  static I ZeroI() { return _mm256_setzero_si256(); }
  static I Set1I(int32_t x) { return _mm256_set1_epi32(x); }
  static I MaxI(I a, I b) { return _mm256_max_epi32(a, b); }
  static I MinI(I a, I b) { return _mm256_min_epi32(a, b); }
  static M GreaterI(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  static M EqualI(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b)); }
  static F ToFloat(I x) { return _mm256_cvtepi32_ps(x); }
  static F RoundNearest(F x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^k for integral k in [-126, 127].
  static F Pow2(F k) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
  }
  // Bit l set where lane l of a is at least b (ordered: never for NaN).
  static uint32_t AtLeast(F a, F b) {
    return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)));
  }
  static float HSum(F x) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }

  static float HMax(F x) {
    F t = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 1));
    t = _mm256_max_ps(t, _mm256_shuffle_ps(t, t, 0x4e));
    t = _mm256_max_ps(t, _mm256_shuffle_ps(t, t, 0xb1));
    return _mm256_cvtss_f32(t);
  }

  // See Avx512::ReduceTop2.
  static RowMatch ReduceTop2(F m1, F m2, I idx) {
    const float first = HMax(m1);
    const F at_max = _mm256_cmp_ps(m1, _mm256_set1_ps(first), _CMP_EQ_OQ);
    const int bits = _mm256_movemask_ps(at_max);
    int32_t index[kW];
    StoreI(index, idx);
    int32_t best = 0x7fffffff;
    for (int l = 0; l < kW; ++l) {
      if ((bits >> l) & 1) best = index[l] < best ? index[l] : best;
    }
    if (__builtin_popcount(static_cast<unsigned>(bits)) >= 2) return RowMatch{best, first, first};
    const F others = _mm256_blendv_ps(m1, _mm256_set1_ps(-__builtin_huge_valf()), at_max);
    return RowMatch{best, first, HMax(_mm256_max_ps(others, m2))};
  }

  // See Avx512::InverseNorms.
  static void InverseNorms(float* x, int32_t n) {
    int32_t i = 0;
    for (; i + kWD <= n; i += kWD) {
      const D norm =
          _mm256_max_pd(_mm256_sqrt_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i))), _mm256_set1_pd(1e-6));
      _mm_storeu_ps(x + i, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), norm)));
    }
    for (; i < n; ++i) {
      const double norm = __builtin_sqrt(static_cast<double>(x[i]));
      x[i] = static_cast<float>(1.0 / (norm > 1e-6 ? norm : 1e-6));
    }
  }

  // See Avx512::HalfSums.
  struct HalfSums {
    I small_minus_one;
    I large;
  };
  static HalfSums NoHalfSums() { return {_mm256_set1_epi32(-1), _mm256_setzero_si256()}; }
  static void FoldHalfSum(F sum, HalfSums* sums) {
    const I bits = _mm256_and_si256(_mm256_castps_si256(sum), _mm256_set1_epi32(0x7fffffff));
    sums->small_minus_one =
        _mm256_min_epu32(sums->small_minus_one, _mm256_sub_epi32(bits, _mm256_set1_epi32(1)));
    sums->large = _mm256_max_epu32(sums->large, bits);
  }
  static bool AnyHalfSumUnsafe(const HalfSums& sums) {
    // small_minus_one <= 0x00fffffe (unsigned), or large > 0x7f7fffff (large < 2^31: signed).
    const I small = _mm256_cmpeq_epi32(
        _mm256_min_epu32(sums.small_minus_one, _mm256_set1_epi32(0x00fffffe)), sums.small_minus_one);
    const I large = _mm256_cmpgt_epi32(sums.large, _mm256_set1_epi32(0x7f7fffff));
    return !_mm256_testz_si256(_mm256_or_si256(small, large), _mm256_or_si256(small, large));
  }

  // Copies with non-temporal stores on the 32-byte aligned middle of `out` (no fence);
  // whether every float is finite (its exponent field not all ones).
  static bool StreamFloats(const float* in, int64_t count, float* out) {
    constexpr uint32_t kExponent = 0x7f800000u;
    uint32_t any_exponent_ones = 0;
    int64_t i = 0;
    auto copy_one = [&](int64_t k) {
      out[k] = in[k];
      uint32_t bits;
      __builtin_memcpy(&bits, in + k, sizeof(bits));
      any_exponent_ones |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    };
    for (; i < count && (reinterpret_cast<uintptr_t>(out + i) & 31) != 0; ++i) copy_one(i);
    const __m256i exponent = _mm256_set1_epi32(static_cast<int>(kExponent));
    __m256i non_finite = _mm256_setzero_si256();
    for (; i + 8 <= count; i += 8) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      non_finite = _mm256_or_si256(
          non_finite, _mm256_cmpeq_epi32(_mm256_and_si256(x, exponent), exponent));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), x);
    }
    for (; i < count; ++i) copy_one(i);
    return _mm256_testz_si256(non_finite, non_finite) != 0 && any_exponent_ones == 0;
  }

  // See Avx512::RoundHalves (8 floats).
  static __m128i RoundHalves(__m256 x, ElemType type) {
    if (type == ElemType::kF16) {
      return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)),
                                          _mm256_set1_epi32(0x7fff));
    // |bits| <= 0x7fffffff, so the signed compare is the unsigned one.
    const __m256i nan = _mm256_cmpgt_epi32(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i rounded =
        _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16),
                           _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
    // Each value fits 16 bits: pack (per 128-bit lane), then join the lanes' low halves.
    const __m256i packed = _mm256_packus_epi32(rounded, rounded);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(packed),
                              _mm256_extracti128_si256(packed, 1));
  }

  // See Avx512::StreamHalves: non-temporal stores on the 32-byte aligned middle of `out`;
  // the ends go through a padded 8-float buffer, so every element is rounded the same way.
  static uint32_t StreamHalves(const float* in, int64_t count, ElemType type, uint16_t* out) {
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    // Magnitudes are below 2^31: a signed compare orders them.
    const __m256i below_overflow = _mm256_set1_epi32(static_cast<int32_t>(HalfOverflowBits(type) - 1));
    __m256i non_finite = _mm256_setzero_si256();
    __m256i beyond = _mm256_setzero_si256();
    auto round = [&](__m256 x) {
      const __m256i bits = _mm256_castps_si256(x);
      non_finite = _mm256_or_si256(
          non_finite, _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent));
      beyond = _mm256_or_si256(
          beyond, _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), below_overflow));
      return RoundHalves(x, type);
    };
    auto part = [&](int64_t k, int64_t n) {  // n <= 8 elements
      alignas(32) float padded[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      alignas(16) uint16_t halves[8];
      __builtin_memcpy(padded, in + k, sizeof(float) * static_cast<size_t>(n));
      _mm_store_si128(reinterpret_cast<__m128i*>(halves), round(_mm256_load_ps(padded)));
      __builtin_memcpy(out + k, halves, sizeof(uint16_t) * static_cast<size_t>(n));
    };
    const auto misaligned = static_cast<int64_t>((reinterpret_cast<uintptr_t>(out) & 31) / 2);
    int64_t i = misaligned == 0 ? 0 : 16 - misaligned;
    if (i > count) i = count;
    for (int64_t k = 0; k < i; k += 8) part(k, i - k < 8 ? i - k : 8);
    for (; i + 16 <= count; i += 16) {
      const __m128i lo = round(_mm256_loadu_ps(in + i));
      const __m128i hi = round(_mm256_loadu_ps(in + i + 8));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), _mm256_set_m128i(hi, lo));
    }
    for (; i < count; i += 8) part(i, count - i < 8 ? count - i : 8);
    return (_mm256_testz_si256(non_finite, non_finite) ? 0u : kStreamedNonFinite) |
           (_mm256_testz_si256(beyond, beyond) ? 0u : kStreamedBeyondRange);
  }

  static F LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static F LoadF64(const double* p) {
    return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(p + 4)),
                           _mm256_cvtpd_ps(_mm256_loadu_pd(p)));
  }
  // fp8 codes of format T (kE4M3 or kE5M2): each code's value (fp8_bits.h) times `scale`,
  // one float multiply, as the reference widens them.
  template <ElemType T>
  static F LoadFp8(const uint8_t* p, float scale) {
    const __m128i codes =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m256 x = _mm256_cvtph_ps(Fp8HalfBits<T>(codes));
    if constexpr (T == ElemType::kE4M3) x = _mm256_mul_ps(x, _mm256_set1_ps(Fp8HalfFactor(T)));
    return _mm256_mul_ps(x, _mm256_set1_ps(scale));
  }

  // In-register transpose of 8 rows of 8 floats.
  static void Transpose(F* r) {
    F t[8], s[8];
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
      t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
      s[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
      s[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
      s[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
      s[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
    }
  }

  static D LoadDF32(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
  static D LoadDF16(const uint16_t* p) {
    return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static D LoadDBF16(const uint16_t* p) {
    const __m128i wide = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(wide, 16)));
  }
  template <ElemType T>
  static D LoadDFp8(const uint8_t* p, float scale) {
    int32_t four;
    __builtin_memcpy(&four, p, sizeof(four));
    __m128 x = _mm_cvtph_ps(Fp8HalfBits<T>(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(four))));
    if constexpr (T == ElemType::kE4M3) x = _mm_mul_ps(x, _mm_set1_ps(Fp8HalfFactor(T)));
    return _mm256_cvtps_pd(_mm_mul_ps(x, _mm_set1_ps(scale)));
  }
  static D LoadDF64(const double* p) { return _mm256_loadu_pd(p); }
  static D Set1D(double x) { return _mm256_set1_pd(x); }
  static D MulD(D a, D b) { return _mm256_mul_pd(a, b); }
  static D AddD(D a, D b) { return _mm256_add_pd(a, b); }
  static void StoreD(double* p, D x) { _mm256_storeu_pd(p, x); }
  static void StoreDAsFloat(float* p, D x) { _mm_storeu_ps(p, _mm256_cvtpd_ps(x)); }

  // See Avx512::MayRoundToFloatOtherwise.
  static bool MayRoundToFloatOtherwise(D q) {
    const __m256i bits = _mm256_castpd_si256(q);
    const __m256i low = _mm256_and_si256(bits, _mm256_set1_epi64x((int64_t{1} << 29) - 1));
    const __m256i from_mid = _mm256_sub_epi64(low, _mm256_set1_epi64x((int64_t{1} << 28) - 8));
    const __m256i near_mid =
        _mm256_andnot_si256(_mm256_cmpgt_epi64(_mm256_setzero_si256(), from_mid),
                            _mm256_cmpgt_epi64(_mm256_set1_epi64x(17), from_mid));
    const __m256i exponent =
        _mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff));
    const __m256i inside =
        _mm256_and_si256(_mm256_cmpgt_epi64(exponent, _mm256_set1_epi64x(1023 - 126)),
                         _mm256_cmpgt_epi64(_mm256_set1_epi64x(1023 + 128), exponent));
    return _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_andnot_si256(near_mid, inside))) != 0xf;
  }

  // See Avx512::DivideExact.
  static D DivideExact(D x, D t, D y, D half_t) {
    const D sign = _mm256_set1_pd(-0.0);
    const D q0 = _mm256_mul_pd(x, y);
    const D r0 = _mm256_fnmadd_pd(q0, t, x);
    const D q1 = _mm256_fmadd_pd(r0, y, q0);
    const D r1 = _mm256_fnmadd_pd(q1, t, x);
    const D abs_q = _mm256_andnot_pd(sign, q1);
    const D below =
        _mm256_castsi256_pd(_mm256_sub_epi64(_mm256_castpd_si256(abs_q), _mm256_set1_epi64x(1)));
    const D limit = _mm256_mul_pd(_mm256_sub_pd(abs_q, below), half_t);
    const D ok = _mm256_or_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, r1), limit, _CMP_LT_OQ),
                              _mm256_cmp_pd(r1, _mm256_setzero_pd(), _CMP_EQ_OQ));
    if (_mm256_movemask_pd(ok) != 0xf) return _mm256_div_pd(x, t);
    return _mm256_or_pd(_mm256_andnot_pd(sign, q1), _mm256_and_pd(sign, x));
  }
};

}  // namespace
}  // namespace centroidkv::cpu
