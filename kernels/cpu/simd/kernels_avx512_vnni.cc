// The AVX-512 kernel table for CPUs with AVX512-VNNI: the AVX-512 table with matching in
// 16-bit integers (KernelTable::match_int16). This translation unit alone is compiled with
// the AVX-512 flags plus -mavx512vnni (kernels/CMakeLists.txt); it runs only after
// simd_dispatch.cc has checked those features (__builtin_cpu_supports("avx512vnni")).
//
// Integer matching (issue 20, session 9), the AVX2 level's scheme (simd/kernels_avx2.cc) on
// 512-bit vectors: vpdpwssd multiplies 32 int16 pairs, adds them pairwise and accumulates
// into 16 int32 lanes in one instruction (no separate add, as AVX2's vpmaddwd + vpaddd
// need), 32 multiply-adds against a float FMA's 16 at the same issue rate. Each widened row
// is scaled to unit length and rounded to int16 (QuantizeRow); sources stay row-major,
// destinations are packed into panels of 16 whose lane l holds destination l's element pair
// (2t, 2t + 1) as one 32-bit word at pair t. The micro-kernel (TileInt16) computes MR (8)
// sources x NR (3) panels in 24 int32 accumulators (+ 3 panels + 1 broadcast of 32 zmm,
// the float kernel's 8 x 48 shape): per pair t, one 32-bit broadcast of each source's pair
// and one vpdpwssd per accumulator. Integer sums are exact (wrapping int32 arithmetic is
// exact modulo 2^32 and every dot product fits in int32) and the scale is common to every
// row, so the per-lane top two are kept in int32 and converted to float scores only at the
// end: the scores, and so the error bound (soft_match.h), are the AVX2 level's. A source
// whose top two are within the tie window gets its near ties listed for exact rescoring.
// Chunks shorter than kAvx512Int16MinChunk (96) stay on the float kernel: on the Zen 4 of
// docs/cpu-bench.md (session 9) int16 only ties with it at C = 64, and is 0.84x its time per
// job at C = 256 and 0.67x at C = 1024.
#include "kernels/cpu/simd/vec_avx512.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"

namespace centroidkv::cpu {
namespace {

constexpr int32_t kLanes = 16;  // destinations per int16 panel (int32 lanes of a zmm)
constexpr int kInt16RowBlock = Avx512::kRowBlock;  // MR (8): ChunkMatcher sizes a_quant by it
constexpr int kInt16PanelBlock = 3;                // NR: 24 accumulators
constexpr int32_t kMinScore = -2147483647 - 1;     // -infinity of the int32 scores

int32_t RoundUpTo(int32_t x, int32_t to) { return (x + to - 1) / to * to; }

__mmask16 FirstLanes(int32_t n) {  // lanes 0 .. n-1, n in any range
  return n >= 16  ? static_cast<__mmask16>(0xffff)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1u);
}

// One widened row times `scale` (its inverse norm times kInt16Scale), rounded to nearest
// even (cvtps2dq, MXCSR's rounding, as the AVX2 level) and saturated to int16 (vpmovsdw, as
// AVX2's packssdw), into q[0 .. padded): zeros past dim.
void QuantizeRow(const float* row, float scale, int32_t dim, int32_t padded, int16_t* q) {
  const __m512 s = _mm512_set1_ps(scale);
  int32_t j = 0;
  for (; j + 16 <= dim; j += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + j), s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm512_cvtsepi32_epi16(v));
  }
  for (; j < padded; j += 16) {  // the rest of the row (masked), then zeros up to `padded`
    const __m512 x = _mm512_maskz_loadu_ps(FirstLanes(dim - j), row + j);
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(x, s));
    _mm256_mask_storeu_epi16(q + j, FirstLanes(padded - j), _mm512_cvtsepi32_epi16(v));
  }
}

// Quantised rows (row-major, `pairs` 32-bit pairs each; `count` a multiple of 16) into
// panels: panel p, pair t, lane l = row 16p + l's pair t. 16 x 16 transposes of 32-bit words.
void PackInt16Panels(const int16_t* rows, int32_t count, int32_t pairs, int16_t* panels) {
  const auto* in = reinterpret_cast<const float*>(rows);  // 32-bit words, moved bit for bit
  auto* out = reinterpret_cast<float*>(panels);
  const int32_t full = pairs - pairs % kLanes;
  for (int32_t p = 0; p < count / kLanes; ++p) {
    const float* first = in + static_cast<int64_t>(p) * kLanes * pairs;
    float* panel = out + static_cast<int64_t>(p) * pairs * kLanes;
    for (int32_t t0 = 0; t0 < full; t0 += kLanes) {
      __m512 r[kLanes];
      for (int32_t l = 0; l < kLanes; ++l) r[l] = _mm512_loadu_ps(first + l * pairs + t0);
      Avx512::Transpose(r);
      for (int32_t c = 0; c < kLanes; ++c) _mm512_store_ps(panel + (t0 + c) * kLanes, r[c]);
    }
    for (int32_t t = full; t < pairs; ++t) {
      for (int32_t l = 0; l < kLanes; ++l) panel[t * kLanes + l] = first[l * pairs + t];
    }
  }
}

// A source's element pair as one 32-bit word in every lane (vbroadcastss: a load alone).
__m512i BroadcastPair(const int16_t* p) {
  return _mm512_castps_si512(_mm512_set1_ps(*reinterpret_cast<const float*>(p)));
}

__m512i LoadPanel(const int16_t* p) { return _mm512_load_si512(p); }

// acc + the pairwise products of a and b (vpdpwssd). Inline asm rather than
// _mm512_dpwssd_epi32: with the intrinsic GCC 12 copies every accumulator of the tile
// through another register and the stack on each step (its builtin does not tie the
// accumulator to the destination register), which made the kernel slower than the float one.
__attribute__((always_inline)) inline __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// Float scores of int32 ones: RN(RN(float(s)) * RN(1 / kInt16Scale^2)), as the AVX2 level
// converts them; kMinScore lanes become -infinity.
__m512 ToScores(__m512i s) {
  constexpr float kUnit =
      static_cast<float>(1.0 / (static_cast<double>(kInt16Scale) * kInt16Scale));
  const __m512 scores = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(kUnit));
  const __mmask16 empty = _mm512_cmpeq_epi32_mask(s, _mm512_set1_epi32(kMinScore));
  return _mm512_mask_mov_ps(scores, empty, _mm512_set1_ps(kNegInfinity));
}

// MR sources (row-major, `stride` int16 each) x NR panels from destination col0, folded
// into the per-lane int32 top two and the index of the first.
template <int MR, int NR>
__attribute__((always_inline)) inline void TileInt16(const int16_t* a, int64_t stride,
                                                     int32_t pairs, const int16_t* panel0,
                                                     int32_t col0, int32_t b_count, __m512i* m1,
                                                     __m512i* m2, __m512i* idx,
                                                     LinePrefetcher* prefetcher) {
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  __m512i acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int p = 0; p < NR; ++p) acc[i][p] = _mm512_setzero_si512();
  }
  constexpr int32_t kSpanPairs = LinePrefetcher::kSpan / 2;
  for (int32_t t0 = 0; t0 < pairs; t0 += kSpanPairs) {
    prefetcher->Step();
    const int32_t t1 = t0 + kSpanPairs < pairs ? t0 + kSpanPairs : pairs;
    for (int32_t t = t0; t < t1; ++t) {
      __m512i b[NR];
#pragma GCC unroll 8
      for (int p = 0; p < NR; ++p) b[p] = LoadPanel(panel0 + p * panel_stride + t * 2 * kLanes);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i av = BroadcastPair(a + i * stride + 2 * t);
#pragma GCC unroll 8
        for (int p = 0; p < NR; ++p) acc[i][p] = Dpwssd(acc[i][p], av, b[p]);
      }
    }
  }
  const __m512i min_score = _mm512_set1_epi32(kMinScore);
#pragma GCC unroll 8
  for (int p = 0; p < NR; ++p) {
    const int32_t col = col0 + p * kLanes;
    const __m512i ids = Avx512::AddI(Avx512::Iota(), col);
    const __mmask16 valid = FirstLanes(b_count - col);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i s = _mm512_mask_mov_epi32(min_score, valid, acc[i][p]);
      const __mmask16 greater = _mm512_cmpgt_epi32_mask(s, m1[i]);
      m2[i] = _mm512_max_epi32(m2[i], _mm512_min_epi32(m1[i], s));
      m1[i] = _mm512_max_epi32(m1[i], s);
      idx[i] = _mm512_mask_mov_epi32(idx[i], greater, ids);
    }
  }
}

// The remaining 1 .. K panels of a row block.
template <int MR, int K>
__attribute__((always_inline)) inline void RestInt16(int32_t rest, const int16_t* a, int64_t stride,
                                                     int32_t pairs, const int16_t* panel0,
                                                     int32_t col0, int32_t b_count, __m512i* m1,
                                                     __m512i* m2, __m512i* idx,
                                                     LinePrefetcher* prefetcher) {
  if constexpr (K >= 1) {
    if (rest == K) {
      TileInt16<MR, K>(a, stride, pairs, panel0, col0, b_count, m1, m2, idx, prefetcher);
    } else {
      RestInt16<MR, K - 1>(rest, a, stride, pairs, panel0, col0, b_count, m1, m2, idx, prefetcher);
    }
  }
}

// Appends the destinations col .. col + 15 whose int32 scores `s` (lanes past b_count
// excluded) convert to at least `floor`, in increasing order; false when the list overflows.
bool AppendNearTies(__m512i s, int32_t col, int32_t b_count, __m512 floor, NearTies* ties) {
  uint32_t near =
      _mm512_mask_cmp_ps_mask(FirstLanes(b_count - col), ToScores(s), floor, _CMP_GE_OQ);
  while (near != 0) {
    if (ties->count == NearTies::kMax) return false;
    ties->destinations[ties->count++] = col + __builtin_ctz(near);
    near &= near - 1;
  }
  return true;
}

// Source `a`'s near ties: every destination whose score (the same integers and conversion
// as the tile's: integer sums are exact in any order) is at least `threshold`, in increasing
// order, up to NearTies::kMax. Four panels at a time, so that each broadcast serves four
// multiply-adds.
void ListNearTies(const int16_t* a, int32_t pairs, const int16_t* panels, int32_t b_count,
                  float threshold, NearTies* ties) {
  constexpr int kGroup = 4;
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  const int32_t num_panels = (b_count + kLanes - 1) / kLanes;
  const __m512 floor = _mm512_set1_ps(threshold);
  ties->count = 0;
  int32_t p = 0;
  for (; p + kGroup <= num_panels; p += kGroup) {
    const int16_t* panel = panels + p * panel_stride;
    __m512i acc[kGroup];
    for (int g = 0; g < kGroup; ++g) acc[g] = _mm512_setzero_si512();
    for (int32_t t = 0; t < pairs; ++t) {
      const __m512i av = BroadcastPair(a + 2 * t);
#pragma GCC unroll 4
      for (int g = 0; g < kGroup; ++g) {
        acc[g] = Dpwssd(acc[g], av, LoadPanel(panel + g * panel_stride + t * 2 * kLanes));
      }
    }
    for (int g = 0; g < kGroup; ++g) {
      if (!AppendNearTies(acc[g], (p + g) * kLanes, b_count, floor, ties)) {
        ties->count = NearTies::kMax + 1;
        return;
      }
    }
  }
  for (; p < num_panels; ++p) {
    const int16_t* panel = panels + p * panel_stride;
    __m512i acc = _mm512_setzero_si512();
    for (int32_t t = 0; t < pairs; ++t) {
      acc = Dpwssd(acc, BroadcastPair(a + 2 * t), LoadPanel(panel + t * 2 * kLanes));
    }
    if (!AppendNearTies(acc, p * kLanes, b_count, floor, ties)) {
      ties->count = NearTies::kMax + 1;
      return;
    }
  }
}

void MatchInt16(const float* tile, const float* inverse_norms, int32_t length, int32_t dim,
                int16_t* a_quant, int16_t* b_panels, const PrefetchRanges* prefetch,
                double tie_window, RowMatch* out, NearTies* ties) {
  constexpr int MR = kInt16RowBlock;
  constexpr int NR = kInt16PanelBlock;
  const int32_t sources = (length + 1) / 2, destinations = length / 2;
  const int32_t padded = RoundUpTo(dim, 2), pairs = padded / 2;
  const int32_t a_rows = RoundUpTo(sources, MR), b_rows = RoundUpTo(destinations, kLanes);
  int16_t* b_quant = a_quant + static_cast<int64_t>(a_rows) * padded;  // row-major, then packed
  for (int32_t r = 0; r < length; ++r) {
    int16_t* q = (r % 2 == 0 ? a_quant : b_quant) + static_cast<int64_t>(r / 2) * padded;
    QuantizeRow(tile + static_cast<int64_t>(r) * dim, inverse_norms[r] * kInt16Scale, dim, padded,
                q);
  }
  for (int64_t k = static_cast<int64_t>(sources) * padded;
       k < static_cast<int64_t>(a_rows) * padded; ++k) {
    a_quant[k] = 0;
  }
  for (int64_t k = static_cast<int64_t>(destinations) * padded;
       k < static_cast<int64_t>(b_rows) * padded; ++k) {
    b_quant[k] = 0;
  }
  PackInt16Panels(b_quant, b_rows, pairs, b_panels);

  const int32_t num_panels = b_rows / kLanes;
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  const int64_t spans = (pairs + LinePrefetcher::kSpan / 2 - 1) / (LinePrefetcher::kSpan / 2);
  LinePrefetcher prefetcher(prefetch, (a_rows / MR) * ((num_panels + NR - 1) / NR) * spans);
  const __m512i min_score = _mm512_set1_epi32(kMinScore);
  for (int32_t r0 = 0; r0 < sources; r0 += MR) {
    __m512i m1[MR], m2[MR], idx[MR];
    for (int i = 0; i < MR; ++i) {
      m1[i] = min_score;
      m2[i] = min_score;
      idx[i] = Avx512::Iota();
    }
    const int16_t* rows = a_quant + static_cast<int64_t>(r0) * padded;
    int32_t p = 0;
    for (; p + NR <= num_panels; p += NR) {
      TileInt16<MR, NR>(rows, padded, pairs, b_panels + p * panel_stride, p * kLanes, destinations,
                        m1, m2, idx, &prefetcher);
    }
    RestInt16<MR, NR - 1>(num_panels - p, rows, padded, pairs, b_panels + p * panel_stride,
                          p * kLanes, destinations, m1, m2, idx, &prefetcher);
    for (int i = 0; i < MR && r0 + i < sources; ++i) {
      const RowMatch match = Avx512::ReduceTop2(ToScores(m1[i]), ToScores(m2[i]), idx[i]);
      out[r0 + i] = match;
      NearTies* row_ties = ties + r0 + i;
      row_ties->count = 0;
      // A float threshold at or below best - window: the list may hold a few more
      // destinations than the double comparison would, never fewer.
      const double limit = static_cast<double>(match.first) - tie_window;
      float threshold = static_cast<float>(limit);
      if (static_cast<double>(threshold) > limit) {
        threshold = __builtin_nextafterf(threshold, kNegInfinity);
      }
      if (destinations < 2 || match.second < threshold) continue;
      // Each lane's best is a known destination; where no lane's second reaches the
      // threshold, those bests are all the near ties (no third can either), else rescan.
      const __m512 floor = _mm512_set1_ps(threshold);
      if (_mm512_cmp_ps_mask(ToScores(m2[i]), floor, _CMP_GE_OQ) != 0) {
        ListNearTies(rows + static_cast<int64_t>(i) * padded, pairs, b_panels, destinations,
                     threshold, row_ties);
        continue;
      }
      uint32_t near = _mm512_cmp_ps_mask(ToScores(m1[i]), floor, _CMP_GE_OQ);
      if (__builtin_popcount(near) > NearTies::kMax) {  // 16 lanes: the list may overflow
        row_ties->count = NearTies::kMax + 1;
        continue;
      }
      int32_t lane_best[kLanes];
      _mm512_storeu_si512(lane_best, idx[i]);
      int32_t count = 0;
      for (; near != 0; near &= near - 1) {  // insertion sort: at most 8, increasing
        const int32_t destination = lane_best[__builtin_ctz(near)];
        int32_t k = count++;
        for (; k > 0 && row_ties->destinations[k - 1] > destination; --k) {
          row_ties->destinations[k] = row_ties->destinations[k - 1];
        }
        row_ties->destinations[k] = destination;
      }
      row_ties->count = count;
    }
  }
}

constexpr KernelTable MakeAvx512VnniTable() {
  KernelTable table = MakeKernelTable<Avx512>();
  table.match_int16 = MatchInt16;
  table.int16_min_chunk = kAvx512Int16MinChunk;
  return table;
}

}  // namespace

namespace internal {

const KernelTable& Avx512VnniKernels() {
  static constexpr KernelTable kTable = MakeAvx512VnniTable();
  return kTable;
}

}  // namespace internal
}  // namespace centroidkv::cpu
