// Budgeted and scored heads, each its own job (budgeted_heads.h).
#include "kernels/budgeted_heads.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/common/status_macros.h"
#include "kernels/result_shape.h"

namespace centroidkv {
namespace {

// One head's part of the result: float32 rows, counts, the assignment of its entries
// (head-local rows, -1 for dropped entries and padding).
struct HeadRows {
  std::vector<float> keys, values;
  std::vector<uint32_t> counts;
  std::vector<int32_t> assignment;  // [HeadTokens(h)]
  int32_t exact = 0;                // rows that are input entries as they came
  int32_t passes = 0;
  StopReason stop = StopReason::kTargetReached;
};

// Appends row `token` of head `head` of `layer` to `rows`, as float32.
void AppendInputRow(const LayerView& layer, int32_t head, int32_t token, HeadRows* rows) {
  const size_t keys = rows->keys.size(), values = rows->values.size();
  rows->keys.resize(keys + layer.key_dim);
  rows->values.resize(values + layer.value_dim);
  LoadAsFloats(layer.keys, layer.dtype, layer.KeyOffset(head, token), layer.key_dim,
               rows->keys.data() + keys);
  LoadAsFloats(layer.values, layer.dtype, layer.ValueOffset(head, token), layer.value_dim,
               rows->values.data() + values);
  rows->counts.push_back(layer.CountAt(head, token));
}

// Every real entry of the head kept as it is.
HeadRows KeepWhole(const LayerView& layer, int32_t head, int32_t length, StopReason stop) {
  HeadRows rows;
  rows.assignment.assign(static_cast<size_t>(layer.HeadTokens(head)), -1);
  for (int32_t t = 0; t < length; ++t) {
    AppendInputRow(layer, head, t, &rows);
    rows.assignment[t] = t;
  }
  rows.exact = length;
  rows.stop = stop;
  return rows;
}

// The rows of `result`'s only head as a HeadRows.
HeadRows FromJobResult(CompressResult&& result, int32_t head_tokens) {
  HeadRows rows;
  rows.keys = std::move(result.keys);
  rows.values = std::move(result.values);
  rows.counts = std::move(result.counts);
  rows.assignment = std::move(result.assignment);
  rows.assignment.resize(static_cast<size_t>(head_tokens), -1);  // padding
  rows.passes = result.passes_run;
  rows.stop = result.stop_reasons.front();
  return rows;
}

// A one-head job brought to at most `budget` entries: the SPEC's passes, then
// exact_target's second stage where they stop short.
absl::Status RunToBudget(RegularJobRunner run, const LayerView& job, CompressOptions options,
                         int64_t budget, CompressResult* out) {
  options.target_ratio.reset();
  options.target_tokens = budget;
  options.compute_assignment = true;
  CKV_RETURN_IF_ERROR(run(job, options, out));
  if (out->total_entries() <= budget) return absl::OkStatus();
  LayerPlan plan;
  plan.target_length = budget;
  plan.passthrough = {false};
  plan.compressed_heads = 1;
  plan.head_lengths = {job.num_tokens};
  plan.options = options;
  return ReachExactTarget(run, plan, job, out);
}

// The SPEC's job on the head alone, t = its budget.
absl::Status RunUnscoredHead(RegularJobRunner run, const LayerPlan& plan,
                             const LayerView& layer, int32_t head, HeadRows* rows) {
  const int32_t length = plan.head_lengths[head];
  const GroupInput input(layer, {head}, length);
  CompressResult result;
  CKV_RETURN_IF_ERROR(
      RunToBudget(run, input.view(), SubJobOptions(plan), plan.head_budgets[head], &result));
  *rows = FromJobResult(std::move(result), layer.HeadTokens(head));
  return absl::OkStatus();
}

// The `keep` best-scored positions of [begin, end) of head `head` (score descending, then
// position ascending), marked in `exact`.
void MarkTopScored(const LayerView& layer, int32_t head, int32_t begin, int32_t end,
                   int64_t keep, std::vector<bool>* exact) {
  std::vector<int32_t> order(static_cast<size_t>(end - begin));
  std::iota(order.begin(), order.end(), begin);
  const auto better = [&](int32_t a, int32_t b) {
    const float sa = layer.scores[layer.RowIndex(head, a)];
    const float sb = layer.scores[layer.RowIndex(head, b)];
    return sa != sb ? sa > sb : a < b;
  };
  keep = std::min<int64_t>(keep, static_cast<int64_t>(order.size()));
  std::nth_element(order.begin(), order.begin() + keep, order.end(), better);
  for (int64_t i = 0; i < keep; ++i) (*exact)[order[i]] = true;
}

// Sinks, recent and top-scored entries exact; the tail clustered among itself or dropped.
absl::Status RunScoredHead(RegularJobRunner run, const LayerPlan& plan, const LayerView& layer,
                           int32_t head, HeadRows* rows) {
  const CompressOptions& options = plan.options;
  const int32_t length = plan.head_lengths[head];
  const int64_t budget = plan.head_budgets[head];
  const int32_t sink = std::min(options.sink_tokens, length);
  const int32_t recent = std::min(options.recent_tokens, length - sink);
  const int32_t middle = length - sink - recent;
  const int64_t room = budget - sink - recent;  // >= 0: checked with the plan
  int64_t centroids = static_cast<int64_t>(std::floor(options.centroid_share * room));
  int64_t kept = room - centroids;
  if (centroids > 0 && options.max_cluster_size > 0 &&
      middle - kept > int64_t{options.max_cluster_size} * centroids) {
    centroids = 0;  // clusters this coarse lose more than they keep
    kept = room;
  }
  std::vector<bool> exact(static_cast<size_t>(length), false);
  for (int32_t t = 0; t < sink; ++t) exact[t] = true;
  for (int32_t t = length - recent; t < length; ++t) exact[t] = true;
  MarkTopScored(layer, head, sink, length - recent, kept, &exact);
  std::vector<int32_t> tail;
  for (int32_t t = sink; t < length - recent; ++t) {
    if (!exact[t]) tail.push_back(t);
  }
  if (static_cast<int64_t>(tail.size()) <= centroids) {  // the whole tail fits: exact
    for (int32_t t : tail) exact[t] = true;
    tail.clear();
  }

  // The tail's centroids: a one-head job over the tail's rows in order, nothing protected.
  CompressResult clustered;
  if (centroids > 0 && !tail.empty()) {
    HeadRows gathered;
    for (int32_t t : tail) AppendInputRow(layer, head, t, &gathered);
    const LayerView job{.dtype = DType::kFloat32, .num_heads = 1,
                        .num_tokens = static_cast<int32_t>(tail.size()),
                        .key_dim = layer.key_dim, .value_dim = layer.value_dim,
                        .keys = gathered.keys.data(), .values = gathered.values.data(),
                        .counts = gathered.counts.data()};
    CompressOptions tail_options = SubJobOptions(plan);
    tail_options.sink_tokens = 0;
    tail_options.recent_tokens = 0;
    CKV_RETURN_IF_ERROR(RunToBudget(run, job, tail_options, centroids, &clustered));
  }

  // Each row at the position of its earliest entry: exact entries at their own, a centroid
  // at its first tail entry's.
  const int64_t tail_rows = clustered.total_entries();
  std::vector<int32_t> anchor(static_cast<size_t>(tail_rows), length);
  for (size_t i = 0; i < tail.size() && tail_rows > 0; ++i) {
    int32_t& first = anchor[clustered.assignment[i]];
    first = std::min(first, tail[i]);
  }
  // Row order: (position, which) with which = -1 for an exact entry, else the centroid.
  std::vector<std::pair<int32_t, int32_t>> order;
  for (int32_t t = 0; t < length; ++t) {
    if (exact[t]) order.emplace_back(t, -1);
  }
  for (int64_t r = 0; r < tail_rows; ++r) order.emplace_back(anchor[r], static_cast<int32_t>(r));
  std::sort(order.begin(), order.end());

  *rows = HeadRows{};
  rows->assignment.assign(static_cast<size_t>(layer.HeadTokens(head)), -1);
  std::vector<int32_t> centroid_row(static_cast<size_t>(tail_rows), -1);
  for (size_t row = 0; row < order.size(); ++row) {
    const auto [position, centroid] = order[row];
    if (centroid < 0) {
      AppendInputRow(layer, head, position, rows);
      rows->assignment[position] = static_cast<int32_t>(row);
      ++rows->exact;
      continue;
    }
    centroid_row[centroid] = static_cast<int32_t>(row);
    rows->keys.insert(rows->keys.end(), clustered.keys.begin() + centroid * layer.key_dim,
                      clustered.keys.begin() + (centroid + 1) * layer.key_dim);
    rows->values.insert(rows->values.end(),
                        clustered.values.begin() + centroid * layer.value_dim,
                        clustered.values.begin() + (centroid + 1) * layer.value_dim);
    rows->counts.push_back(clustered.counts[centroid]);
  }
  for (size_t i = 0; i < tail.size() && tail_rows > 0; ++i) {
    rows->assignment[tail[i]] = centroid_row[clustered.assignment[i]];
  }
  rows->passes = clustered.passes_run;
  rows->stop = StopReason::kTargetReached;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBudgeted(const ClusterEngine& engine, RegularJobRunner run,
                         const LayerPlan& plan, const LayerView& layer, CompressResult* out) {
  const int32_t heads = layer.num_heads;
  std::vector<HeadRows> parts(static_cast<size_t>(heads));
  std::vector<absl::Status> statuses(static_cast<size_t>(heads));
  engine.ForEachIndependent(heads, [&](int32_t h) {
    const int32_t length = plan.head_lengths[h];
    if (plan.passthrough[h]) {
      parts[h] = KeepWhole(layer, h, length, StopReason::kPassthrough);
    } else if (plan.head_budgets[h] >= length) {
      parts[h] = KeepWhole(layer, h, length, StopReason::kTargetReached);
    } else if (plan.scored) {
      statuses[h] = RunScoredHead(run, plan, layer, h, &parts[h]);
    } else {
      statuses[h] = RunUnscoredHead(run, plan, layer, h, &parts[h]);
    }
  });
  for (const absl::Status& status : statuses) CKV_RETURN_IF_ERROR(status);

  ClearResult(out);
  out->num_heads = heads;
  out->num_tokens = layer.num_tokens;
  out->key_dim = layer.key_dim;
  out->value_dim = layer.value_dim;
  out->offsets.assign(1, 0);
  out->stop_reasons.resize(static_cast<size_t>(heads));
  out->head_budgets.assign(plan.head_budgets.begin(), plan.head_budgets.end());
  if (plan.scored) out->head_exact_entries.resize(static_cast<size_t>(heads));
  out->assignment.assign(static_cast<size_t>(layer.TotalRows()), -1);
  for (int32_t h = 0; h < heads; ++h) {
    HeadRows& part = parts[h];
    out->keys.insert(out->keys.end(), part.keys.begin(), part.keys.end());
    out->values.insert(out->values.end(), part.values.begin(), part.values.end());
    out->counts.insert(out->counts.end(), part.counts.begin(), part.counts.end());
    out->offsets.push_back(out->offsets.back() + static_cast<int64_t>(part.counts.size()));
    std::copy(part.assignment.begin(), part.assignment.end(),
              out->assignment.begin() + AssignmentBase(layer, h));
    out->stop_reasons[h] = part.stop;
    if (plan.scored) out->head_exact_entries[h] = part.exact;
    out->passes_run = std::max(out->passes_run, part.passes);
  }
  return absl::OkStatus();
}

}  // namespace centroidkv
