// SPEC.md section 2 step 3 for one chunk, in float32 SIMD (or on the AMX matrix engine in
// bf16x3, see KernelTable::match_bf16x3, or in 16-bit integers on AVX2 and AVX-512 VNNI, see
// KernelTable::match_int16): cosine similarity of every source
// (even local offset) with every destination (odd offset) fused with the per-source argmax,
// so the sources x destinations score matrix is never stored. The chunk's keys are widened
// once (fp16 with F16C, bf16 by shifting) into a float tile with each row's inverse norm;
// destinations are scaled and packed into panels; the match kernel keeps each source's best
// destination and its two highest scores (scaled by the source's inverse norm).
//
// The float scores are not the reference engine's float64 scores, but they are within
// MatchErrorBound(dim) of them, which is what lets the CPU engine take exactly the
// reference's decisions (edge_decisions.h): where a source's top two are within twice the
// bound, Rescore() gives all its float scores and the candidates are rescored in double.
//
// Thread-compatible: one ChunkMatcher per thread; its buffers grow to the largest chunk seen
// and are reused across chunks and jobs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

// A bound on |float score - reference score| of the kernels' match_rows / score_row, for
// keys of `dim` elements:
//   (dim + 8) * 2^-23 = (2 dim + 16) u, with u = 2^-24 the float unit roundoff.
// Derivation: the score of source x and destination y is
//   RN(dot(x', y^) * s_x),  y^_j = RN(y'_j s_y),
// with x', y' the rows widened to float (exact for fp32/fp16/bf16 input; a relative error
// below u for rows kept in float64 between passes) and s = RN(1 / max(|x'|, 1e-6)) computed
// from a float sum of squares (16 lanes, then a tree) with a relative error below
// (dim/32 + 4) u. Relative to x_j y_j / (N_x N_y) each term carries (1 + a_j) with
// |a_j| <= 3u per side and one common factor (1 + e), |e| <= (dim/16 + 10) u; with
// sum_j |x_j y_j| <= N_x N_y (Cauchy-Schwarz; also when a norm is clamped at 1e-6) these
// move the cosine by at most (dim/16 + 16) u. The dot product is a sequential chain over j
// (FMAs, or products and sums in the scalar kernels), which errs by at most
// gamma_dim = dim u / (1 - dim u) times sum_j |x'_j y^_j| <= (1 + O(u)) / s_x (Higham,
// Accuracy and Stability, eq. 3.5), i.e. dim u after scaling. Subnormal products add at
// most dim * 2^-149 / s_x before scaling, negligible. The reference's own float64 rounding
// is below 1e-13. The total, (dim + dim/16 + 16) u + O(u^2), stays below (2 dim + 16) u for
// every dim >= 1 up to EngineLimits::max_dim. Per level: the scalar kernel, the AVX2 6 x 16
// and the AVX-512 8 x 48 tiles (simd/soft_match_simd.h) and score_row all compute each score
// as that one chain (the tile shape only chooses which chains run side by side), and their
// inverse norms are at least as accurate as above (sums of squares in 2 x 8 lanes on AVX2,
// 2 x 16 on AVX-512, then a tree; in double on scalar), so the same bound holds at each of
// them; the matrix engine has its own, below.
double MatchErrorBound(int32_t dim);

// The bound for the scores `kernels` gives: MatchErrorBound(dim), or with a matrix engine
// (KernelTable::match_bf16x3)
//   2^-14 + (7 dim + 64) u.
// Derivation: both rows are normalised in float, x^_j = RN(x'_j s_x), a relative error below
// (dim/32 + 6) u per element against x_j / N_x (as above), i.e. (dim/16 + 12) u on the
// cosine. Splitting, hi = RN_bf16(x^) errs by at most 2^-8 |x^| (bf16 keeps 8 bits), the rest
// x^ - hi is exact in float, and lo = RN_bf16(x^ - hi) leaves tau with |tau| <= 2^-16 |x^|.
// Against x^_j y^_j the three products hi hi' + hi lo' + lo hi' miss lo lo' and the tau
// terms: at most (2^-16 (1 + 2^-8)^2 + 2 * 2^-16 (1 + 2^-16) + 2^-32) |x^_j y^_j|, below
// 3.02 * 2^-16 |x^_j y^_j|, which sums (Cauchy-Schwarz again) to below 3.03 * 2^-16 < 2^-14.
// Each bf16 product is exact in float; the 3 dim of them are accumulated in float32, with at
// most one rounding per addition; allowing twice that (the hardware's internal order is not
// documented), gamma_{6 dim} * sum |terms| <= 6.07 dim u for dim <= 4096. bf16 conversion
// flushes subnormals: at most 2^-126 per element, dim * 2^-125 in all, far below u. Sum:
// 3.03 * 2^-16 + (6.07 dim + dim/16 + 12) u + O(u^2) < 2^-14 + (7 dim + 64) u.
//
// With 16-bit integer matching (KernelTable::match_int16):
//   1.001 sqrt(dim) / S + dim / (4 S^2) + (dim / 16 + 32) u,  S = kInt16Scale.
// Derivation: with x the exact unit row (x'_j / max(N_x, 1e-6)), the scale
// t_x = RN(s_x S) = S (1 + e_x) / N_x, |e_x| <= (dim/32 + 5) u (s_x as above, one more
// rounding), and q_j = RoundToInt(RN(x'_j t_x)) = S x_j (1 + e_x)(1 + a_j) + r_j with
// |a_j| <= u and |r_j| <= 1/2 (no saturation: |x_j| <= 1 and e_x < 2^-16 for dim up to
// EngineLimits::max_dim, so |S x_j (1 + e_x)(1 + a_j)| < 32767.5). The integer dot product
// q_x.q_y is exact (|q_x.q_y| <= |q_x| |q_y| < (S (1 + 2^-16) + sqrt(dim) / 2)^2 < 2^31, so
// no int32 sum wraps). Divided by S^2 it is
//   cos (1 + e_x)(1 + e_y) + sum_j x_j y_j ((1 + a_j)(1 + b_j) - 1)(...)
//     + sum_j (x_j (...) r'_j + y_j (...) r_j) / S + sum_j r_j r'_j / S^2,
// off the cosine by at most (dim/16 + 10) u + (2 u + u^2) (Cauchy-Schwarz)
// + (|x|_1 + |y|_1) (1 + (dim/32 + 7) u) / (2 S) + dim / (4 S^2), and |x|_1 <= sqrt(dim)
// |x|_2 <= sqrt(dim); (dim/32 + 7) u < 0.001. The float score RN(RN(float(q_x.q_y)) *
// RN(1 / S^2)) adds three roundings of a value below 1.001: 4 u. The reference's own
// rounding is below 1e-13. For dim = 128: 3.46e-4 (the float bound: 1.6e-5).
// Both int16 kernels compute these same quantities, so the bound holds for each: the AVX2
// one (vpmaddwd + vpaddd) and the AVX-512 VNNI one (vpdpwssd). Their inverse norms come from
// widen_rows within (dim/32 + 4) u (sums of squares in 2 x 8 or 2 x 16 lanes, then a tree,
// as above); t_x is one float multiply; q_j is cvtps2dq (the MXCSR's rounding, nearest even)
// then a signed saturation to int16 (packssdw / vpmovsdw, never reached as shown); every
// partial sum of the dot product, in any order, is a sum of some of the products q_x_j q_y_j,
// at most |q_x| |q_y| < 2^31 in magnitude (Cauchy-Schwarz), so no int32 addition wraps and
// the result is the exact q_x.q_y (vpdpwssd adds its two products to the accumulator in
// int32 without saturation, and wrapping int32 sums would be exact modulo 2^32 anyway); the
// conversion to float is the same two roundings. Only where a near tie is listed differs
// (16 lanes on AVX-512 can name more than NearTies::kMax lane bests: the list is then
// dropped and the source rescanned in float, as any overflowing list is).
double MatchErrorBound(const KernelTable& kernels, int32_t dim);

// The bound for the scores of every chunk of at most `chunk` rows (a layer job's chunks):
// MatchErrorBound(dim) where `kernels` match such chunks in float (int16 levels below their
// int16_min_chunk: UsesInt16 only grows with the length), else MatchErrorBound(kernels, dim).
// The AMX level keeps its matrix engine's bound at every chunk size, as before.
double MatchErrorBound(const KernelTable& kernels, int32_t dim, int32_t chunk);

// Whether ChunkMatcher::Match() runs a chunk of `length` rows on the matrix engine: where
// `kernels` has one and the chunk is long enough to pay for splitting and re-laying its rows
// (measured, one core: C = 64 is ~10% slower on AMX than with float FMAs, C = 256 ~6% faster,
// C = 1024 ~1.5x). Shorter chunks use match_rows; their scores are then within
// MatchErrorBound(dim), inside MatchErrorBound(kernels, dim).
constexpr int32_t kMatrixEngineMinChunk = 192;
bool UsesMatrixEngine(const KernelTable& kernels, int32_t length);

// Whether ChunkMatcher::Match() runs a chunk of `length` rows in 16-bit integers: where
// `kernels` has match_int16 and the chunk is long enough to pay for rounding and packing
// its rows (length >= KernelTable::int16_min_chunk, measured per level: kernel_table.h).
bool UsesInt16(const KernelTable& kernels, int32_t length);

// Whether the chunk's Match() scores come from a quantised path (matrix engine or int16):
// within MatchErrorBound(kernels, dim), with near-tie lists, rather than match_rows' float
// arithmetic.
bool UsesQuantisedMatch(const KernelTable& kernels, int32_t length);

class ChunkMatcher {
 public:
  // Matches the chunk of rows first .. first + length - 1 of `rows` (dim elements each):
  // out[i] for source i (row first + 2i), i < ceil(length / 2), over the destinations
  // first + 2k + 1, k < floor(length / 2). Requires length >= 2. Keeps the widened rows and
  // the packed destinations for Rescore() and ExactRows().
  // `prefetch` (may be null): memory to bring into L2 while matching (the next chunk's rows).
  // With `check_finite`, the rows are checked for Inf and NaN on the way (the input check of
  // a job's first pass, fused with the widening: a row's float sum of squares is finite
  // exactly when its elements are, unless it overflows, and only then are the elements
  // tested one by one): false, and nothing matched, when one holds an Inf or a NaN.
  // `stop` (may be null): the kernels return early once it says stop (StopCheck); `out` is
  // then unspecified.
  bool Match(const KernelTable& kernels, const RowBlock& rows, int64_t first, int32_t length,
             int32_t dim, RowMatch* out, const PrefetchRanges* prefetch = nullptr,
             bool check_finite = false, const StopCheck* stop = nullptr);

  // After Match(): the float scores of source i against every destination (index k), with
  // the arithmetic of match_rows (on a matrix engine too: those scores are within
  // MatchErrorBound(dim), inside the engine's wider bound). Valid until the next call.
  std::span<const float> Rescore(int32_t source);

  // After Match(): the chunk's rows as float (row i of the chunk at element i * dim) when
  // they hold the input's exact values (fp32, fp16 or bf16 rows, and no norm overflowed),
  // so merging may read them instead of the input; otherwise null (always on the matrix
  // engine, which never widens a chunk whole; the int16 path widens it first, as match_rows).
  const float* ExactRows() const { return tile_exact_ ? tile_.data() : nullptr; }

  // After Match() on a quantised path (UsesQuantisedMatch): source i's near ties for twice
  // the kernels' bound (NearTies), so that only they need exact rescoring; null otherwise.
  const NearTies* near_ties(int32_t source) const {
    return near_ties_valid_ ? &near_ties_[static_cast<size_t>(source)] : nullptr;
  }

  int32_t sources() const { return sources_; }
  int32_t destinations() const { return destinations_; }

 private:
  const KernelTable* kernels_ = nullptr;
  int32_t dim_ = 0;
  int32_t sources_ = 0;
  int32_t destinations_ = 0;
  bool tile_exact_ = false;
  std::vector<float> tile_;           // (length + 2 * row_block) x dim: the widened rows
  std::vector<float> inverse_norms_;  // length
  std::vector<float> panels_;         // ceil(destinations / W) x dim x W
  std::vector<float> scores_;         // destinations
  bool tile_widened_ = false;         // tile_ holds this chunk's rows, widened
  bool panels_packed_ = false;        // panels_ holds this chunk's destinations
  RowBlock rows_{};                   // the chunk last matched, for Rescore()
  int64_t first_ = 0;
  int32_t length_ = 0;
  std::vector<uint16_t> split_a_;     // matrix engine: split rows (match_bf16x3's scratch)
  std::vector<uint16_t> split_b_;
  std::vector<float> score_block_;
  std::vector<int16_t> quant_a_;      // int16 path: rounded rows (match_int16's scratch)
  std::vector<int16_t> quant_b_;
  std::vector<NearTies> near_ties_;   // sources
  bool near_ties_valid_ = false;
};

}  // namespace centroidkv::cpu
