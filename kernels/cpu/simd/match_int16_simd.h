// Matching in 16-bit integers (KernelTable::match_int16) as one template over an int16
// traits class Q, shared by the AVX2 level (simd/kernels_avx2.cc: vpmaddwd + vpaddd) and the
// AVX-512 VNNI level (simd/kernels_avx512_vnni.cc: vpdpwssd). Internal linkage: included once
// per SIMD translation unit (see vec_avx512.h).
//
// Q extends the vector traits (Avx2, Avx512: F, I, M, kW, kRowBlock and kPanelBlock, the
// float kernel's tile, also used here; Iota, ReduceTop2, Transpose, the int32 operations)
// with what is ISA-specific to int16 matching:
//   QuantizeRow(row, scale, dim, padded, q)  one row rounded to int16 (below)
//   BroadcastPair(p)       the 32-bit word at p (two int16) in every lane
//   LoadPanel(p)           one aligned panel vector
//   MulAdd(acc, a, b)      acc + the pairwise int16 products of a and b, in int32 lanes
//
// The scheme: each widened row is scaled to unit length and rounded to int16 (QuantizeRow:
// q_j = RoundToInt(RN(x_j * RN(s_x * kInt16Scale))), nearest even, saturated); rows padded
// with zeros to an even length. Destinations are packed into panels of kW whose lane l holds
// destination l's element pair (2t, 2t + 1) as one 32-bit word at pair t; sources stay
// row-major. The micro-kernel is the float kernel's MatchTile (soft_match_simd.h) over
// Int16TileArith: MR sources x NR panels in MR * NR int32 accumulators, per pair t one
// broadcast of each source's pair and one MulAdd per accumulator. Integer sums are exact
// (wrapping int32 arithmetic is exact modulo 2^32 and every dot product fits in int32) and
// the scale is common to every row, so the per-lane top two are kept in int32 and converted
// to float scores, RN(RN(float(s)) * RN(1 / kInt16Scale^2)), only at the end: the error is
// the rounding to int16 alone (the bound in soft_match.h), the same at every level. A source
// whose top two are within the tie window gets its near ties listed (in the same arithmetic)
// for exact rescoring.
//
// Measured and not kept (Zen 4, docs/results/cpu-bench.md): sources packed pair-major per
// block of MR rows, so that the broadcasts sit at fixed offsets from one pointer, was 1-5%
// slower at C = 1024 and 9-22% slower at C = 64-256: the copy costs more than the address
// arithmetic it saves.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd/soft_match_simd.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

constexpr int32_t kMinScore = -2147483647 - 1;  // -infinity of the int32 scores

constexpr int32_t RoundUpTo(int32_t x, int32_t to) { return (x + to - 1) / to * to; }

// Bits 0 .. n-1 of a lane mask, n in any range.
template <class Q>
uint32_t FirstLaneBits(int32_t n) {
  return n >= Q::kW ? (Q::kW == 32 ? ~0u : (1u << Q::kW) - 1u) : n <= 0 ? 0u : (1u << n) - 1u;
}

// Float scores of int32 ones; kMinScore lanes become -infinity.
template <class Q>
typename Q::F ToScores(typename Q::I s) {
  constexpr float kUnit =
      static_cast<float>(1.0 / (static_cast<double>(kInt16Scale) * kInt16Scale));
  const typename Q::F scores = Q::Mul(Q::ToFloat(s), Q::Set1(kUnit));
  return Q::Select(Q::EqualI(s, Q::Set1I(kMinScore)), scores, Q::Set1(kNegInfinity));
}

// Quantised rows (row-major, `pairs` 32-bit pairs each; `count` a multiple of kW) into
// panels: panel p, pair t, lane l = row kW p + l's pair t. kW x kW transposes of 32-bit words.
template <class Q>
void PackInt16Panels(const int16_t* rows, int32_t count, int32_t pairs, int16_t* panels) {
  constexpr int32_t kLanes = Q::kW;
  const auto* in = reinterpret_cast<const float*>(rows);  // 32-bit words, moved bit for bit
  auto* out = reinterpret_cast<float*>(panels);
  const int32_t full = pairs - pairs % kLanes;
  for (int32_t p = 0; p < count / kLanes; ++p) {
    const float* first = in + static_cast<int64_t>(p) * kLanes * pairs;
    float* panel = out + static_cast<int64_t>(p) * pairs * kLanes;
    for (int32_t t0 = 0; t0 < full; t0 += kLanes) {
      typename Q::F r[kLanes];
      for (int32_t l = 0; l < kLanes; ++l) r[l] = Q::Load(first + l * pairs + t0);
      Q::Transpose(r);
      for (int32_t c = 0; c < kLanes; ++c) Q::Store(panel + (t0 + c) * kLanes, r[c]);
    }
    for (int32_t t = full; t < pairs; ++t) {
      for (int32_t l = 0; l < kLanes; ++l) panel[t * kLanes + l] = first[l * pairs + t];
    }
  }
}

// MatchTile's arithmetic on quantised rows: a pair of int16 per broadcast, int32 scores
// (kMinScore the lowest).
template <class Q>
struct Int16TileArith {
  using V = Q;
  using Elem = int16_t;
  using Acc = typename Q::I;
  static constexpr int32_t kPerStep = 2;
  static Acc Zero() { return Q::ZeroI(); }
  static Acc Broadcast(const int16_t* p) { return Q::BroadcastPair(p); }
  static Acc LoadPanel(const int16_t* p) { return Q::LoadPanel(p); }
  static Acc MulAdd(Acc acc, Acc a, Acc b) { return Q::MulAdd(acc, a, b); }
  static Acc Lowest() { return Q::Set1I(kMinScore); }
  static Acc Select(typename Q::M m, Acc if_false, Acc if_true) {
    return Q::SelectI(m, if_false, if_true);
  }
  static Acc Max(Acc a, Acc b) { return Q::MaxI(a, b); }
  static Acc Min(Acc a, Acc b) { return Q::MinI(a, b); }
  static typename Q::M Greater(Acc a, Acc b) { return Q::GreaterI(a, b); }
};

// Appends the destinations col .. col + kW - 1 (those below b_count) whose int32 scores `s`
// convert to at least `floor`, in increasing order; false when the list overflows.
template <class Q>
bool AppendNearTies(typename Q::I s, int32_t col, int32_t b_count, typename Q::F floor,
                    NearTies* ties) {
  uint32_t near = Q::AtLeast(ToScores<Q>(s), floor) & FirstLaneBits<Q>(b_count - col);
  while (near != 0) {
    if (ties->count == NearTies::kMax) return false;
    ties->destinations[ties->count++] = col + __builtin_ctz(near);
    near &= near - 1;
  }
  return true;
}

// One source's near ties: every destination whose score (the same integers and conversion
// as the tile's: integer sums are exact in any order) is at least `threshold`, in increasing
// order, up to NearTies::kMax. Four panels at a time, so that each broadcast serves four
// multiply-adds.
template <class Q>
void ListNearTies(const int16_t* a, int32_t pairs, const int16_t* panels, int32_t b_count,
                  float threshold, NearTies* ties) {
  using I = typename Q::I;
  constexpr int32_t kLanes = Q::kW;
  constexpr int kGroup = 4;
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  const int32_t num_panels = (b_count + kLanes - 1) / kLanes;
  const typename Q::F floor = Q::Set1(threshold);
  ties->count = 0;
  int32_t p = 0;
  for (; p + kGroup <= num_panels; p += kGroup) {
    const int16_t* panel = panels + p * panel_stride;
    I acc[kGroup];
    for (int g = 0; g < kGroup; ++g) acc[g] = Q::ZeroI();
    for (int32_t t = 0; t < pairs; ++t) {
      const I av = Q::BroadcastPair(a + 2 * t);
#pragma GCC unroll 4
      for (int g = 0; g < kGroup; ++g) {
        acc[g] = Q::MulAdd(acc[g], av, Q::LoadPanel(panel + g * panel_stride + t * 2 * kLanes));
      }
    }
    for (int g = 0; g < kGroup; ++g) {
      if (!AppendNearTies<Q>(acc[g], (p + g) * kLanes, b_count, floor, ties)) {
        ties->count = NearTies::kMax + 1;
        return;
      }
    }
  }
  for (; p < num_panels; ++p) {
    const int16_t* panel = panels + p * panel_stride;
    I acc = Q::ZeroI();
    for (int32_t t = 0; t < pairs; ++t) {
      acc = Q::MulAdd(acc, Q::BroadcastPair(a + 2 * t), Q::LoadPanel(panel + t * 2 * kLanes));
    }
    if (!AppendNearTies<Q>(acc, p * kLanes, b_count, floor, ties)) {
      ties->count = NearTies::kMax + 1;
      return;
    }
  }
}

// A source's near ties from its tile fold (m1, m2, idx: the per-lane top two and index of
// the first) when `match` (their reduction) may have any; else leaves ties->count 0.
template <class Q>
void FindNearTies(const RowMatch& match, typename Q::I m1, typename Q::I m2, typename Q::I idx,
                  const int16_t* a, int32_t pairs, const int16_t* panels, int32_t b_count,
                  double tie_window, NearTies* ties) {
  constexpr int32_t kLanes = Q::kW;
  ties->count = 0;
  const float threshold = NearTieThreshold(match.first, tie_window);
  if (b_count < 2 || match.second < threshold) return;
  // Each lane's best is a known destination; where no lane's second reaches the threshold,
  // those bests are all the near ties (no third can either), else rescan.
  const typename Q::F floor = Q::Set1(threshold);
  if (Q::AtLeast(ToScores<Q>(m2), floor) != 0) {
    ListNearTies<Q>(a, pairs, panels, b_count, threshold, ties);
    return;
  }
  uint32_t near = Q::AtLeast(ToScores<Q>(m1), floor);
  if constexpr (kLanes > NearTies::kMax) {
    if (__builtin_popcount(near) > NearTies::kMax) {  // the list would overflow
      ties->count = NearTies::kMax + 1;
      return;
    }
  }
  int32_t lane_best[kLanes];
  Q::StoreI(lane_best, idx);
  int32_t count = 0;
  for (; near != 0; near &= near - 1) {  // insertion sort: at most kMax, increasing
    const int32_t destination = lane_best[__builtin_ctz(near)];
    int32_t k = count++;
    for (; k > 0 && ties->destinations[k - 1] > destination; --k) {
      ties->destinations[k] = ties->destinations[k - 1];
    }
    ties->destinations[k] = destination;
  }
  ties->count = count;
}

// KernelTable::match_int16 (its contract in kernel_table.h): the quantised sources in
// a_quant, then the destinations' rows after them, row-major, until PackInt16Panels packs them
// into b_panels.
template <class Q>
void MatchInt16(const float* tile, const float* inverse_norms, int32_t length, int32_t dim,
                int16_t* a_quant, int16_t* b_panels, const PrefetchRanges* prefetch,
                const StopCheck* stop, double tie_window, RowMatch* out, NearTies* ties) {
  using I = typename Q::I;
  constexpr int MR = Q::kRowBlock;
  constexpr int NR = Q::kPanelBlock;
  constexpr int32_t kLanes = Q::kW;
  const int32_t sources = (length + 1) / 2, destinations = length / 2;
  const int32_t padded = RoundUpTo(dim, 2), pairs = padded / 2;
  const int32_t a_rows = RoundUpTo(sources, MR), b_rows = RoundUpTo(destinations, kLanes);
  int16_t* b_quant = a_quant + static_cast<int64_t>(a_rows) * padded;  // row-major, then packed
  for (int32_t r = 0; r < length; ++r) {
    int16_t* q = (r % 2 == 0 ? a_quant : b_quant) + static_cast<int64_t>(r / 2) * padded;
    Q::QuantizeRow(tile + static_cast<int64_t>(r) * dim, inverse_norms[r] * kInt16Scale, dim,
                   padded, q);
  }
  for (int64_t k = static_cast<int64_t>(sources) * padded;
       k < static_cast<int64_t>(a_rows) * padded; ++k) {
    a_quant[k] = 0;
  }
  for (int64_t k = static_cast<int64_t>(destinations) * padded;
       k < static_cast<int64_t>(b_rows) * padded; ++k) {
    b_quant[k] = 0;
  }
  PackInt16Panels<Q>(b_quant, b_rows, pairs, b_panels);

  const int32_t num_panels = b_rows / kLanes;
  const int64_t panel_stride = static_cast<int64_t>(pairs) * 2 * kLanes;
  const int64_t spans = (pairs + LinePrefetcher::kSpan / 2 - 1) / (LinePrefetcher::kSpan / 2);
  LinePrefetcher prefetcher(prefetch, (a_rows / MR) * ((num_panels + NR - 1) / NR) * spans);
  const I min_score = Q::Set1I(kMinScore);
  StopPoller poller(stop);
  const int64_t tile_work = int64_t{MR} * NR * kLanes * pairs;  // two int16 products each
  for (int32_t r0 = 0; r0 < sources; r0 += MR) {
    I m1[MR], m2[MR], idx[MR];
    for (int i = 0; i < MR; ++i) {
      m1[i] = min_score;
      m2[i] = min_score;
      idx[i] = Q::Iota();
    }
    const int16_t* rows = a_quant + static_cast<int64_t>(r0) * padded;
    int32_t p = 0;
    for (; p + NR <= num_panels; p += NR) {
      if (poller.Stopped(tile_work)) return;
      MatchTile<Int16TileArith<Q>, MR, NR>(rows, padded, pairs, b_panels + p * panel_stride,
                                           p * kLanes, destinations, m1, m2, idx, &prefetcher);
    }
    MatchRest<Int16TileArith<Q>, MR, NR - 1>(num_panels - p, rows, padded, pairs,
                                             b_panels + p * panel_stride, p * kLanes, destinations,
                                             m1, m2, idx, &prefetcher);
    for (int i = 0; i < MR && r0 + i < sources; ++i) {
      const RowMatch match = Q::ReduceTop2(ToScores<Q>(m1[i]), ToScores<Q>(m2[i]), idx[i]);
      out[r0 + i] = match;
      FindNearTies<Q>(match, m1[i], m2[i], idx[i], rows + static_cast<int64_t>(i) * padded, pairs,
                      b_panels, destinations, tie_window, ties + r0 + i);
    }
  }
}

}  // namespace
}  // namespace centroidkv::cpu
