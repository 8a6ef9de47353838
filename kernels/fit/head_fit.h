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
// entries) are refitted the same way: each block's rows match the attention numerator of
// its entries, sum_r (w_r F_ir / y_i) nu_r against sum_j (c_j exp(...) / y_i) v_j, ridge
// towards the merged values with mu from a grid on the held-out queries; exact rows keep
// their values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/fit/blas.h"

namespace centroidkv::fit {

// What one head's fit did: its arithmetic (the multiply-adds of its matrix products, as
// 2 flops each), the held-out errors without and with the fit, and the ridge it chose
// (0: no fit kept).
struct HeadFitStats {
  double flops = 0.0;
  double mass_error_before = 0.0, mass_error_after = 0.0;
  double value_error_before = 0.0, value_error_after = 0.0;
  double weight_ridge = 0.0, value_ridge = 0.0;
};

template <typename T>
struct HeadFitJob {
  // The full head, every real entry.
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
  // The result's rows of this head.
  int32_t rows = 0;
  const T* row_keys = nullptr;     // [rows, key_dim]
  T* row_values = nullptr;         // [rows, value_dim], refitted in place
  const T* row_counts = nullptr;   // [rows] w0
  const int32_t* row_block = nullptr;  // [rows]
  const uint8_t* row_merged = nullptr;  // [rows] 1 where the row stands for 2+ entries
  int32_t blocks = 1;
  bool fit_values = true;
  T bound = 3;  // |ln u_r| <= bound
  void (*exp_in_place)(T* x, int64_t count) = nullptr;
  T* log_weights = nullptr;  // [rows] out
};

namespace internal {

inline constexpr double kWeightRidges[] = {1e-4, 1e-3, 1e-2, 1e-1, 1.0};
inline constexpr double kValueRidges[] = {1e-3, 1e-2, 1e-1, 1.0, 10.0};
inline constexpr int32_t kLogitChunk = 512;

// Query i is held out when i % 4 == 3, if there are at least 8.
inline bool HeldOut(int32_t i, int32_t queries) { return queries >= 8 && i % 4 == 3; }

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

template <typename T>
void ExpInPlace(const HeadFitJob<T>& job, T* x, int64_t count) {
  if (job.exp_in_place != nullptr) {
    job.exp_in_place(x, count);
    return;
  }
  for (int64_t i = 0; i < count; ++i) x[i] = std::exp(x[i]);
}

}  // namespace internal

template <typename T>
HeadFitStats FitHead(const HeadFitJob<T>& job) {
  using internal::HeldOut;
  HeadFitStats stats;
  const int32_t m = job.queries, n = job.entries, dk = job.key_dim, dv = job.value_dim;
  const int32_t blocks = job.blocks, t = job.rows;
  const bool values = job.fit_values && dv > 0 &&
                      std::any_of(job.row_merged, job.row_merged + t, [](uint8_t x) { return x; });
  constexpr T kNone = -std::numeric_limits<T>::infinity();

  // A. Per query: the shift m_i, the total mass y_i, and per block its mass y_ib and (for
  // the values) its numerator, accumulated over chunks of entries at a running shift.
  std::vector<T> shift(static_cast<size_t>(m), kNone), total(static_cast<size_t>(m), T(0));
  std::vector<T> mass(static_cast<size_t>(m) * blocks, T(0));
  std::vector<T> at_shift(static_cast<size_t>(m) * blocks, kNone);
  std::vector<T> numer(values ? static_cast<size_t>(m) * blocks * dv : 0, T(0));
  const auto rescale = [&](int32_t i, int32_t b) {
    T& from = at_shift[static_cast<size_t>(i) * blocks + b];
    if (from == shift[i]) return;
    if (from != kNone) {
      const T factor = std::exp(from - shift[i]);
      mass[static_cast<size_t>(i) * blocks + b] *= factor;
      if (values) {
        T* row = numer.data() + (static_cast<size_t>(i) * blocks + b) * dv;
        for (int32_t d = 0; d < dv; ++d) row[d] *= factor;
      }
    }
    from = shift[i];
  };
  const int32_t chunk = std::min(internal::kLogitChunk, n);
  std::vector<T> logits(static_cast<size_t>(m) * chunk), sorted(values ? logits.size() : 0);
  std::vector<T> sorted_values(values ? static_cast<size_t>(chunk) * dv : 0);
  std::vector<int32_t> order(static_cast<size_t>(chunk));
  for (int32_t j0 = 0; j0 < n; j0 += chunk) {
    const int32_t w = std::min(chunk, n - j0);
    Gemm(false, true, m, w, dk, job.scale, job.query_rows, dk,
         job.keys + static_cast<size_t>(j0) * dk, dk, T(0), logits.data(), w);
    stats.flops += 2.0 * m * w * dk;
    for (int32_t i = 0; i < m; ++i) {
      T* row = logits.data() + static_cast<size_t>(i) * w;
      T top = kNone;
      for (int32_t j = 0; j < w; ++j) {
        row[j] += job.log_counts[j0 + j];
        top = std::max(top, row[j]);
      }
      if (top > shift[i]) {
        if (shift[i] != kNone) total[i] *= std::exp(shift[i] - top);
        shift[i] = top;
      }
      for (int32_t j = 0; j < w; ++j) row[j] -= shift[i];
    }
    internal::ExpInPlace(job, logits.data(), static_cast<int64_t>(m) * w);
    // The chunk's entries grouped by block (usually one or two).
    std::iota(order.begin(), order.begin() + w, j0);
    std::stable_sort(order.begin(), order.begin() + w, [&](int32_t a, int32_t b) {
      return job.entry_block[a] < job.entry_block[b];
    });
    for (int32_t i = 0; i < m; ++i) {
      const T* row = logits.data() + static_cast<size_t>(i) * w;
      T sum = 0;
      for (int32_t j = 0; j < w; ++j) sum += row[j];
      total[i] += sum;
      for (int32_t x = 0; x < w;) {
        const int32_t b = job.entry_block[order[x]];
        rescale(i, b);
        T block_sum = 0;
        for (; x < w && job.entry_block[order[x]] == b; ++x) block_sum += row[order[x] - j0];
        mass[static_cast<size_t>(i) * blocks + b] += block_sum;
      }
    }
    if (!values) continue;
    for (int32_t i = 0; i < m; ++i) {
      for (int32_t x = 0; x < w; ++x) {
        sorted[static_cast<size_t>(i) * w + x] = logits[static_cast<size_t>(i) * w + order[x] - j0];
      }
    }
    for (int32_t x = 0; x < w; ++x) {
      std::copy_n(job.values + static_cast<size_t>(order[x]) * dv, dv,
                  sorted_values.data() + static_cast<size_t>(x) * dv);
    }
    for (int32_t x = 0; x < w;) {
      const int32_t b = job.entry_block[order[x]];
      int32_t end = x;
      while (end < w && job.entry_block[order[end]] == b) ++end;
      Gemm(false, false, m, dv, end - x, T(1), sorted.data() + x, w,
           sorted_values.data() + static_cast<size_t>(x) * dv, dv, T(1),
           numer.data() + static_cast<size_t>(b) * dv, blocks * dv);
      stats.flops += 2.0 * m * (end - x) * dv;
      x = end;
    }
  }
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t b = 0; b < blocks; ++b) rescale(i, b);
  }

  // B. Each block's rows and F_ir = exp(s q_i . kappa_r - m_i).
  std::vector<std::vector<int32_t>> block_rows(static_cast<size_t>(blocks));
  for (int32_t r = 0; r < t; ++r) block_rows[job.row_block[r]].push_back(r);
  std::vector<std::vector<T>> features(static_cast<size_t>(blocks));
  std::vector<T> gathered;
  for (int32_t b = 0; b < blocks; ++b) {
    const auto& rows = block_rows[b];
    const auto tb = static_cast<int32_t>(rows.size());
    if (tb == 0) continue;
    gathered.resize(static_cast<size_t>(tb) * dk);
    for (int32_t x = 0; x < tb; ++x) {
      std::copy_n(job.row_keys + static_cast<size_t>(rows[x]) * dk, dk,
                  gathered.data() + static_cast<size_t>(x) * dk);
    }
    std::vector<T>& f = features[b];
    f.resize(static_cast<size_t>(m) * tb);
    Gemm(false, true, m, tb, dk, job.scale, job.query_rows, dk, gathered.data(), dk, T(0),
         f.data(), tb);
    stats.flops += 2.0 * m * tb * dk;
    for (int32_t i = 0; i < m; ++i) {
      for (int32_t x = 0; x < tb; ++x) f[static_cast<size_t>(i) * tb + x] -= shift[i];
    }
    internal::ExpInPlace(job, f.data(), static_cast<int64_t>(m) * tb);
  }

  // Splits the [m, cols] matrix `a` into its fitted and held-out query rows, and returns
  // their Grams and, against targets [m, k] (`targets`), the cross products a^T z and the
  // targets' squared norm.
  struct Normal {
    std::vector<T> gram, cross;  // [cols, cols], [k, cols] (one vector per target column)
    double targets_norm = 0.0;
  };
  const auto normals = [&](const std::vector<T>& a, int32_t cols, const std::vector<T>& targets,
                           int32_t k, Normal* fit, Normal* held) {
    std::vector<T> part_a, part_z;
    for (int held_out = 0; held_out < 2; ++held_out) {
      part_a.clear();
      part_z.clear();
      int32_t rows_in = 0;
      double norm = 0.0;
      for (int32_t i = 0; i < m; ++i) {
        if (HeldOut(i, m) != (held_out == 1)) continue;
        part_a.insert(part_a.end(), a.begin() + static_cast<size_t>(i) * cols,
                      a.begin() + static_cast<size_t>(i + 1) * cols);
        part_z.insert(part_z.end(), targets.begin() + static_cast<size_t>(i) * k,
                      targets.begin() + static_cast<size_t>(i + 1) * k);
        for (int32_t c = 0; c < k; ++c) norm += double(targets[i * k + c]) * targets[i * k + c];
        ++rows_in;
      }
      Normal& out = held_out == 1 ? *held : *fit;
      out.gram.assign(static_cast<size_t>(cols) * cols, T(0));
      out.cross.assign(static_cast<size_t>(k) * cols, T(0));
      out.targets_norm = norm;
      if (rows_in == 0) continue;
      Gram<T>(cols, rows_in, part_a.data(), cols, out.gram.data());
      // cross[c, r] = sum_i z[i, c] a[i, r]
      Gemm(true, false, k, cols, rows_in, T(1), part_z.data(), k, part_a.data(), cols, T(0),
           out.cross.data(), cols);
      stats.flops += double(rows_in) * cols * cols + 2.0 * rows_in * cols * k;
    }
  };

  // C. The weights, block by block.
  const T lo = std::exp(-job.bound), hi = std::exp(job.bound);
  struct BlockWeights {
    Normal fit, held;
    double tau = 0.0;
  };
  std::vector<BlockWeights> weight_blocks(static_cast<size_t>(blocks));
  std::vector<T> design, targets;
  for (int32_t b = 0; b < blocks; ++b) {
    const auto& rows = block_rows[b];
    const auto tb = static_cast<int32_t>(rows.size());
    if (tb == 0) continue;
    design.resize(static_cast<size_t>(m) * tb);
    targets.resize(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) {
      const T inverse = T(1) / total[i];
      for (int32_t x = 0; x < tb; ++x) {
        design[static_cast<size_t>(i) * tb + x] =
            features[b][static_cast<size_t>(i) * tb + x] * job.row_counts[rows[x]] * inverse;
      }
      targets[i] = mass[static_cast<size_t>(i) * blocks + b] * inverse;
    }
    BlockWeights& bw = weight_blocks[b];
    normals(design, tb, targets, 1, &bw.fit, &bw.held);
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
      const auto& rows = block_rows[b];
      const auto tb = static_cast<int32_t>(rows.size());
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
      for (int32_t k = 0; k < tb; ++k) u[rows[k]] = x[k];
      if (held_error != nullptr) {
        error += internal::Quadratic(tb, bw.held.gram.data(), bw.held.cross.data(),
                                     bw.held.targets_norm, x.data());
      }
    }
    if (held_error != nullptr) *held_error = error;
  };
  double before = 0.0;
  for (int32_t b = 0; b < blocks; ++b) {
    const auto tb = static_cast<int32_t>(block_rows[b].size());
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
  for (int32_t r = 0; r < t; ++r) job.log_weights[r] = std::log(job.row_counts[r] * u[r]);

  // D. The merged rows' values, block by block.
  if (!values) return stats;
  struct BlockValues {
    std::vector<int32_t> merged;  // rows (of the head) refitted
    Normal fit, held;             // over the merged rows, targets [m, dv]
    double tau = 0.0;
  };
  std::vector<BlockValues> value_blocks(static_cast<size_t>(blocks));
  std::vector<T> merged_design, residual;
  // The fitted weights, and each query's compressed attention mass Z_i = sum_r w_r F_ir.
  std::vector<T> weight(static_cast<size_t>(t)), compressed(static_cast<size_t>(m), T(0));
  for (int32_t r = 0; r < t; ++r) weight[r] = job.row_counts[r] * u[r];
  for (int32_t b = 0; b < blocks; ++b) {
    const auto& rows = block_rows[b];
    const auto tb = static_cast<int32_t>(rows.size());
    for (int32_t i = 0; i < m; ++i) {
      for (int32_t x = 0; x < tb; ++x) {
        compressed[i] += features[b][static_cast<size_t>(i) * tb + x] * weight[rows[x]];
      }
    }
  }
  for (int32_t b = 0; b < blocks; ++b) {
    const auto& rows = block_rows[b];
    const auto tb = static_cast<int32_t>(rows.size());
    BlockValues& bv = value_blocks[b];
    std::vector<int32_t> merged_at;  // positions within the block
    for (int32_t x = 0; x < tb; ++x) {
      if (job.row_merged[rows[x]] != 0) {
        bv.merged.push_back(rows[x]);
        merged_at.push_back(x);
      }
    }
    const auto cb = static_cast<int32_t>(bv.merged.size());
    if (cb == 0) continue;
    // p_ir = w_r F_ir / Z_i, the compressed attention; the block's target is its share of
    // that attention, Z_ib / Z_i, times the full cache's mean value over the block's
    // entries, less the exact rows' part.
    merged_design.assign(static_cast<size_t>(m) * cb, T(0));
    residual.resize(static_cast<size_t>(m) * dv);
    for (int32_t i = 0; i < m; ++i) {
      const T inverse = T(1) / compressed[i];
      T block_mass = 0;
      for (int32_t x = 0; x < tb; ++x) {
        block_mass += features[b][static_cast<size_t>(i) * tb + x] * weight[rows[x]];
      }
      const T full_block = mass[static_cast<size_t>(i) * blocks + b];
      const T share = block_mass * inverse;
      const T mean_scale =
          full_block > total[i] * T(1e-12) ? share / full_block : T(0);
      T* z = residual.data() + static_cast<size_t>(i) * dv;
      const T* num = numer.data() + (static_cast<size_t>(i) * blocks + b) * dv;
      for (int32_t d = 0; d < dv; ++d) z[d] = num[d] * mean_scale;
      size_t next = 0;
      for (int32_t x = 0; x < tb; ++x) {
        const int32_t r = rows[x];
        const T p = features[b][static_cast<size_t>(i) * tb + x] * weight[r] * inverse;
        if (next < merged_at.size() && merged_at[next] == x) {
          merged_design[static_cast<size_t>(i) * cb + next] = p;
          ++next;
          continue;
        }
        const T* v = job.row_values + static_cast<size_t>(r) * dv;
        for (int32_t d = 0; d < dv; ++d) z[d] -= p * v[d];
      }
    }
    normals(merged_design, cb, residual, dv, &bv.fit, &bv.held);
    double trace = 0.0;
    for (int32_t x = 0; x < cb; ++x) trace += bv.fit.gram[x * cb + x] + bv.held.gram[x * cb + x];
    bv.tau = std::max(trace / cb, 1e-30);
  }
  // The held-out error of values nu ([dv, cb] per block, column-major by value dim) summed
  // over the value dims: sum_d Quadratic(gram, cross_d, nu_d).
  const auto held_value_error = [&](const BlockValues& bv, const std::vector<T>& nu) {
    const auto cb = static_cast<int32_t>(bv.merged.size());
    double error = bv.held.targets_norm;
    for (int32_t d = 0; d < dv; ++d) {
      error += internal::Quadratic(cb, bv.held.gram.data(),
                                   bv.held.cross.data() + static_cast<size_t>(d) * cb, 0.0,
                                   nu.data() + static_cast<size_t>(d) * cb);
    }
    return error;
  };
  const auto current_values = [&](const BlockValues& bv) {
    const auto cb = static_cast<int32_t>(bv.merged.size());
    std::vector<T> nu(static_cast<size_t>(dv) * cb);
    for (int32_t x = 0; x < cb; ++x) {
      for (int32_t d = 0; d < dv; ++d) {
        nu[static_cast<size_t>(d) * cb + x] = job.row_values[static_cast<size_t>(bv.merged[x]) * dv + d];
      }
    }
    return nu;
  };
  // nu at ridge `ridge` (towards the merged values) from the fitted or all queries.
  const auto solve_values = [&](const BlockValues& bv, double ridge, bool all_queries) {
    const auto cb = static_cast<int32_t>(bv.merged.size());
    std::vector<T> a = bv.fit.gram, nu = bv.fit.cross;
    if (all_queries) {
      for (size_t k = 0; k < a.size(); ++k) a[k] += bv.held.gram[k];
      for (size_t k = 0; k < nu.size(); ++k) nu[k] += bv.held.cross[k];
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
  double value_before = 0.0;
  for (const BlockValues& bv : value_blocks) {
    if (!bv.merged.empty()) value_before += held_value_error(bv, current_values(bv));
  }
  stats.value_error_before = stats.value_error_after = value_before;
  double value_ridge = 1e-1;
  if (m >= 8) {
    value_ridge = 0.0;
    double best = value_before;
    for (double ridge : internal::kValueRidges) {
      double error = 0.0;
      for (const BlockValues& bv : value_blocks) {
        if (!bv.merged.empty()) error += held_value_error(bv, solve_values(bv, ridge, false));
      }
      if (error < best) {
        best = error;
        value_ridge = ridge;
      }
    }
    stats.value_error_after = best;
  }
  stats.value_ridge = value_ridge;
  if (value_ridge == 0.0) return stats;
  for (const BlockValues& bv : value_blocks) {
    if (bv.merged.empty()) continue;
    const std::vector<T> nu = solve_values(bv, value_ridge, true);
    const auto cb = static_cast<int32_t>(bv.merged.size());
    for (int32_t x = 0; x < cb; ++x) {
      for (int32_t d = 0; d < dv; ++d) {
        job.row_values[static_cast<size_t>(bv.merged[x]) * dv + d] = nu[static_cast<size_t>(d) * cb + x];
      }
    }
  }
  return stats;
}

}  // namespace centroidkv::fit
