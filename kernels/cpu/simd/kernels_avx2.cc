// The AVX2 kernel table, with matching in 16-bit integers (KernelTable::match_int16). This
// translation unit alone is compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt); it
// runs only after simd_dispatch.cc has checked those features.
//
// Integer matching (issue 20): vpmaddwd multiplies 16 int16 pairs and adds them pairwise
// into 8 int32 lanes, 16 multiply-adds per instruction against a float FMA's 8, at the same
// issue rate. Each widened row is scaled to unit length and rounded to int16
// (QuantizeRow); sources stay row-major, destinations are packed into panels of 8 whose
// lane l holds destination l's element pair (2t, 2t + 1) as one 32-bit word at pair t. The
// micro-kernel (TileInt16) computes MR sources x NR panels in MR * NR int32 accumulators:
// per pair t, one 32-bit broadcast of each source's pair and one vpmaddwd + vpaddd per
// accumulator. Integer sums are exact and the scale is common to every row, so the per-lane
// top two are kept in int32 and converted to float scores only at the end; the error is the
// rounding to int16 alone (the bound in soft_match.h). A source whose top two are within the
// tie window is rescanned in the same arithmetic to list its near ties for exact rescoring.
#include "kernels/cpu/simd/vec_avx2.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"

namespace centroidkv::cpu {
namespace {

constexpr int32_t kLanes = 8;       // destinations per int16 panel (int32 lanes of a ymm)
constexpr int kInt16RowBlock = Avx2::kRowBlock;  // MR (6): 12 accumulators + 2 panels + broadcast + product
constexpr int kInt16PanelBlock = 2;  // NR
constexpr int32_t kMinScore = -2147483647 - 1;  // -infinity of the int32 scores

int32_t RoundUpTo(int32_t x, int32_t to) { return (x + to - 1) / to * to; }

// One widened row times `scale` (its inverse norm times kInt16Scale), rounded to nearest
// even and saturated to int16, into q[0 .. padded): zeros past dim.
void QuantizeRow(const float* row, float scale, int32_t dim, int32_t padded, int16_t* q) {
  const __m256 s = _mm256_set1_ps(scale);
  int32_t j = 0;
  for (; j + 16 <= dim; j += 16) {
    const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j), s));
    const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j + 8), s));
    // packs works per 128-bit half: [lo0 hi0 lo1 hi1] back into element order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), packed);
  }
  for (; j < dim; ++j) {
    // cvtss2si: the same rounding (MXCSR's, nearest even) as cvtps2dq above.
    const int32_t v = _mm_cvtss_si32(_mm_set_ss(row[j] * scale));
    q[j] = static_cast<int16_t>(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
  }
  for (; j < padded; ++j) q[j] = 0;
}

// Quantised rows (row-major, `pairs` 32-bit pairs each; `count` a multiple of 8) into
// panels: panel p, pair t, lane l = row 8p + l's pair t. 8 x 8 transposes of 32-bit words.
void PackInt16Panels(const int16_t* rows, int32_t count, int32_t pairs, int16_t* panels) {
  const auto* in = reinterpret_cast<const float*>(rows);  // 32-bit words, moved bit for bit
  auto* out = reinterpret_cast<float*>(panels);
  const int32_t full = pairs - pairs % kLanes;
  for (int32_t p = 0; p < count / kLanes; ++p) {
    const float* first = in + static_cast<int64_t>(p) * kLanes * pairs;
    float* panel = out + static_cast<int64_t>(p) * pairs * kLanes;
    for (int32_t t0 = 0; t0 < full; t0 += kLanes) {
      __m256 r[kLanes];
      for (int32_t l = 0; l < kLanes; ++l) r[l] = _mm256_loadu_ps(first + l * pairs + t0);
      Avx2::Transpose(r);
      for (int32_t c = 0; c < kLanes; ++c) _mm256_storeu_ps(panel + (t0 + c) * kLanes, r[c]);
    }
    for (int32_t t = full; t < pairs; ++t) {
      for (int32_t l = 0; l < kLanes; ++l) panel[t * kLanes + l] = first[l * pairs + t];
    }
  }
}

// A source's element pair as one 32-bit word in every lane. vbroadcastss rather than
// vpbroadcastd: on AMD Zen it is a load alone, while vpbroadcastd also takes a vector ALU slot
// that the multiply-adds need.
__m256i BroadcastPair(const int16_t* p) {
  return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

__m256i LoadPanel(const int16_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

// Lanes at or past `valid` of int32 scores set to kMinScore.
__m256i MaskLanes(__m256i s, int32_t valid) {
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), Avx2::Iota());
  return _mm256_blendv_epi8(_mm256_set1_epi32(kMinScore), s, keep);
}

// Float scores of int32 ones: RN(RN(float(s)) * RN(1 / kInt16Scale^2)); kMinScore lanes
// become -infinity.
__m256 ToScores(__m256i s) {
  constexpr float kUnit = static_cast<float>(1.0 / (static_cast<double>(kInt16Scale) * kInt16Scale));
  const __m256 scores = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(kUnit));
  const __m256 empty = _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, _mm256_set1_epi32(kMinScore)));
  return _mm256_blendv_ps(scores, _mm256_set1_ps(kNegInfinity), empty);
}

// MR sources (row-major, `stride` int16 each) x NR panels from destination col0, folded
// into the per-lane int32 top two and the index of the first.
template <int MR, int NR>
__attribute__((always_inline)) inline void TileInt16(const int16_t* a, int64_t stride,
                                                     int32_t pairs, const int16_t* panel0,
                                                     int32_t col0, int32_t b_count, __m256i* m1,
                                                     __m256i* m2, __m256i* idx,
                                                     LinePrefetcher* prefetcher) {
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  __m256i acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int p = 0; p < NR; ++p) acc[i][p] = _mm256_setzero_si256();
  }
  constexpr int32_t kSpanPairs = LinePrefetcher::kSpan / 2;
  for (int32_t t0 = 0; t0 < pairs; t0 += kSpanPairs) {
    prefetcher->Step();
    const int32_t t1 = t0 + kSpanPairs < pairs ? t0 + kSpanPairs : pairs;
    for (int32_t t = t0; t < t1; ++t) {
      __m256i b[NR];
#pragma GCC unroll 8
      for (int p = 0; p < NR; ++p) b[p] = LoadPanel(panel0 + p * panel_stride + t * 2 * kLanes);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m256i av = BroadcastPair(a + i * stride + 2 * t);
#pragma GCC unroll 8
        for (int p = 0; p < NR; ++p) {
          acc[i][p] = _mm256_add_epi32(acc[i][p], _mm256_madd_epi16(av, b[p]));
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < NR; ++p) {
    const int32_t col = col0 + p * kLanes;
    const __m256i ids = Avx2::AddI(Avx2::Iota(), col);
    const bool partial = col + kLanes > b_count;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      __m256i s = acc[i][p];
      if (partial) s = MaskLanes(s, b_count - col);
      const __m256i greater = _mm256_cmpgt_epi32(s, m1[i]);
      m2[i] = _mm256_max_epi32(m2[i], _mm256_min_epi32(m1[i], s));
      m1[i] = _mm256_max_epi32(m1[i], s);
      idx[i] = _mm256_blendv_epi8(idx[i], ids, greater);
    }
  }
}

// The remaining 1 .. K panels of a row block.
template <int MR, int K>
__attribute__((always_inline)) inline void RestInt16(int32_t rest, const int16_t* a,
                                                     int64_t stride, int32_t pairs,
                                                     const int16_t* panel0, int32_t col0,
                                                     int32_t b_count, __m256i* m1, __m256i* m2,
                                                     __m256i* idx, LinePrefetcher* prefetcher) {
  if constexpr (K >= 1) {
    if (rest == K) {
      TileInt16<MR, K>(a, stride, pairs, panel0, col0, b_count, m1, m2, idx, prefetcher);
    } else {
      RestInt16<MR, K - 1>(rest, a, stride, pairs, panel0, col0, b_count, m1, m2, idx,
                           prefetcher);
    }
  }
}

// Appends the destinations col .. col + 7 whose int32 scores `s` (lanes past b_count
// masked) convert to at least `floor`, in increasing order; false when the list overflows.
bool AppendNearTies(__m256i s, int32_t col, int32_t b_count, __m256 floor, NearTies* ties) {
  if (col + kLanes > b_count) s = MaskLanes(s, b_count - col);
  auto near = static_cast<uint32_t>(
      _mm256_movemask_ps(_mm256_cmp_ps(ToScores(s), floor, _CMP_GE_OQ)));
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
  const __m256 floor = _mm256_set1_ps(threshold);
  ties->count = 0;
  int32_t p = 0;
  for (; p + kGroup <= num_panels; p += kGroup) {
    const int16_t* panel = panels + p * panel_stride;
    __m256i acc[kGroup];
    for (int g = 0; g < kGroup; ++g) acc[g] = _mm256_setzero_si256();
    for (int32_t t = 0; t < pairs; ++t) {
      const __m256i av = BroadcastPair(a + 2 * t);
#pragma GCC unroll 4
      for (int g = 0; g < kGroup; ++g) {
        acc[g] = _mm256_add_epi32(
            acc[g], _mm256_madd_epi16(av, LoadPanel(panel + g * panel_stride + t * 2 * kLanes)));
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
    __m256i acc = _mm256_setzero_si256();
    for (int32_t t = 0; t < pairs; ++t) {
      acc = _mm256_add_epi32(acc,
                             _mm256_madd_epi16(BroadcastPair(a + 2 * t), LoadPanel(panel + t * 2 * kLanes)));
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
  for (int64_t k = static_cast<int64_t>(sources) * padded; k < static_cast<int64_t>(a_rows) * padded; ++k) {
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
  const __m256i min_score = _mm256_set1_epi32(kMinScore);
  for (int32_t r0 = 0; r0 < sources; r0 += MR) {
    __m256i m1[MR], m2[MR], idx[MR];
    for (int i = 0; i < MR; ++i) {
      m1[i] = min_score;
      m2[i] = min_score;
      idx[i] = Avx2::Iota();
    }
    const int16_t* rows = a_quant + static_cast<int64_t>(r0) * padded;
    int32_t p = 0;
    for (; p + NR <= num_panels; p += NR) {
      TileInt16<MR, NR>(rows, padded, pairs, b_panels + p * panel_stride, p * kLanes,
                        destinations, m1, m2, idx, &prefetcher);
    }
    RestInt16<MR, NR - 1>(num_panels - p, rows, padded, pairs, b_panels + p * panel_stride,
                          p * kLanes, destinations, m1, m2, idx, &prefetcher);
    for (int i = 0; i < MR && r0 + i < sources; ++i) {
      const RowMatch match = Avx2::ReduceTop2(ToScores(m1[i]), ToScores(m2[i]), idx[i]);
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
      const __m256 floor = _mm256_set1_ps(threshold);
      if (_mm256_movemask_ps(_mm256_cmp_ps(ToScores(m2[i]), floor, _CMP_GE_OQ)) != 0) {
        ListNearTies(rows + static_cast<int64_t>(i) * padded, pairs, b_panels, destinations,
                     threshold, row_ties);
        continue;
      }
      auto near = static_cast<uint32_t>(
          _mm256_movemask_ps(_mm256_cmp_ps(ToScores(m1[i]), floor, _CMP_GE_OQ)));
      int32_t lane_best[kLanes];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane_best), idx[i]);
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

constexpr KernelTable MakeAvx2Table() {
  KernelTable table = MakeKernelTable<Avx2>();
  table.match_int16 = MatchInt16;
  table.int16_min_chunk = kAvx2Int16MinChunk;
  return table;
}

}  // namespace

namespace internal {

const KernelTable& Avx2Kernels() {
  static constexpr KernelTable kTable = MakeAvx2Table();
  return kTable;
}

}  // namespace internal
}  // namespace centroidkv::cpu
