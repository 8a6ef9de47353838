// The similarity kernels of soft_match.h as templates over a vector traits class V
// (vec_avx512.h, vec_avx2.h): widening rows with their inverse norms, packing (and scaling)
// destination rows into panels, the register-blocked match microkernel and the one-row
// rescan. Internal linkage: included
// once per SIMD translation unit (see vec_avx512.h).
//
// The microkernel (MatchTile) computes a tile of MR source rows x NR panels of W destinations
// in MR * NR vector accumulators: for each j it loads NR panel vectors (W destinations' j-th
// element) and broadcasts each source row's j-th element, one FMA per accumulator. Each
// score is a sequential FMA chain over j = 0 .. dim-1 (the error bound in soft_match.h
// relies on that). The tile is then folded into a per-lane running top two (and index of the
// first) per source row, so no score is ever stored. Source rows are not normalised: their
// two best scores are scaled by the row's inverse norm at the end.
//
// Tile shapes: AVX-512 8 x 3 panels of 16 (24 accumulators of 32 zmm); AVX2 6 x 2 panels of
// 8 (12 accumulators + 2 panel vectors + 1 broadcast = 15 of the 16 ymm, the BLIS/OpenBLAS
// Haswell shape). On an AMD EPYC (Zen 3, AVX2 only) 4 x 3, 3 x 4 and 2 x 6 tiles, a
// BLIS-style copy of each 6-row block packed j-major, an L1-resident panel block (96
// sources swept per 4 panels) and 64-byte aligned panels were measured against it in one
// process and were no faster (docs/results/cpu-bench.md). Any shape keeps the error bound of
// soft_match.h: what it relies on is
// one sequential FMA chain per score over j, which every tile here computes. The AVX2 table
// (and the AVX-512 one where the CPU has VNNI, from C = 96) matches in 16-bit integers
// instead (KernelTable::match_int16: match_int16_simd.h, whose micro-kernel is MatchTile
// over Int16TileArith); its float kernels here remain for Rescore().
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/elements.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

constexpr float kNegInfinity = -__builtin_huge_valf();

// Slow path of WidenRows: a row whose float sum of squares overflows, normalised in double.
template <ElemType T>
void NormalizeRowInDouble(TypedRow<T> row, int32_t dim, float* dst) {
  double sum_squares = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    const double x = WidenToDouble<T>(row, j);
    sum_squares += x * x;
  }
  const double norm = MaxDouble(__builtin_sqrt(sum_squares), 1e-6);
  for (int32_t j = 0; j < dim; ++j) dst[j] = static_cast<float>(WidenToDouble<T>(row, j) / norm);
}

// One sweep per row (widen, store, accumulate squares in two vector accumulators), then the
// inverse norms of all rows at once, so no row waits on its own square root.
template <class V, ElemType T>
bool WidenRowsTyped(const RowBlock& rows, int64_t first, int32_t count, int32_t dim, float* out,
                    float* inverse_norms) {
  using F = typename V::F;
  constexpr int32_t W = V::kW;
  const int32_t full = dim - dim % W;
  for (int32_t i = 0; i < count; ++i) {
    const TypedRow<T> row = RowAt<T>(rows, first + i);
    float* dst = out + static_cast<int64_t>(i) * dim;
    F acc0 = V::Zero(), acc1 = V::Zero();
    int32_t j = 0;
    for (; j + 2 * W <= full; j += 2 * W) {
      const F x0 = LoadFloats<V, T>(row, j);
      const F x1 = LoadFloats<V, T>(row, j + W);
      V::Store(dst + j, x0);
      V::Store(dst + j + W, x1);
      acc0 = V::Fma(x0, x0, acc0);
      acc1 = V::Fma(x1, x1, acc1);
    }
    for (; j < full; j += W) {
      const F x = LoadFloats<V, T>(row, j);
      V::Store(dst + j, x);
      acc0 = V::Fma(x, x, acc0);
    }
    float tail = 0.0f;
    for (; j < dim; ++j) {
      const float x = WidenToFloat<T>(row, j);
      dst[j] = x;
      tail += x * x;
    }
    inverse_norms[i] = V::HSum(V::Add(acc0, acc1)) + tail;  // the sum of squares, for now
  }
  bool exact = true;
  for (int32_t i = 0; i < count; ++i) {
    if (inverse_norms[i] <= 3.0e38f) continue;
    NormalizeRowInDouble<T>(RowAt<T>(rows, first + i), dim,
                            out + static_cast<int64_t>(i) * dim);
    inverse_norms[i] = 1.0f;  // its inverse norm below is then exactly 1
    exact = false;
  }
  V::InverseNorms(inverse_norms, count);
  return exact;
}

template <class V>
bool WidenRows(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out,
               float* inverse_norms) {
  return WithElemType(rows->type, [&]<ElemType T>() {
    return WidenRowsTyped<V, T>(*rows, first, count, dim, out, inverse_norms);
  });
}

// W x W blocks transposed in registers, each lane (a destination row) scaled by its inverse
// norm after the transpose.
template <class V>
void PackPanels(const float* rows, int64_t row_stride, const float* inverse_norms,
                int64_t norm_stride, int32_t count, int32_t dim, float* panels) {
  using F = typename V::F;
  constexpr int32_t W = V::kW;
  const int32_t num_panels = (count + W - 1) / W;
  const int32_t full = dim - dim % W;
  for (int32_t p = 0; p < num_panels; ++p) {
    float* panel = panels + static_cast<int64_t>(p) * dim * W;
    const float* first_row = rows + static_cast<int64_t>(p) * W * row_stride;
    const int32_t valid = count - p * W < W ? count - p * W : W;
    float lane_scale[W];
    for (int32_t l = 0; l < W; ++l) {
      lane_scale[l] =
          l < valid ? inverse_norms[(static_cast<int64_t>(p) * W + l) * norm_stride] : 0.0f;
    }
    const F scale = V::Load(lane_scale);
    F r[W];
    for (int32_t j0 = 0; j0 < full; j0 += W) {
      if (valid == W) {
#pragma GCC unroll 16
        for (int32_t l = 0; l < W; ++l) r[l] = V::Load(first_row + l * row_stride + j0);
      } else {
#pragma GCC unroll 16
        for (int32_t l = 0; l < W; ++l) {
          r[l] = l < valid ? V::Load(first_row + l * row_stride + j0) : V::Zero();
        }
      }
      V::Transpose(r);
#pragma GCC unroll 16
      for (int32_t c = 0; c < W; ++c) {
        V::Store(panel + static_cast<int64_t>(j0 + c) * W, V::Mul(r[c], scale));
      }
    }
    for (int32_t j = full; j < dim; ++j) {
      for (int32_t l = 0; l < W; ++l) {
        panel[j * W + l] = l < valid ? first_row[l * row_stride + j] * lane_scale[l] : 0.0f;
      }
    }
  }
}

// The float score from which a destination is a near tie of a source whose best is `best`
// (NearTies, for the window `tie_window`): at or below best - tie_window, so a list made by
// comparing float scores with it may hold a few more destinations than the double comparison
// would, never fewer.
inline float NearTieThreshold(float best, double tie_window) {
  const double limit = static_cast<double>(best) - tie_window;
  const float threshold = static_cast<float>(limit);
  return static_cast<double>(threshold) > limit ? __builtin_nextafterf(threshold, kNegInfinity)
                                                : threshold;
}

// Issues the prefetches of PrefetchRanges in `steps` equal shares, one share per Step(), into
// L2 (a chunk's rows are larger than L1). Small shares, spread through the match kernel's
// inner loop: a burst of prefetches would take every line fill buffer from the kernel's own
// panel loads.
class LinePrefetcher {
 public:
  static constexpr int64_t kLine = 64;
  static constexpr int32_t kSpan = 16;  // MatchTile steps once per kSpan elements of a row

  LinePrefetcher(const PrefetchRanges* ranges, int64_t steps) {
    if (ranges == nullptr || steps <= 0) return;
    for (int k = 0; k < 2; ++k) {
      if (ranges->data[k] == nullptr || ranges->bytes[k] <= 0) continue;
      begin_[count_] = ranges->data[k];
      end_[count_] = ranges->data[k] + ranges->bytes[k];
      lines_ += (ranges->bytes[k] + kLine - 1) / kLine;
      ++count_;
    }
    per_step_ = (lines_ + steps - 1) / steps;
  }

  void Step() {
    for (int64_t k = 0; k < per_step_ && current_ < count_; ++k) {
      __builtin_prefetch(begin_[current_], 0, 2);
      begin_[current_] += kLine;
      if (begin_[current_] >= end_[current_]) ++current_;
    }
  }

 private:
  const char* begin_[2] = {nullptr, nullptr};
  const char* end_[2] = {nullptr, nullptr};
  int count_ = 0;
  int current_ = 0;
  int64_t lines_ = 0;
  int64_t per_step_ = 0;
};

// The arithmetic of a match tile (MatchTile): float FMAs on widened rows (FloatTileArith,
// here) or 16-bit integer multiply-adds on quantised rows (Int16TileArith,
// match_int16_simd.h). Elem: the element type of rows and panels; Acc: an accumulator (one
// score per lane); kPerStep: elements per broadcast (one float, or a pair of int16); Lowest:
// the score below every real one; Max, Min, Greater on scores; V: the vector traits (kW,
// Iota, AddI, SelectI, FirstLanes).
template <class Vec>
struct FloatTileArith {
  using V = Vec;
  using Elem = float;
  using Acc = typename V::F;
  static constexpr int32_t kPerStep = 1;
  static Acc Zero() { return V::Zero(); }
  static Acc Broadcast(const float* p) { return V::Bcast(p); }
  static Acc LoadPanel(const float* p) { return V::Load(p); }
  static Acc MulAdd(Acc acc, Acc a, Acc b) { return V::Fma(a, b, acc); }
  static Acc Lowest() { return V::Set1(kNegInfinity); }
  static Acc Select(typename V::M m, Acc if_false, Acc if_true) {
    return V::Select(m, if_false, if_true);
  }
  static Acc Max(Acc a, Acc b) { return V::Max(a, b); }
  static Acc Min(Acc a, Acc b) { return V::Min(a, b); }
  static typename V::M Greater(Acc a, Acc b) { return V::Greater(a, b); }
};

// MR source rows (row-major, `a_stride` elements apart, `steps` broadcasts of kPerStep
// elements each) x NR panels starting at destination col0, folded into the running per-lane
// top two (m1 >= m2) and the index of m1 of each source row. Panel p holds, at step j, the
// kPerStep elements of its kW destinations (kW * kPerStep elements).
template <class A, int MR, int NR>
__attribute__((always_inline)) inline void MatchTile(const typename A::Elem* a, int64_t a_stride,
                                                     int32_t steps,
                                                     const typename A::Elem* panel0, int32_t col0,
                                                     int32_t b_count, typename A::Acc* m1,
                                                     typename A::Acc* m2, typename A::V::I* idx,
                                                     LinePrefetcher* prefetcher) {
  using Acc = typename A::Acc;
  using V = typename A::V;
  constexpr int32_t W = V::kW;
  constexpr int32_t kStep = A::kPerStep;
  constexpr int32_t kSpanSteps = LinePrefetcher::kSpan / kStep;
  const int64_t panel_stride = static_cast<int64_t>(steps) * kStep * W;
  Acc acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int p = 0; p < NR; ++p) acc[i][p] = A::Zero();
  }
  for (int32_t j0 = 0; j0 < steps; j0 += kSpanSteps) {
    prefetcher->Step();
    const int32_t j1 = j0 + kSpanSteps < steps ? j0 + kSpanSteps : steps;
    for (int32_t j = j0; j < j1; ++j) {
      Acc b[NR];
#pragma GCC unroll 8
      for (int p = 0; p < NR; ++p) b[p] = A::LoadPanel(panel0 + p * panel_stride + j * kStep * W);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const Acc av = A::Broadcast(a + i * a_stride + kStep * j);
#pragma GCC unroll 8
        for (int p = 0; p < NR; ++p) acc[i][p] = A::MulAdd(acc[i][p], av, b[p]);
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < NR; ++p) {
    const int32_t col = col0 + p * W;
    const typename V::I ids = V::AddI(V::Iota(), col);
    const bool partial = col + W > b_count;
    const Acc lowest = A::Lowest();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      Acc s = acc[i][p];
      if (partial) s = A::Select(V::FirstLanes(b_count - col), lowest, s);
      const typename V::M greater = A::Greater(s, m1[i]);
      m2[i] = A::Max(m2[i], A::Min(m1[i], s));
      m1[i] = A::Max(m1[i], s);
      idx[i] = V::SelectI(greater, idx[i], ids);
    }
  }
}

// The remaining 1 .. K panels of a row block.
template <class A, int MR, int K>
__attribute__((always_inline)) inline void MatchRest(int32_t rest, const typename A::Elem* a,
                                                     int64_t a_stride, int32_t steps,
                                                     const typename A::Elem* panel0, int32_t col0,
                                                     int32_t b_count, typename A::Acc* m1,
                                                     typename A::Acc* m2, typename A::V::I* idx,
                                                     LinePrefetcher* prefetcher) {
  if constexpr (K >= 1) {
    if (rest == K) {
      MatchTile<A, MR, K>(a, a_stride, steps, panel0, col0, b_count, m1, m2, idx, prefetcher);
    } else {
      MatchRest<A, MR, K - 1>(rest, a, a_stride, steps, panel0, col0, b_count, m1, m2, idx,
                              prefetcher);
    }
  }
}

template <class V>
void MatchRows(const float* a, int64_t a_stride, const float* a_inverse_norms, int64_t norm_stride,
               int32_t a_count, const float* panels, int32_t b_count, int32_t dim,
               const PrefetchRanges* prefetch, const StopCheck* stop, RowMatch* out) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int32_t W = V::kW;
  constexpr int MR = V::kRowBlock;
  constexpr int NR = V::kPanelBlock;
  const int32_t num_panels = (b_count + W - 1) / W;
  const int64_t panel_stride = static_cast<int64_t>(dim) * W;
  const int64_t row_blocks = (a_count + MR - 1) / MR;
  const int64_t spans = (dim + LinePrefetcher::kSpan - 1) / LinePrefetcher::kSpan;
  LinePrefetcher prefetcher(prefetch, row_blocks * ((num_panels + NR - 1) / NR) * spans);
  StopPoller poller(stop);
  const int64_t tile_work = int64_t{MR} * NR * W * dim;
  for (int32_t r0 = 0; r0 < a_count; r0 += MR) {
    F m1[MR], m2[MR];
    I idx[MR];
    for (int i = 0; i < MR; ++i) {
      m1[i] = V::Set1(kNegInfinity);
      m2[i] = V::Set1(kNegInfinity);
      idx[i] = V::Iota();
    }
    const float* rows = a + r0 * a_stride;
    int32_t p = 0;
    for (; p + NR <= num_panels; p += NR) {
      if (poller.Stopped(tile_work)) return;
      MatchTile<FloatTileArith<V>, MR, NR>(rows, a_stride, dim, panels + p * panel_stride, p * W,
                                           b_count, m1, m2, idx, &prefetcher);
    }
    MatchRest<FloatTileArith<V>, MR, NR - 1>(num_panels - p, rows, a_stride, dim, panels + p * panel_stride, p * W,
                             b_count, m1, m2, idx, &prefetcher);
    for (int i = 0; i < MR && r0 + i < a_count; ++i) {
      RowMatch match = V::ReduceTop2(m1[i], m2[i], idx[i]);
      const float scale = a_inverse_norms[(r0 + i) * norm_stride];
      match.first *= scale;
      match.second *= scale;
      out[r0 + i] = match;
    }
  }
}

template <class V>
void ScoreRow(const float* a, float a_inverse_norm, const float* panels, int32_t b_count,
              int32_t dim, float* scores) {
  using F = typename V::F;
  constexpr int32_t W = V::kW;
  const int32_t num_panels = (b_count + W - 1) / W;
  for (int32_t p = 0; p < num_panels; ++p) {
    const float* panel = panels + static_cast<int64_t>(p) * dim * W;
    F acc = V::Zero();
    for (int32_t j = 0; j < dim; ++j) acc = V::Fma(V::Bcast(a + j), V::Load(panel + j * W), acc);
    float lanes[W];
    V::Store(lanes, acc);
    for (int32_t l = 0; l < W && p * W + l < b_count; ++l) {
      scores[p * W + l] = lanes[l] * a_inverse_norm;
    }
  }
}

}  // namespace
}  // namespace centroidkv::cpu
