// The fit stage: one KV head's inputs gathered for FitHead (head_fit.h), a head per task.
#include "kernels/fit/fit_stage.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "kernels/ragged_layer.h"

namespace centroidkv {

namespace {

// The row kernels of precision T: the backend's for float, scalar loops for double.
template <typename T>
fit::RowKernels<T> KernelsFor(const EngineCaps& caps) {
  fit::RowKernels<T> kernels;
  if constexpr (std::is_same_v<T, float>) {
    if (caps.fit_kernels != nullptr) {
      kernels.add_max = caps.fit_kernels->add_max;
      kernels.exp_sub_sum = caps.fit_kernels->exp_sub_sum;
    }
  }
  return kernels;
}

// Fits head `h` of `out` in precision T: its entries and rows gathered in block order
// (head_fit.h's layout), fitted, and the log-weights and values put back in place.
template <typename T>
fit::HeadFitStats FitOneHead(const EngineCaps& caps, const LayerPlan& plan,
                             const LayerView& layer, int32_t h, CompressResult* out) {
  const FitOptions& options = plan.options.fit;
  const int32_t n = plan.head_lengths[h];
  const int32_t dk = layer.key_dim, dv = layer.value_dim;
  const int64_t first = out->offsets[h];
  const auto t = static_cast<int32_t>(out->offsets[h + 1] - first);
  const int32_t block_tokens = options.block_tokens;
  const int32_t blocks = (n + block_tokens - 1) / block_tokens;

  // Rows: each at its earliest entry's block; entries with their row, dropped ones by
  // their own position.
  const int32_t* assignment = out->assignment.data() + AssignmentBase(layer, h);
  std::vector<int32_t> anchor(static_cast<size_t>(t), n), members(static_cast<size_t>(t), 0);
  for (int32_t j = 0; j < n; ++j) {
    if (assignment[j] < 0) continue;
    anchor[assignment[j]] = std::min(anchor[assignment[j]], j);
    ++members[assignment[j]];
  }
  std::vector<int32_t> row_block(static_cast<size_t>(t)), entry_block(static_cast<size_t>(n));
  for (int32_t r = 0; r < t; ++r) row_block[r] = std::min(anchor[r], n - 1) / block_tokens;
  for (int32_t j = 0; j < n; ++j) {
    entry_block[j] = assignment[j] >= 0 ? row_block[assignment[j]] : j / block_tokens;
  }
  // Block order: entries by block (stable); rows by block, exact before merged.
  std::vector<int32_t> entry_order(static_cast<size_t>(n)), row_order(static_cast<size_t>(t));
  std::iota(entry_order.begin(), entry_order.end(), 0);
  std::iota(row_order.begin(), row_order.end(), 0);
  std::stable_sort(entry_order.begin(), entry_order.end(),
                   [&](int32_t a, int32_t b) { return entry_block[a] < entry_block[b]; });
  std::stable_sort(row_order.begin(), row_order.end(), [&](int32_t a, int32_t b) {
    const bool ma = members[a] >= 2, mb = members[b] >= 2;
    return row_block[a] != row_block[b] ? row_block[a] < row_block[b] : ma < mb;
  });

  std::vector<float> row(static_cast<size_t>(std::max(dk, dv)));
  // The head's copies are the thread's own, kept between heads (fresh pages cost more than
  // filling them).
  thread_local std::vector<T> keys, values;
  keys.resize(static_cast<size_t>(n) * dk);
  values.resize(static_cast<size_t>(n) * dv);
  std::vector<T> log_counts(static_cast<size_t>(n));
  std::vector<int32_t> sorted_entry_block(static_cast<size_t>(n));
  for (int32_t x = 0; x < n; ++x) {
    const int32_t j = entry_order[x];
    LoadAsFloats(layer.keys, layer.dtype, layer.KeyOffset(h, j), dk, row.data());
    std::copy_n(row.data(), dk, keys.data() + static_cast<size_t>(x) * dk);
    LoadAsFloats(layer.values, layer.dtype, layer.ValueOffset(h, j), dv, row.data());
    std::copy_n(row.data(), dv, values.data() + static_cast<size_t>(x) * dv);
    log_counts[x] = std::log(static_cast<T>(layer.CountAt(h, j)));
    sorted_entry_block[x] = entry_block[j];
  }
  std::vector<T> row_keys(static_cast<size_t>(t) * dk), row_values(static_cast<size_t>(t) * dv);
  std::vector<T> row_counts(static_cast<size_t>(t)), log_weights(static_cast<size_t>(t));
  std::vector<int32_t> sorted_row_block(static_cast<size_t>(t));
  std::vector<uint8_t> merged(static_cast<size_t>(t));
  for (int32_t x = 0; x < t; ++x) {
    const int64_t r = first + row_order[x];
    std::copy_n(out->keys.data() + r * dk, dk, row_keys.data() + static_cast<size_t>(x) * dk);
    std::copy_n(out->values.data() + r * dv, dv,
                row_values.data() + static_cast<size_t>(x) * dv);
    row_counts[x] = static_cast<T>(out->counts[r]);
    sorted_row_block[x] = row_block[row_order[x]];
    merged[x] = members[row_order[x]] >= 2 ? 1 : 0;
  }
  const int32_t group = layer.QueryGroup();
  const int32_t m = group * layer.num_queries;
  std::vector<T> queries(static_cast<size_t>(m) * dk);
  std::copy_n(layer.queries + static_cast<size_t>(h) * m * dk, static_cast<size_t>(m) * dk,
              queries.data());

  fit::HeadFitJob<T> job;
  job.entries = n;
  job.key_dim = dk;
  job.value_dim = dv;
  job.keys = keys.data();
  job.values = values.data();
  job.log_counts = log_counts.data();
  job.entry_block = sorted_entry_block.data();
  job.queries = m;
  job.query_rows = queries.data();
  job.scale = static_cast<T>(options.query_scale > 0.0 ? options.query_scale
                                                       : 1.0 / std::sqrt(double(dk)));
  job.rows = t;
  job.row_keys = row_keys.data();
  job.row_values = row_values.data();
  job.row_counts = row_counts.data();
  job.row_block = sorted_row_block.data();
  job.row_merged = merged.data();
  job.blocks = blocks;
  job.fit_values = options.fit_values;
  job.bound = static_cast<T>(options.log_weight_bound);
  job.kernels = KernelsFor<T>(caps);
  job.log_weights = log_weights.data();
  const fit::HeadFitStats stats = fit::FitHead(job);

  for (int32_t x = 0; x < t; ++x) {
    const int64_t r = first + row_order[x];
    out->log_weights[r] = static_cast<float>(log_weights[x]);
    float* v = out->values.data() + r * dv;
    for (int32_t d = 0; d < dv; ++d) v[d] = static_cast<float>(row_values[static_cast<size_t>(x) * dv + d]);
  }
  return stats;
}

}  // namespace

absl::Status FitResult(const ClusterEngine& engine, const LayerPlan& plan,
                       const LayerView& layer, CompressResult* out,
                       std::vector<fit::HeadFitStats>* stats) {
  const EngineCaps caps = engine.caps();
  (void)fit::BlasOnCallersThread();  // links blas.cc, whose start-up code sets it so
  out->log_weights.resize(static_cast<size_t>(out->total_entries()));
  for (int64_t r = 0; r < out->total_entries(); ++r) {
    out->log_weights[r] = std::log(static_cast<float>(out->counts[r]));
  }
  std::vector<fit::HeadFitStats> per_head(static_cast<size_t>(layer.num_heads));
  engine.ForEachIndependent(layer.num_heads, [&](int32_t h) {
    const int64_t rows = out->offsets[h + 1] - out->offsets[h];
    if (plan.passthrough[h] || rows >= plan.head_lengths[h]) return;  // the full cache
    per_head[h] = caps.fit_kernels != nullptr ? FitOneHead<float>(caps, plan, layer, h, out)
                                              : FitOneHead<double>(caps, plan, layer, h, out);
  });
  if (stats != nullptr) *stats = std::move(per_head);
  return absl::OkStatus();
}

}  // namespace centroidkv
