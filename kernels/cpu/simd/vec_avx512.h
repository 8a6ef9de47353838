// AVX-512 vector traits for the shared kernel templates (soft_match_simd.h, merge_simd.h).
// Include only from a translation unit compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl -mfma -mf16c (simd/kernels_avx512.cc). Everything here has internal linkage, so
// no AVX-512 code can leak into the rest of the program through the linker.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/fp8_bits.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

struct Avx512 {
  static constexpr int32_t kW = 16;          // float lanes
  static constexpr int32_t kWD = 8;          // double lanes
  static constexpr int32_t kRowBlock = 8;    // A rows per microkernel tile
  static constexpr int32_t kPanelBlock = 3;  // B panels per microkernel tile
  static constexpr const char* kName = "avx512";
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;
  using D = __m512d;

  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F Bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static M Greater(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M FirstLanes(int32_t n) {  // lanes 0 .. n-1 (n in [0, 16])
    return static_cast<M>((n >= 16 ? 0xffffu : (1u << n) - 1u));
  }
  static F Select(M m, F if_false, F if_true) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static I SelectI(M m, I if_false, I if_true) {
    return _mm512_mask_blend_epi32(m, if_false, if_true);
  }
  static I Iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static I AddI(I a, int32_t b) { return _mm512_add_epi32(a, _mm512_set1_epi32(b)); }
  static void StoreI(int32_t* p, I x) { _mm512_storeu_si512(p, x); }
  static I ZeroI() { return _mm512_setzero_si512(); }
  static I Set1I(int32_t x) { return _mm512_set1_epi32(x); }
  static I MaxI(I a, I b) { return _mm512_max_epi32(a, b); }
  static I MinI(I a, I b) { return _mm512_min_epi32(a, b); }
  static M GreaterI(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M EqualI(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static F ToFloat(I x) { return _mm512_cvtepi32_ps(x); }
  static F RoundNearest(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^k for integral k in [-126, 127].
  static F Pow2(F k) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
  }
  // Bit l set where lane l of a is at least b (ordered: never for NaN).
  static uint32_t AtLeast(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static float HSum(F x) { return _mm512_reduce_add_ps(x); }
  static float HMax(F x) { return _mm512_reduce_max_ps(x); }

  // The top two over the lanes of per-lane running maxima m1 >= m2 (idx: the destination of
  // each m1): the highest m1 (the lowest destination on ties) and the highest of every other
  // lane's m1 and every lane's m2.
  static RowMatch ReduceTop2(F m1, F m2, I idx) {
    const float first = _mm512_reduce_max_ps(m1);
    const M at_max = _mm512_cmp_ps_mask(m1, _mm512_set1_ps(first), _CMP_EQ_OQ);
    const int32_t best = _mm512_mask_reduce_min_epi32(at_max, idx);
    if (__builtin_popcount(at_max) >= 2) return RowMatch{best, first, first};
    const F others = _mm512_mask_mov_ps(m1, at_max, _mm512_set1_ps(-__builtin_huge_valf()));
    return RowMatch{best, first, _mm512_reduce_max_ps(_mm512_max_ps(others, m2))};
  }

  // x[i] <- 1 / max(sqrt(x[i]), 1e-6) in double, rounded to float, for i < n.
  static void InverseNorms(float* x, int32_t n) {
    int32_t i = 0;
    for (; i + kWD <= n; i += kWD) {
      const D norm = _mm512_max_pd(_mm512_sqrt_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i))),
                                   _mm512_set1_pd(1e-6));
      _mm256_storeu_ps(x + i, _mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), norm)));
    }
    for (; i < n; ++i) {
      const double norm = __builtin_sqrt(static_cast<double>(x[i]));
      x[i] = static_cast<float>(1.0 / (norm > 1e-6 ? norm : 1e-6));
    }
  }

  // Whether (x0 + x1) * 0.5 in float may differ from the float64 mean rounded to float, over
  // a whole row of sums: the float sum overflowed (or is NaN), or the result is (or may round
  // to) a subnormal, i.e. 0 < |sum| < 2^-125. Folded per vector without a branch, with the
  // bits of |sum| as unsigned integers: the smallest bits - 1 (zero wraps to the largest) and
  // the largest bits; tested once per row.
  struct HalfSums {
    I small_minus_one;
    I large;
  };
  static HalfSums NoHalfSums() { return {_mm512_set1_epi32(-1), _mm512_setzero_si512()}; }
  static void FoldHalfSum(F sum, HalfSums* sums) {
    const I bits = _mm512_and_si512(_mm512_castps_si512(sum), _mm512_set1_epi32(0x7fffffff));
    sums->small_minus_one =
        _mm512_min_epu32(sums->small_minus_one, _mm512_sub_epi32(bits, _mm512_set1_epi32(1)));
    sums->large = _mm512_max_epu32(sums->large, bits);
  }
  static bool AnyHalfSumUnsafe(const HalfSums& sums) {
    // 2^-125 is 0x01000000 as bits, FLT_MAX 0x7f7fffff.
    return (_mm512_cmplt_epu32_mask(sums.small_minus_one, _mm512_set1_epi32(0x00ffffff)) |
            _mm512_cmpgt_epu32_mask(sums.large, _mm512_set1_epi32(0x7f7fffff))) != 0;
  }

  // Copies with non-temporal stores on the 64-byte aligned middle of `out` (no fence);
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
    for (; i < count && (reinterpret_cast<uintptr_t>(out + i) & 63) != 0; ++i) copy_one(i);
    const __m512i exponent = _mm512_set1_epi32(static_cast<int>(kExponent));
    __mmask16 non_finite = 0;
    for (; i + 16 <= count; i += 16) {
      const __m512i x = _mm512_loadu_si512(in + i);
      non_finite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, exponent), exponent);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i), x);
    }
    for (; i < count; ++i) copy_one(i);
    return non_finite == 0 && any_exponent_ones == 0;
  }

  // 16 floats rounded to nearest even: fp16 by F16C; bf16 by integer rounding as
  // FloatToBFloat16 does (a NaN stays a quiet NaN), see KernelTable::stream_halves.
  static __m256i RoundHalves(__m512 x, ElemType type) {
    if (type == ElemType::kF16) {
      return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)),
                                          _mm512_set1_epi32(0x7fff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i rounded = _mm512_mask_mov_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16), nan,
        _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(rounded);
  }

  // StreamFloats for fp16 / bf16 rows (KernelTable::stream_halves): non-temporal stores on
  // the 64-byte aligned middle of `out`, masked stores at the ends (no fence).
  static uint32_t StreamHalves(const float* in, int64_t count, ElemType type, uint16_t* out) {
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    const __m512i overflow = _mm512_set1_epi32(static_cast<int32_t>(HalfOverflowBits(type)));
    __mmask16 non_finite = 0, beyond = 0;
    auto load = [&](const float* p, __mmask16 mask) {
      const __m512 x = _mm512_maskz_loadu_ps(mask, p);
      const __m512i bits = _mm512_castps_si512(x);
      non_finite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
      beyond |= _mm512_cmpge_epu32_mask(_mm512_and_si512(bits, magnitude), overflow);
      return x;
    };
    // Up to 16 elements with masked stores.
    auto part = [&](int64_t k, int64_t n) {
      const auto mask = static_cast<__mmask16>((1u << n) - 1u);
      _mm256_mask_storeu_epi16(out + k, mask, RoundHalves(load(in + k, mask), type));
    };
    const auto misaligned = static_cast<int64_t>((reinterpret_cast<uintptr_t>(out) & 63) / 2);
    int64_t i = misaligned == 0 ? 0 : 32 - misaligned;
    if (i > count) i = count;
    for (int64_t k = 0; k < i; k += 16) part(k, i - k < 16 ? i - k : 16);
    for (; i + 32 <= count; i += 32) {
      const __m256i lo = RoundHalves(load(in + i, 0xffff), type);
      const __m256i hi = RoundHalves(load(in + i + 16, 0xffff), type);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i),
                          _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    for (; i < count; i += 16) part(i, count - i < 16 ? count - i : 16);
    return (non_finite != 0 ? kStreamedNonFinite : 0u) | (beyond != 0 ? kStreamedBeyondRange : 0u);
  }

  // kW consecutive elements of each type, widened to float.
  static F LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static F LoadF64(const double* p) {
    const __m256 lo = _mm512_cvtpd_ps(_mm512_loadu_pd(p));
    const __m256 hi = _mm512_cvtpd_ps(_mm512_loadu_pd(p + 8));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
  // fp8 codes of format T (kE4M3 or kE5M2): each code's value (fp8_bits.h) times `scale`,
  // one float multiply, as the reference widens them.
  template <ElemType T>
  static F LoadFp8(const uint8_t* p, float scale) {
    const __m256i codes =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m512 x = _mm512_cvtph_ps(Fp8HalfBits<T>(codes));
    if constexpr (T == ElemType::kE4M3) x = _mm512_mul_ps(x, _mm512_set1_ps(Fp8HalfFactor(T)));
    return _mm512_mul_ps(x, _mm512_set1_ps(scale));
  }

  // In-register transpose of 16 rows of 16 floats.
  static void Transpose(F* r) {
    F t[16], u[16];
    for (int k = 0; k < 16; k += 2) {
      t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
      t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) {
      u[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 16; k += 8) {
      for (int c = 0; c < 4; ++c) {
        t[k + c] = _mm512_shuffle_f32x4(u[k + c], u[k + 4 + c], 0x88);
        t[k + 4 + c] = _mm512_shuffle_f32x4(u[k + c], u[k + 4 + c], 0xdd);
      }
    }
    for (int c = 0; c < 8; ++c) {
      r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
    }
  }

  // Double lanes: kWD consecutive elements widened to double, and arithmetic.
  static D LoadDF32(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
  static D LoadDF16(const uint16_t* p) {
    return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static D LoadDBF16(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  template <ElemType T>
  static D LoadDFp8(const uint8_t* p, float scale) {
    const __m128i codes =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m256 x = _mm256_cvtph_ps(Fp8HalfBits<T>(codes));
    if constexpr (T == ElemType::kE4M3) x = _mm256_mul_ps(x, _mm256_set1_ps(Fp8HalfFactor(T)));
    return _mm512_cvtps_pd(_mm256_mul_ps(x, _mm256_set1_ps(scale)));
  }
  static D LoadDF64(const double* p) { return _mm512_loadu_pd(p); }
  static D Set1D(double x) { return _mm512_set1_pd(x); }
  static D MulD(D a, D b) { return _mm512_mul_pd(a, b); }
  static D AddD(D a, D b) { return _mm512_add_pd(a, b); }
  static void StoreD(double* p, D x) { _mm512_storeu_pd(p, x); }
  static void StoreDAsFloat(float* p, D x) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(x)); }

  // Whether a lane of q might round to another float than x does, where q is within three
  // ulps (double) of x (merge_simd.h: q = s * RN(1/t), x = RN(s / t)): q is zero, NaN,
  // infinite, below 2^-125 or at least 2^128 in magnitude (float's spacing changes, or the
  // result overflows), or within 8 ulps of a midpoint between two floats (the low 29 bits of
  // its significand near 2^28). Else no rounding boundary of float lies between q and x.
  static bool MayRoundToFloatOtherwise(D q) {
    const __m512i bits = _mm512_castpd_si512(q);
    const __m512i low = _mm512_and_si512(bits, _mm512_set1_epi64((int64_t{1} << 29) - 1));
    const __m512i from_mid = _mm512_sub_epi64(low, _mm512_set1_epi64((int64_t{1} << 28) - 8));
    const __mmask8 near_mid = _mm512_cmple_epu64_mask(from_mid, _mm512_set1_epi64(16));
    const __m512i exponent = _mm512_and_si512(_mm512_srli_epi64(bits, 52), _mm512_set1_epi64(0x7ff));
    const __mmask8 outside = _mm512_cmpgt_epu64_mask(
        _mm512_sub_epi64(exponent, _mm512_set1_epi64(1023 - 125)), _mm512_set1_epi64(125 + 127));
    return (near_mid | outside) != 0;
  }

  // x / t correctly rounded (as the division instruction gives it), by one Newton step on
  // the reciprocal y = RN(1/t) with FMA, checked exactly; the division instruction runs only
  // for a vector where the check fails. `t` is a positive integer below 2^53 and x/t is
  // normal or zero. Why the check is exact: r = x - t*q is computed exactly by the FMA
  // whenever q is within two ulps of x/t (r is then a multiple of ulp(q) below 2^55 ulp(q)),
  // and q is the correctly rounded quotient iff |r| < t * (the spacing of doubles toward
  // zero from |q|) / 2 (no ties: x/t is never halfway between doubles for integer t).
  // Zero x passes the check (r = 0) and gets its sign back at the end.
  static D DivideExact(D x, D t, D y, D half_t) {
    const D q0 = _mm512_mul_pd(x, y);
    const D r0 = _mm512_fnmadd_pd(q0, t, x);
    const D q1 = _mm512_fmadd_pd(r0, y, q0);
    const D r1 = _mm512_fnmadd_pd(q1, t, x);
    const D abs_q = _mm512_abs_pd(q1);
    const D below =
        _mm512_castsi512_pd(_mm512_sub_epi64(_mm512_castpd_si512(abs_q), _mm512_set1_epi64(1)));
    const D limit = _mm512_mul_pd(_mm512_sub_pd(abs_q, below), half_t);
    const __mmask8 ok = _mm512_cmp_pd_mask(_mm512_abs_pd(r1), limit, _CMP_LT_OQ) |
                        _mm512_cmp_pd_mask(r1, _mm512_setzero_pd(), _CMP_EQ_OQ);
    if (ok != 0xff) return _mm512_div_pd(x, t);
    // The quotient has the sign of x: the step above turns -0 / t into +0.
    const D sign = _mm512_set1_pd(-0.0);
    return _mm512_or_pd(_mm512_andnot_pd(sign, q1), _mm512_and_pd(sign, x));
  }
};

}  // namespace
}  // namespace centroidkv::cpu
