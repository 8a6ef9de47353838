// The fit of one KV head's result to its reference queries (docs/scored-jobs.md, "Fitted
// jobs"), one template for float (the fast path) and double (the reference). Internal to
// kernels/fit/ (fit_stage.cc instantiates it).
//
// With s the query scale, the full cache gives query i the attention mass
//   y_i = sum_j c_j exp(s q_i . k_j - m_i)        (m_i: the largest logit, for range)
// and the result's rows, each with a weight w_r = exp(beta_r), give sum_r w_r F_ir with
// F_ir = exp(s q_i . kappa_r - m_i). Entries and rows are split into blocks of positions
// (an entry goes with its row's block, a dropped entry by its own position; a row by its
// earliest entry): each block's rows match the mass of the entries they stand for,
//   min_u  sum_i (sum_r X_ir u_r - z_ib)^2 + lambda tau_b sum_r (u_r - 1)^2,
//   X_ir = F_ir w0_r / y_i,  z_ib = y_ib / y_i,  w_r = w0_r u_r,  e^-B <= u_r <= e^B,
// with w0_r the row's count (u = 1 is ln(count)) and tau_b the mean diagonal of X^T X.
// lambda is chosen per head from a grid on held-out queries (every fourth), and no fit is
// kept when none beats ln(count) there. Then the values of merged rows (rows of two or more
// entries) are refitted: with p_ir = w_r F_ir / Z_i the compressed attention, each block's
// rows give sum_r p_ir nu_r, matched to the block's share of the compressed attention times
// the full cache's mean value over the block's entries (so the values fix what the block
// averages, not a mass the weights left missing), ridge towards the merged values with mu
// from a grid on the held-out queries; exact rows keep their values.
//
// Layout, so that every block is a contiguous range: the entries come ordered by block (a
// stable order within), and the rows by block with each block's exact rows before its
// merged ones (fit_stage.cc permutes them and back). The hot loops are matrix products
// (OpenBLAS) and two fused row kernels (FitKernels: bias add with max, exp with sum). The
// values need the full cache's exps a second time, at the final shifts: kept from the first
// pass when m x n of them fit in kKeptExpBytes (a scratch of the call), else computed again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/fit/blas.h"

namespace centroidkv::fit {

// What one head's fit did: its arithmetic (the multiply-adds of its matrix products, as
// 2 flops each, and the factorisations), the held-out errors without and with the fit,
// and the ridge it chose (0: no fit kept).
struct HeadFitStats {
  double flops = 0.0;
  double mass_error_before = 0.0, mass_error_after = 0.0;
  double value_error_before = 0.0, value_error_after = 0.0;
  double weight_ridge = 0.0, value_ridge = 0.0;
  // Seconds in each phase: the full cache's masses and numerators, the rows' features, the
  // weights' normal equations and solves, the values' normal equations and solves.
  double seconds_masses = 0.0, seconds_features = 0.0, seconds_weights = 0.0,
         seconds_values = 0.0;
};

// The row kernels in precision T: x[i] += bias[i] returning the largest, and
// x[i] = e^(x[i] - shift) returning the sum. Null members: scalar loops.
template <typename T>
struct RowKernels {
  T (*add_max)(T* x, const T* bias, int64_t count) = nullptr;
  T (*exp_sub_sum)(T* x, T shift, int64_t count) = nullptr;
};

template <typename T>
struct HeadFitJob {
  // The full head, every real entry, ordered by block (entry_block nondecreasing).
  int32_t entries = 0;
  int32_t key_dim = 0, value_dim = 0;
  const T* keys = nullptr;        // [entries, key_dim]
  const T* values = nullptr;      // [entries, value_dim]
  const T* log_counts = nullptr;  // [entries] ln(c_j)
  const int32_t* entry_block = nullptr;  // [entries]
  // The reference queries of the head's group.
  int32_t queries = 0;
  const T* query_rows = nullptr;  // [queries, key_dim]
  T scale = 1;
  // The result's rows of this head, ordered by block, exact before merged within one.
  int32_t rows = 0;
  const T* row_keys = nullptr;     // [rows, key_dim]
  T* row_values = nullptr;         // [rows, value_dim], refitted in place
  const T* row_counts = nullptr;   // [rows] w0
  const int32_t* row_block = nullptr;  // [rows]
  const uint8_t* row_merged = nullptr;  // [rows] 1 where the row stands for 2+ entries
  int32_t blocks = 1;
  bool fit_values = true;
  T bound = 3;  // |ln u_r| <= bound
  RowKernels<T> kernels;
  T* log_weights = nullptr;  // [rows] out
};

namespace internal {

inline constexpr double kWeightRidges[] = {1e-4, 1e-3, 1e-2, 1e-1, 1.0};
inline constexpr double kValueRidges[] = {1e-3, 1e-2, 1e-1, 1.0, 10.0};
inline constexpr int32_t kLogitChunk = 512;
// The first pass's exponentiated logits (m x n) are kept for the values' pass when they fit in
// this many bytes; above it the values' pass computes them again.
inline constexpr int64_t kKeptExpBytes = int64_t{32} << 20;

// Query i is held out when i % 4 == 3, if there are at least 8.
inline bool HeldOut(int32_t i, int32_t queries) { return queries >= 8 && i % 4 == 3; }

template <typename T>
T AddMax(const RowKernels<T>& k, T* x, const T* bias, int64_t count) {
  if (k.add_max != nullptr) return k.add_max(x, bias, count);
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < count; ++i) {
    x[i] += bias[i];
    best = std::max(best, x[i]);
  }
  return best;
}

template <typename T>
T ExpSubSum(const RowKernels<T>& k, T* x, T shift, int64_t count) {
  if (k.exp_sub_sum != nullptr) return k.exp_sub_sum(x, shift, count);
  T sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// x^T a x - 2 g . x + c: a quadratic's value at x ([n]; a [n, n]).
template <typename T>
double Quadratic(int32_t n, const T* a, const T* g, double c, const T* x) {
  double q = c;
  for (int32_t r = 0; r < n; ++r) {
    double ax = 0.0;
    for (int32_t k = 0; k < n; ++k) ax += double(a[r * n + k]) * x[k];
    q += double(x[r]) * ax - 2.0 * double(g[r]) * x[r];
  }
  return q;
}

// min 1/2 u^T a u - b . u over lo <= u <= hi (a [n, n] positive definite): the free
// variables solved by Cholesky, those that leave the box fixed at the bound, a bound one
// freed again when its gradient points inward, a few rounds; `u` clamped at the end.
template <typename T>
void BoxSolve(int32_t n, const std::vector<T>& a, const std::vector<T>& b, T lo, T hi,
              std::vector<T>* u) {
  u->assign(static_cast<size_t>(n), T(1));
  std::vector<int8_t> at(static_cast<size_t>(n), 0);  // -1 lower, +1 upper, 0 free
  std::vector<int32_t> free;
  std::vector<T> factor, rhs;
  for (int32_t round = 0; round < 8; ++round) {
    free.clear();
    for (int32_t r = 0; r < n; ++r) {
      if (at[r] == 0) free.push_back(r);
    }
    const auto f = static_cast<int32_t>(free.size());
    if (f > 0) {
      factor.resize(static_cast<size_t>(f) * f);
      rhs.resize(static_cast<size_t>(f));
      for (int32_t x = 0; x < f; ++x) {
        double v = b[free[x]];
        for (int32_t r = 0; r < n; ++r) {
          if (at[r] != 0) v -= double(a[free[x] * n + r]) * (*u)[r];
        }
        rhs[x] = T(v);
        for (int32_t y = 0; y < f; ++y) factor[x * f + y] = a[free[x] * n + free[y]];
      }
      if (!Cholesky(f, factor.data())) break;
      CholeskySolve(f, 1, factor.data(), rhs.data());
      for (int32_t x = 0; x < f; ++x) (*u)[free[x]] = rhs[x];
    }
    bool changed = false;
    for (int32_t r = 0; r < n; ++r) {
      if (at[r] == 0 && ((*u)[r] < lo || (*u)[r] > hi)) {
        at[r] = (*u)[r] < lo ? -1 : 1;
        (*u)[r] = at[r] < 0 ? lo : hi;
        changed = true;
      }
    }
    if (!changed) {  // release a bound whose gradient points into the box
      for (int32_t r = 0; r < n; ++r) {
        if (at[r] == 0) continue;
        double gradient = -double(b[r]);
        for (int32_t k = 0; k < n; ++k) gradient += double(a[r * n + k]) * (*u)[k];
        if ((at[r] < 0 && gradient < 0) || (at[r] > 0 && gradient > 0)) {
          at[r] = 0;
          changed = true;
        }
      }
    }
    if (!changed) break;
  }
  for (T& x : *u) x = std::clamp(x, lo, hi);
}

// The normal equations of a least squares over query rows, split into the fitted and the
// held-out queries: Gram a^T a, cross products a^T z (one vector per target column) and the
// targets' squared norm.
template <typename T>
struct Normal {
  std::vector<T> gram, cross;  // [cols, cols], [k, cols]
  double targets_norm = 0.0;
};

// Of `a` ([m, cols] at stride lda, columns [0, cols)) against `z` ([m, k]): the held-out
// part from its rows, the fitted part as all less held-out (one product over every row).
template <typename T>
double Normals(int32_t m, int32_t cols, const T* a, int32_t lda, const T* z, int32_t k,
               Normal<T>* fit, Normal<T>* held) {
  double flops = 0.0;
  const auto build = [&](int32_t rows, const T* pa, int32_t pld, const T* pz, Normal<T>* out) {
    out->gram.assign(static_cast<size_t>(cols) * cols, T(0));
    out->cross.assign(static_cast<size_t>(k) * cols, T(0));
    out->targets_norm = 0.0;
    if (rows == 0) return;
    Gram<T>(cols, rows, pa, pld, out->gram.data());
    Gemm(true, false, k, cols, rows, T(1), pz, k, pa, pld, T(0), out->cross.data(), cols);
    for (int64_t e = 0; e < int64_t{rows} * k; ++e) out->targets_norm += double(pz[e]) * pz[e];
    flops += double(rows) * cols * cols + 2.0 * rows * cols * k;
  };
  std::vector<T> held_a, held_z;
  int32_t held_rows = 0;
  for (int32_t i = 0; i < m; ++i) {
    if (!HeldOut(i, m)) continue;
    held_a.insert(held_a.end(), a + static_cast<size_t>(i) * lda,
                  a + static_cast<size_t>(i) * lda + cols);
    held_z.insert(held_z.end(), z + static_cast<size_t>(i) * k, z + static_cast<size_t>(i + 1) * k);
    ++held_rows;
  }
  build(m, a, lda, z, fit);
  build(held_rows, held_a.data(), cols, held_z.data(), held);
  for (size_t e = 0; e < fit->gram.size(); ++e) fit->gram[e] -= held->gram[e];
  for (size_t e = 0; e < fit->cross.size(); ++e) fit->cross[e] -= held->cross[e];
  fit->targets_norm -= held->targets_norm;
  return flops;
}

}  // namespace internal

template <typename T>
HeadFitStats FitHead(const HeadFitJob<T>& job) {
  using internal::Normal;
  HeadFitStats stats;
  const int32_t m = job.queries, n = job.entries, dk = job.key_dim, dv = job.value_dim;
  const int32_t blocks = job.blocks, t = job.rows;
  const bool values = job.fit_values && dv > 0 &&
                      std::any_of(job.row_merged, job.row_merged + t, [](uint8_t x) { return x; });
  constexpr T kNone = -std::numeric_limits<T>::infinity();
  const auto& kernels = job.kernels;

  // Each block's range of entries and of rows (both ordered by block), and where its merged
  // rows start.
  std::vector<int32_t> entry_begin(static_cast<size_t>(blocks) + 1, n);
  std::vector<int32_t> row_begin(static_cast<size_t>(blocks) + 1, t);
  std::vector<int32_t> merged_begin(static_cast<size_t>(blocks), 0);
  for (int32_t j = n - 1; j >= 0; --j) entry_begin[job.entry_block[j]] = j;
  for (int32_t r = t - 1; r >= 0; --r) row_begin[job.row_block[r]] = r;
  for (int32_t b = blocks - 1; b >= 0; --b) {
    entry_begin[b] = std::min(entry_begin[b], entry_begin[b + 1]);
    row_begin[b] = std::min(row_begin[b], row_begin[b + 1]);
  }
  for (int32_t b = 0; b < blocks; ++b) {
    int32_t r = row_begin[b];
    while (r < row_begin[b + 1] && job.row_merged[r] == 0) ++r;
    merged_begin[b] = r;
  }

  auto clock = std::chrono::steady_clock::now();
  const auto lap = [&clock](double* into) {
    const auto now = std::chrono::steady_clock::now();
    *into += std::chrono::duration<double>(now - clock).count();
    clock = now;
  };
  // A. Per query: the shift m_i, the total mass y_i and per block its mass y_ib,
  // accumulated over chunks of entries at a running shift.
  std::vector<T> shift(static_cast<size_t>(m), kNone), total(static_cast<size_t>(m), T(0));
  // Block-major ([block][query]), so that each block's part is contiguous.
  const auto at = [m](int32_t b, int32_t i) { return static_cast<size_t>(b) * m + i; };
  std::vector<T> mass(static_cast<size_t>(m) * blocks, T(0));
  std::vector<T> at_shift(static_cast<size_t>(m) * blocks, kNone);
  const auto rescale = [&](int32_t i, int32_t b) {
    T& from = at_shift[at(b, i)];
    if (from == shift[i]) return;
    if (from != kNone) mass[at(b, i)] *= std::exp(from - shift[i]);
    from = shift[i];
  };
  const int32_t chunk = std::min(internal::kLogitChunk, n);
  // The large buffers are the thread's own, kept between heads: fresh pages cost more than
  // the arithmetic that fills them.
  thread_local std::vector<T> logits, features, by_block;
  logits.resize(static_cast<size_t>(m) * chunk);
  // The blocks of entries [j0, j0 + w) as (block, first, end) within the chunk.
  const auto segments = [&](int32_t j0, int32_t w, auto&& fn) {
    for (int32_t b = job.entry_block[j0]; b <= job.entry_block[j0 + w - 1]; ++b) {
      const int32_t lo = std::max(entry_begin[b], j0) - j0;
      const int32_t hi = std::min(entry_begin[b + 1], j0 + w) - j0;
      if (lo < hi) fn(b, lo, hi);
    }
  };
  // The logits s q_i . k_j + ln c_j of entries [j0, j0 + w), one product for every query,
  // into `out` ([m, w]); on_row(i, row, top) then sees query i's row and its largest logit.
  const auto chunk_logits = [&](int32_t j0, int32_t w, T* out, auto&& on_row) {
    Gemm(false, true, m, w, dk, job.scale, job.query_rows, dk,
         job.keys + static_cast<size_t>(j0) * dk, dk, T(0), out, w);
    stats.flops += 2.0 * m * w * dk;
    for (int32_t i = 0; i < m; ++i) {
      T* row = out + static_cast<size_t>(i) * w;
      on_row(i, row, internal::AddMax(kernels, row, job.log_counts + j0, w));
    }
  };
  // With values to fit, the exps of this pass are kept (chunk at j0: [m, w] at m * j0, each
  // row at the shift it was taken at) when they fit in kKeptExpBytes, so that the values'
  // pass only rescales them.
  const bool keep_exps = values && static_cast<int64_t>(m) * n * static_cast<int64_t>(sizeof(T)) <=
                                       internal::kKeptExpBytes;
  std::unique_ptr<T[]> kept_exps(keep_exps ? new T[static_cast<size_t>(m) * n] : nullptr);
  std::vector<T> kept_shift(keep_exps ? static_cast<size_t>(m) * ((n + chunk - 1) / chunk) : 0);
  const auto exps_of = [&](int32_t j0) {
    return keep_exps ? kept_exps.get() + static_cast<size_t>(j0) * m : logits.data();
  };
  for (int32_t j0 = 0; j0 < n; j0 += chunk) {
    const int32_t w = std::min(chunk, n - j0);
    chunk_logits(j0, w, exps_of(j0), [&](int32_t i, T* row, T top) {
      if (top > shift[i]) {
        if (shift[i] != kNone) total[i] *= std::exp(shift[i] - top);
        shift[i] = top;
      }
      segments(j0, w, [&](int32_t b, int32_t lo, int32_t hi) {
        rescale(i, b);
        const T sum = internal::ExpSubSum(kernels, row + lo, shift[i], hi - lo);
        mass[at(b, i)] += sum;
        total[i] += sum;
      });
      if (keep_exps) kept_shift[static_cast<size_t>(j0 / chunk) * m + i] = shift[i];
    });
  }
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t b = 0; b < blocks; ++b) rescale(i, b);
  }

  lap(&stats.seconds_masses);
  // B. F_ir = exp(s q_i . kappa_r - m_i) for every row, one product.
  features.resize(static_cast<size_t>(m) * t);
  if (t > 0) {
    Gemm(false, true, m, t, dk, job.scale, job.query_rows, dk, job.row_keys, dk, T(0),
         features.data(), t);
    stats.flops += 2.0 * m * t * dk;
    for (int32_t i = 0; i < m; ++i) {
      internal::ExpSubSum(kernels, features.data() + static_cast<size_t>(i) * t, shift[i], t);
    }
  }
  // Block-major: block b's [m, tb] at m * row_begin[b].
  {
    by_block.resize(features.size());
    for (int32_t i = 0; i < m; ++i) {
      const T* f = features.data() + static_cast<size_t>(i) * t;
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t r0 = row_begin[b], tb = row_begin[b + 1] - r0;
        std::copy_n(f + r0, tb, by_block.data() + static_cast<size_t>(m) * r0 +
                                    static_cast<size_t>(i) * tb);
      }
    }
    features.swap(by_block);
  }
  // Row i of block b's features ([tb]).
  const auto block_features = [&](int32_t b, int32_t i) {
    const int32_t r0 = row_begin[b], tb = row_begin[b + 1] - r0;
    return features.data() + static_cast<size_t>(m) * r0 + static_cast<size_t>(i) * tb;
  };
  std::vector<T> inverse_total(static_cast<size_t>(m));
  for (int32_t i = 0; i < m; ++i) inverse_total[i] = T(1) / total[i];

  lap(&stats.seconds_features);
  // C. The weights, block by block.
  const T lo = std::exp(-job.bound), hi = std::exp(job.bound);
  struct BlockWeights {
    Normal<T> fit, held;
    double tau = 0.0;
  };
  std::vector<BlockWeights> weight_blocks(static_cast<size_t>(blocks));
  std::vector<T> design, targets;
  for (int32_t b = 0; b < blocks; ++b) {
    const int32_t r0 = row_begin[b], tb = row_begin[b + 1] - r0;
    if (tb == 0) continue;
    design.resize(static_cast<size_t>(m) * tb);
    targets.resize(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) {
      const T* f = block_features(b, i);
      T* x = design.data() + static_cast<size_t>(i) * tb;
      for (int32_t c = 0; c < tb; ++c) x[c] = f[c] * job.row_counts[r0 + c] * inverse_total[i];
      targets[i] = mass[at(b, i)] * inverse_total[i];
    }
    BlockWeights& bw = weight_blocks[b];
    stats.flops += internal::Normals(m, tb, design.data(), tb, targets.data(), 1, &bw.fit,
                                     &bw.held);
    double trace = 0.0;
    for (int32_t x = 0; x < tb; ++x) trace += bw.fit.gram[x * tb + x] + bw.held.gram[x * tb + x];
    bw.tau = std::max(trace / tb, 1e-30);
  }
  // Solves every block at ridge `ridge` from the fitted queries (or all of them) into u.
  std::vector<T> u(static_cast<size_t>(t), T(1));
  const auto solve_weights = [&](double ridge, bool all_queries, double* held_error) {
    std::vector<T> a, rhs, x;
    double error = 0.0;
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t r0 = row_begin[b], tb = row_begin[b + 1] - r0;
      if (tb == 0) continue;
      const BlockWeights& bw = weight_blocks[b];
      a = bw.fit.gram;
      rhs = bw.fit.cross;
      if (all_queries) {
        for (size_t k = 0; k < a.size(); ++k) a[k] += bw.held.gram[k];
        for (size_t k = 0; k < rhs.size(); ++k) rhs[k] += bw.held.cross[k];
      }
      const T penalty = T(ridge * bw.tau);
      for (int32_t k = 0; k < tb; ++k) {
        a[k * tb + k] += penalty;
        rhs[k] += penalty;
      }
      internal::BoxSolve(tb, a, rhs, lo, hi, &x);
      stats.flops += double(tb) * tb * tb / 3.0;
      std::copy(x.begin(), x.end(), u.begin() + r0);
      if (held_error != nullptr) {
        error += internal::Quadratic(tb, bw.held.gram.data(), bw.held.cross.data(),
                                     bw.held.targets_norm, x.data());
      }
    }
    if (held_error != nullptr) *held_error = error;
  };
  double before = 0.0;
  for (int32_t b = 0; b < blocks; ++b) {
    const int32_t tb = row_begin[b + 1] - row_begin[b];
    if (tb == 0) continue;
    const std::vector<T> ones(static_cast<size_t>(tb), T(1));
    const BlockWeights& bw = weight_blocks[b];
    before += internal::Quadratic(tb, bw.held.gram.data(), bw.held.cross.data(),
                                  bw.held.targets_norm, ones.data());
  }
  stats.mass_error_before = stats.mass_error_after = before;
  double best_ridge = 1e-2;  // without held-out queries
  if (m >= 8) {
    best_ridge = 0.0;
    double best = before;
    for (double ridge : internal::kWeightRidges) {
      double error = 0.0;
      solve_weights(ridge, false, &error);
      if (error < best) {
        best = error;
        best_ridge = ridge;
      }
    }
    stats.mass_error_after = best;
  }
  if (best_ridge > 0.0) {
    solve_weights(best_ridge, true, nullptr);
  } else {
    std::fill(u.begin(), u.end(), T(1));
  }
  stats.weight_ridge = best_ridge;
  std::vector<T> weight(static_cast<size_t>(t));
  lap(&stats.seconds_weights);
  for (int32_t r = 0; r < t; ++r) {
    weight[r] = job.row_counts[r] * u[r];
    job.log_weights[r] = std::log(weight[r]);
  }

  // D. The merged rows' values, block by block. With p_ir = w_r F_ir / Z_i the compressed
  // attention, block b's target for query i is s_ib sum_{j in b} E_ij v_j, s_ib =
  // (Z_ib / Z_i) / y_ib (its share of the compressed attention times the full cache's mean
  // value over its entries), less its exact rows' part sum_{r exact} p_ir nu_r. The normal
  // equations of its merged rows need only S_b^T E_b V_b (S = p over the merged rows times
  // s): a second pass over the cache's logits, small products per block, no [m, dv]
  // numerator per block kept.
  if (!values) return stats;
  std::vector<T> compressed(static_cast<size_t>(m), T(0));
  std::vector<T> block_compressed(static_cast<size_t>(m) * blocks, T(0));
  for (int32_t b = 0; b < blocks; ++b) {
    const int32_t r0 = row_begin[b], tb = row_begin[b + 1] - r0;
    for (int32_t i = 0; i < m; ++i) {
      const T* f = block_features(b, i);
      T sum = 0;
      for (int32_t c = 0; c < tb; ++c) sum += f[c] * weight[r0 + c];
      block_compressed[at(b, i)] = sum;
      compressed[i] += sum;
    }
  }
  struct BlockValues {
    int32_t first = 0, count = 0;       // the merged rows refitted
    std::vector<T> gram_fit, gram_held;  // [cb, cb]
    std::vector<T> scaled[2];            // S ([m, cb]), rows of the other split zeroed
    std::vector<T> cross[2];             // [cb, dv]: S^T E V less the exact rows' part
    double tau = 0.0;
  };
  std::vector<BlockValues> value_blocks(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) {
    const int32_t r0 = row_begin[b], c0 = merged_begin[b], tb = row_begin[b + 1] - r0;
    const int32_t cb = row_begin[b + 1] - c0, eb = c0 - r0;
    BlockValues& bv = value_blocks[b];
    bv.first = c0;
    bv.count = cb;
    if (cb == 0) continue;
    design.resize(static_cast<size_t>(m) * tb);  // p over the block's rows
    for (int split = 0; split < 2; ++split) {
      bv.scaled[split].assign(static_cast<size_t>(m) * cb, T(0));
      bv.cross[split].assign(static_cast<size_t>(cb) * dv, T(0));
    }
    for (int32_t i = 0; i < m; ++i) {
      const T inverse = T(1) / compressed[i];
      const T* f = block_features(b, i);
      T* x = design.data() + static_cast<size_t>(i) * tb;
      for (int32_t c = 0; c < tb; ++c) x[c] = f[c] * weight[r0 + c] * inverse;
      const T full_block = mass[at(b, i)];
      const T share = block_compressed[at(b, i)] * inverse;
      const T mean_scale = full_block > total[i] * T(1e-12) ? share / full_block : T(0);
      T* into = bv.scaled[internal::HeldOut(i, m) ? 1 : 0].data() + static_cast<size_t>(i) * cb;
      for (int32_t c = 0; c < cb; ++c) into[c] = x[eb + c] * mean_scale;
    }
    // Grams of the merged rows' p, fitted and held-out queries (all less held-out).
    internal::Normal<T> fit, held;
    std::vector<T> no_targets(static_cast<size_t>(m), T(0));
    stats.flops += internal::Normals(m, cb, design.data() + eb, tb, no_targets.data(), 1, &fit,
                                     &held);
    bv.gram_fit = std::move(fit.gram);
    bv.gram_held = std::move(held.gram);
    double trace = 0.0;
    for (int32_t x = 0; x < cb; ++x) trace += bv.gram_fit[x * cb + x] + bv.gram_held[x * cb + x];
    bv.tau = std::max(trace / cb, 1e-30);
    // Less the exact rows' part: p_C^T p_E nu_E, for each split's queries.
    if (eb > 0) {
      std::vector<T> pe(static_cast<size_t>(cb) * eb);
      std::vector<T> masked(design);
      for (int split = 0; split < 2; ++split) {
        for (int32_t i = 0; i < m; ++i) {
          const bool mine = internal::HeldOut(i, m) == (split == 1);
          T* x = masked.data() + static_cast<size_t>(i) * tb;
          const T* from = design.data() + static_cast<size_t>(i) * tb;
          for (int32_t c = 0; c < tb; ++c) x[c] = mine ? from[c] : T(0);
        }
        Gemm(true, false, cb, eb, m, T(1), masked.data() + eb, tb, masked.data(), tb, T(0),
             pe.data(), eb);
        Gemm(false, false, cb, dv, eb, T(-1), pe.data(), eb,
             job.row_values + static_cast<size_t>(r0) * dv, dv, T(1), bv.cross[split].data(),
             dv);
        stats.flops += 2.0 * cb * eb * m + 2.0 * cb * eb * dv;
      }
    }
  }
  // The second pass: E over chunks again at the final shifts (the kept exps rescaled, or
  // computed again), S_b^T E_b V_b per block.
  std::vector<T> projected;
  for (int32_t j0 = 0; j0 < n; j0 += chunk) {
    const int32_t w = std::min(chunk, n - j0);
    T* const exps = exps_of(j0);
    if (keep_exps) {
      for (int32_t i = 0; i < m; ++i) {
        const T taken_at = kept_shift[static_cast<size_t>(j0 / chunk) * m + i];
        if (taken_at == shift[i]) continue;
        const T factor = std::exp(taken_at - shift[i]);
        T* row = exps + static_cast<size_t>(i) * w;
        for (int32_t j = 0; j < w; ++j) row[j] *= factor;
      }
    } else {
      chunk_logits(j0, w, exps, [&](int32_t i, T* row, T /*top*/) {
        internal::ExpSubSum(kernels, row, shift[i], w);
      });
    }
    segments(j0, w, [&](int32_t b, int32_t lo, int32_t hi) {
      BlockValues& bv = value_blocks[b];
      const int32_t cb = bv.count, seg = hi - lo;
      if (cb == 0) return;
      projected.resize(static_cast<size_t>(cb) * seg);
      for (int split = 0; split < 2; ++split) {
        Gemm(true, false, cb, seg, m, T(1), bv.scaled[split].data(), cb, exps + lo, w, T(0),
             projected.data(), seg);
        Gemm(false, false, cb, dv, seg, T(1), projected.data(), seg,
             job.values + static_cast<size_t>(j0 + lo) * dv, dv, T(1), bv.cross[split].data(),
             dv);
        stats.flops += 2.0 * cb * seg * m + 2.0 * cb * seg * dv;
      }
    });
  }
  // The merged values of a block as [dv, cb] (one vector per value dim), and the held-out
  // error of values nu less its error at the merged values (the targets' norm cancels).
  const auto current_values = [&](const BlockValues& bv) {
    std::vector<T> nu(static_cast<size_t>(dv) * bv.count);
    for (int32_t x = 0; x < bv.count; ++x) {
      for (int32_t d = 0; d < dv; ++d) {
        nu[static_cast<size_t>(d) * bv.count + x] =
            job.row_values[static_cast<size_t>(bv.first + x) * dv + d];
      }
    }
    return nu;
  };
  // cross as [dv, cb] for Quadratic and the solves.
  const auto cross_by_dim = [&](const BlockValues& bv, int split) {
    std::vector<T> c(static_cast<size_t>(dv) * bv.count);
    for (int32_t x = 0; x < bv.count; ++x) {
      for (int32_t d = 0; d < dv; ++d) {
        c[static_cast<size_t>(d) * bv.count + x] = bv.cross[split][static_cast<size_t>(x) * dv + d];
      }
    }
    return c;
  };
  const auto held_error = [&](const BlockValues& bv, const std::vector<T>& held_cross,
                              const std::vector<T>& nu) {
    double error = 0.0;
    for (int32_t d = 0; d < dv; ++d) {
      error += internal::Quadratic(bv.count, bv.gram_held.data(),
                                   held_cross.data() + static_cast<size_t>(d) * bv.count, 0.0,
                                   nu.data() + static_cast<size_t>(d) * bv.count);
    }
    return error;
  };
  // nu at ridge `ridge` (towards the merged values) from the fitted or all queries.
  const auto solve_values = [&](const BlockValues& bv, const std::vector<T>& fit_cross,
                                const std::vector<T>& held_cross, double ridge,
                                bool all_queries) {
    const int32_t cb = bv.count;
    std::vector<T> a = bv.gram_fit, nu = fit_cross;
    if (all_queries) {
      for (size_t k = 0; k < a.size(); ++k) a[k] += bv.gram_held[k];
      for (size_t k = 0; k < nu.size(); ++k) nu[k] += held_cross[k];
    }
    const std::vector<T> prior = current_values(bv);
    const T penalty = T(ridge * bv.tau);
    for (int32_t k = 0; k < cb; ++k) a[k * cb + k] += penalty;
    for (size_t k = 0; k < nu.size(); ++k) nu[k] += penalty * prior[k];
    if (!Cholesky(cb, a.data())) return prior;
    CholeskySolve(cb, dv, a.data(), nu.data());
    stats.flops += double(cb) * cb * cb / 3.0 + 2.0 * cb * cb * dv;
    return nu;
  };
  std::vector<std::vector<T>> fit_cross(static_cast<size_t>(blocks)),
      held_cross(static_cast<size_t>(blocks));
  double value_before = 0.0;
  for (int32_t b = 0; b < blocks; ++b) {
    const BlockValues& bv = value_blocks[b];
    if (bv.count == 0) continue;
    fit_cross[b] = cross_by_dim(bv, 0);
    held_cross[b] = cross_by_dim(bv, 1);
    value_before += held_error(bv, held_cross[b], current_values(bv));
  }
  stats.value_error_before = stats.value_error_after = value_before;
  double value_ridge = 1e-1;
  if (m >= 8) {
    value_ridge = 0.0;
    double best = value_before;
    for (double ridge : internal::kValueRidges) {
      double error = 0.0;
      for (int32_t b = 0; b < blocks; ++b) {
        const BlockValues& bv = value_blocks[b];
        if (bv.count == 0) continue;
        error += held_error(bv, held_cross[b],
                            solve_values(bv, fit_cross[b], held_cross[b], ridge, false));
      }
      if (error < best) {
        best = error;
        value_ridge = ridge;
      }
    }
    stats.value_error_after = best;
  }
  stats.value_ridge = value_ridge;
  if (value_ridge > 0.0) {
    for (int32_t b = 0; b < blocks; ++b) {
      const BlockValues& bv = value_blocks[b];
      if (bv.count == 0) continue;
      const std::vector<T> nu = solve_values(bv, fit_cross[b], held_cross[b], value_ridge, true);
      for (int32_t x = 0; x < bv.count; ++x) {
        for (int32_t d = 0; d < dv; ++d) {
          job.row_values[static_cast<size_t>(bv.first + x) * dv + d] =
              nu[static_cast<size_t>(d) * bv.count + x];
        }
      }
    }
  }
  lap(&stats.seconds_values);
  return stats;
}

}  // namespace centroidkv::fit
