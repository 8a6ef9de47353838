// The fit stage: one KV head's inputs gathered for FitHead (head_fit.h), a head per task.
#include "kernels/fit/fit_stage.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "kernels/ragged_layer.h"

namespace centroidkv {

namespace {

template <typename T>
void Convert(const float* from, int64_t count, T* to) {
  std::copy_n(from, count, to);
}

// Fits head `h` of `out` in precision T.
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

  // The full head's entries.
  std::vector<float> row(static_cast<size_t>(std::max(dk, dv)));
  std::vector<T> keys(static_cast<size_t>(n) * dk), values(static_cast<size_t>(n) * dv);
  std::vector<T> log_counts(static_cast<size_t>(n));
  for (int32_t j = 0; j < n; ++j) {
    LoadAsFloats(layer.keys, layer.dtype, layer.KeyOffset(h, j), dk, row.data());
    Convert(row.data(), dk, keys.data() + static_cast<size_t>(j) * dk);
    LoadAsFloats(layer.values, layer.dtype, layer.ValueOffset(h, j), dv, row.data());
    Convert(row.data(), dv, values.data() + static_cast<size_t>(j) * dv);
    log_counts[j] = std::log(static_cast<T>(layer.CountAt(h, j)));
  }
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
  std::vector<uint8_t> merged(static_cast<size_t>(t));
  for (int32_t r = 0; r < t; ++r) {
    row_block[r] = std::min(anchor[r], n - 1) / block_tokens;
    merged[r] = members[r] >= 2 ? 1 : 0;
  }
  for (int32_t j = 0; j < n; ++j) {
    entry_block[j] = assignment[j] >= 0 ? row_block[assignment[j]] : j / block_tokens;
  }
  const int32_t group = layer.QueryGroup();
  const int32_t m = group * layer.num_queries;
  std::vector<T> queries(static_cast<size_t>(m) * dk);
  Convert(layer.queries + static_cast<size_t>(h) * m * dk, int64_t{m} * dk, queries.data());
  std::vector<T> row_keys(static_cast<size_t>(t) * dk), row_values(static_cast<size_t>(t) * dv);
  std::vector<T> row_counts(static_cast<size_t>(t)), log_weights(static_cast<size_t>(t));
  Convert(out->keys.data() + first * dk, int64_t{t} * dk, row_keys.data());
  Convert(out->values.data() + first * dv, int64_t{t} * dv, row_values.data());
  for (int32_t r = 0; r < t; ++r) row_counts[r] = static_cast<T>(out->counts[first + r]);

  fit::HeadFitJob<T> job;
  job.entries = n;
  job.key_dim = dk;
  job.value_dim = dv;
  job.keys = keys.data();
  job.values = values.data();
  job.log_counts = log_counts.data();
  job.entry_block = entry_block.data();
  job.queries = m;
  job.query_rows = queries.data();
  job.scale = static_cast<T>(options.query_scale > 0.0 ? options.query_scale
                                                       : 1.0 / std::sqrt(double(dk)));
  job.rows = t;
  job.row_keys = row_keys.data();
  job.row_values = row_values.data();
  job.row_counts = row_counts.data();
  job.row_block = row_block.data();
  job.row_merged = merged.data();
  job.blocks = blocks;
  job.fit_values = options.fit_values;
  job.bound = static_cast<T>(options.log_weight_bound);
  if constexpr (std::is_same_v<T, float>) {
    job.exp_in_place = caps.fit_kernels != nullptr ? caps.fit_kernels->exp_floats : nullptr;
  }
  job.log_weights = log_weights.data();
  const fit::HeadFitStats stats = fit::FitHead(job);

  for (int32_t r = 0; r < t; ++r) out->log_weights[first + r] = static_cast<float>(log_weights[r]);
  float* out_values = out->values.data() + first * dv;
  for (int64_t k = 0; k < int64_t{t} * dv; ++k) out_values[k] = static_cast<float>(row_values[k]);
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
