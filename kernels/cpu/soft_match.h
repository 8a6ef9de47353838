// SPEC.md section 2 step 3 for one chunk, in float32 SIMD: cosine similarity of every source
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

// A bound on |float score - reference score| for keys of `dim` elements:
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
// every dim >= 1 up to EngineLimits::max_dim.
double MatchErrorBound(int32_t dim);

class ChunkMatcher {
 public:
  // Matches the chunk of rows first .. first + length - 1 of `rows` (dim elements each):
  // out[i] for source i (row first + 2i), i < ceil(length / 2), over the destinations
  // first + 2k + 1, k < floor(length / 2). Requires length >= 2. Keeps the widened rows and
  // the packed destinations for Rescore() and ExactRows().
  // `prefetch` (may be null): memory to bring into L2 while matching (the next chunk's rows).
  void Match(const KernelTable& kernels, const RowBlock& rows, int64_t first, int32_t length,
             int32_t dim, RowMatch* out, const PrefetchRanges* prefetch = nullptr);

  // After Match(): the float scores of source i against every destination (index k), with
  // the same arithmetic as Match(). Valid until the next call.
  std::span<const float> Rescore(int32_t source);

  // After Match(): the chunk's rows as float (row i of the chunk at element i * dim) when
  // they hold the input's exact values (fp32, fp16 or bf16 rows, and no norm overflowed),
  // so merging may read them instead of the input; otherwise null.
  const float* ExactRows() const { return tile_exact_ ? tile_.data() : nullptr; }

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
};

}  // namespace centroidkv::cpu
