// Ragged / padded layers as regular jobs, and exact_target's second stage.
#include "kernels/ragged_layer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/common/status_macros.h"
#include "kernels/result_shape.h"

namespace centroidkv {
namespace {

// Heads run as one regular job: `heads` share one real length.
struct HeadGroup {
  std::vector<int32_t> heads;
  int32_t length = 0;
  bool passthrough = false;
};

absl::StatusOr<std::vector<HeadGroup>> GroupHeads(const LayerPlan& plan, int32_t num_heads) {
  std::vector<HeadGroup> groups;
  HeadGroup compressed;
  for (int32_t h = 0; h < num_heads; ++h) {
    const int32_t length = plan.head_lengths[h];
    if (plan.passthrough[h] || !plan.options.uniform_heads) {
      groups.push_back(HeadGroup{{h}, length, plan.passthrough[h]});
      continue;
    }
    if (!compressed.heads.empty() && compressed.length != length) {
      return InvalidFieldError(
          {"uniform_heads", h},
          absl::StrCat("uniform_heads needs the compressed heads to start with one length, "
                       "but head ", compressed.heads.front(), " has ", compressed.length,
                       " entries and head ", h, " has ", length,
                       " (count-0 padding not counted); set uniform_heads to false"));
    }
    compressed.heads.push_back(h);
    compressed.length = length;
  }
  if (!compressed.heads.empty()) groups.push_back(std::move(compressed));
  return groups;
}

void AppendRows(const CompressResult& from, int32_t head, CompressResult* to) {
  const int64_t begin = from.offsets[head], end = from.offsets[head + 1];
  to->keys.insert(to->keys.end(), from.keys.begin() + begin * from.key_dim,
                  from.keys.begin() + end * from.key_dim);
  to->values.insert(to->values.end(), from.values.begin() + begin * from.value_dim,
                    from.values.begin() + end * from.value_dim);
  to->counts.insert(to->counts.end(), from.counts.begin() + begin, from.counts.begin() + end);
  to->offsets.push_back(to->offsets.back() + (end - begin));
}

}  // namespace

// The options of a regular sub-job: the same SPEC parameters with t fixed, float32 rows,
// nothing of what the stages above the backends do.
CompressOptions SubJobOptions(const LayerPlan& plan) {
  CompressOptions options = plan.options;
  options.target_ratio.reset();
  options.target_tokens = plan.target_length;
  options.passthrough_heads.clear();
  options.result_dtype = DType::kFloat32;
  options.result_key_scales.clear();
  options.result_value_scales.clear();
  options.exact_target = false;
  options.pad_heads = false;
  options.pad_to = 0;
  options.output_layout = TensorLayout::kHeadMajor;
  options.head_budgets.clear();
  return options;
}

int64_t AssignmentBase(const LayerView& layer, int32_t h) {
  return layer.head_offsets != nullptr ? layer.head_offsets[h]
                                       : static_cast<int64_t>(h) * layer.num_tokens;
}

GroupInput::GroupInput(const LayerView& layer, const std::vector<int32_t>& heads,
                       int32_t length) {
  view_ = layer;
  view_.layout = TensorLayout::kHeadMajor;
  view_.head_offsets = nullptr;
  view_.scores = nullptr;
  view_.queries = nullptr;
  view_.num_query_heads = 0;
  view_.num_queries = 0;
  view_.num_heads = static_cast<int32_t>(heads.size());
  view_.num_tokens = length;
  const int64_t element = DTypeSize(layer.dtype);
  if (heads.size() == 1 && layer.layout == TensorLayout::kHeadMajor) {
    const int32_t h = heads.front();
    view_.keys = static_cast<const uint8_t*>(layer.keys) + layer.KeyOffset(h, 0) * element;
    view_.values = static_cast<const uint8_t*>(layer.values) + layer.ValueOffset(h, 0) * element;
    view_.counts = layer.counts == nullptr ? nullptr : layer.counts + layer.RowIndex(h, 0);
    return;
  }
  const int64_t rows = int64_t{view_.num_heads} * length;
  keys_.resize(static_cast<size_t>(rows * layer.key_dim * element));
  values_.resize(static_cast<size_t>(rows * layer.value_dim * element));
  if (layer.counts != nullptr) counts_.resize(static_cast<size_t>(rows));
  int64_t row = 0;
  for (int32_t h : heads) {
    for (int32_t t = 0; t < length; ++t, ++row) {
      std::memcpy(keys_.data() + row * layer.key_dim * element,
                  static_cast<const uint8_t*>(layer.keys) + layer.KeyOffset(h, t) * element,
                  static_cast<size_t>(layer.key_dim * element));
      std::memcpy(values_.data() + row * layer.value_dim * element,
                  static_cast<const uint8_t*>(layer.values) + layer.ValueOffset(h, t) * element,
                  static_cast<size_t>(layer.value_dim * element));
      if (layer.counts != nullptr) counts_[row] = layer.counts[layer.RowIndex(h, t)];
    }
  }
  view_.keys = keys_.data();
  view_.values = values_.data();
  view_.counts = layer.counts == nullptr ? nullptr : counts_.data();
}

absl::Status RunRagged(RegularJobRunner run, const LayerPlan& plan, const LayerView& layer,
                       CompressResult* out) {
  CKV_ASSIGN_OR_RETURN(std::vector<HeadGroup> groups, GroupHeads(plan, layer.num_heads));
  const CompressOptions base = SubJobOptions(plan);
  // Results by head: (group, head within the group).
  std::vector<CompressResult> results(groups.size());
  std::vector<std::pair<size_t, int32_t>> where(static_cast<size_t>(layer.num_heads));
  int32_t passes = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupInput input(layer, groups[g].heads, groups[g].length);
    CompressOptions options = base;
    if (groups[g].passthrough) options.passthrough_heads = {0};
    CKV_RETURN_IF_ERROR(run(input.view(), options, &results[g]));
    passes = std::max(passes, results[g].passes_run);
    for (size_t k = 0; k < groups[g].heads.size(); ++k) {
      where[groups[g].heads[k]] = {g, static_cast<int32_t>(k)};
    }
  }

  ClearResult(out);
  out->num_heads = layer.num_heads;
  out->num_tokens = layer.num_tokens;
  out->key_dim = layer.key_dim;
  out->value_dim = layer.value_dim;
  out->offsets.assign(1, 0);
  out->passes_run = passes;
  out->stop_reasons.resize(static_cast<size_t>(layer.num_heads));
  if (plan.options.compute_assignment) {
    out->assignment.assign(static_cast<size_t>(layer.TotalRows()), -1);  // padding: -1
  }
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const auto [g, k] = where[h];
    const CompressResult& result = results[g];
    AppendRows(result, k, out);
    out->stop_reasons[h] = result.stop_reasons[k];
    if (plan.options.compute_assignment) {
      const int32_t length = groups[g].length;
      std::copy_n(result.assignment.begin() + static_cast<int64_t>(k) * length, length,
                  out->assignment.begin() + AssignmentBase(layer, h));
    }
  }
  return absl::OkStatus();
}

bool PassesReachTarget(const LayerPlan& plan) {
  const CompressOptions& options = plan.options;
  if (options.min_similarity.has_value()) return false;
  const int64_t t = plan.target_length;
  const int64_t chunk = options.chunk_size;
  std::vector<int64_t> lengths;
  for (size_t h = 0; h < plan.head_lengths.size(); ++h) {
    if (!plan.passthrough[h]) lengths.push_back(plan.head_lengths[h]);
  }
  std::vector<int64_t> merges(lengths.size());
  for (int32_t pass = 0; pass < options.max_passes; ++pass) {
    bool any_long = false;
    int64_t fewest = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t m = lengths[i];
      int64_t edges = 0;  // every source of a chunk of two or more entries has one
      const int64_t compressible = m - options.sink_tokens - options.recent_tokens;
      if (m > t && compressible >= 2) {
        const int64_t rest = compressible % chunk;
        edges = compressible / chunk * ((chunk + 1) / 2) + (rest >= 2 ? (rest + 1) / 2 : 0);
      }
      any_long = any_long || m > t;
      merges[i] = std::min(std::max<int64_t>(m - t, 0), edges);
      fewest = std::min(fewest, merges[i]);
    }
    if (!any_long) return true;
    bool merged = false;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t r = options.uniform_heads ? fewest : merges[i];
      lengths[i] -= r;
      merged = merged || r > 0;
    }
    if (!merged) return false;
  }
  return std::all_of(lengths.begin(), lengths.end(), [&](int64_t m) { return m <= t; });
}

bool HeadsWithinTarget(const LayerPlan& plan, const CompressResult& result) {
  for (int32_t h = 0; h < result.num_heads; ++h) {
    if (!plan.passthrough[h] && result.offsets[h + 1] - result.offsets[h] > plan.target_length) {
      return false;
    }
  }
  return true;
}

absl::Status ReachExactTarget(RegularJobRunner run, const LayerPlan& plan,
                              const LayerView& layer, CompressResult* out) {
  const int64_t t = plan.target_length;
  CompressOptions options = SubJobOptions(plan);
  options.min_similarity.reset();
  options.tighten_per_pass = 0.0;
  options.uniform_heads = false;
  options.max_passes = kExactTargetPasses;
  LayerPlan head_plan = plan;  // for the stop reasons of the second stage
  head_plan.options = options;

  std::vector<CompressResult> stage(static_cast<size_t>(out->num_heads));
  std::vector<bool> replaced(static_cast<size_t>(out->num_heads), false);
  int32_t extra_passes = 0;
  for (int32_t h = 0; h < out->num_heads; ++h) {
    const int64_t entries = out->offsets[h + 1] - out->offsets[h];
    if (plan.passthrough[h] || entries <= t) continue;
    LayerView head{.dtype = DType::kFloat32, .num_heads = 1,
        .num_tokens = static_cast<int32_t>(entries), .key_dim = out->key_dim,
        .value_dim = out->value_dim, .keys = out->keys.data() + out->offsets[h] * out->key_dim,
        .values = out->values.data() + out->offsets[h] * out->value_dim,
        .counts = out->counts.data() + out->offsets[h]};
    CKV_RETURN_IF_ERROR(run(head, options, &stage[h]));
    replaced[h] = true;
    extra_passes = std::max(extra_passes, stage[h].passes_run);
    const int64_t reached = stage[h].total_entries();
    out->stop_reasons[h] = StopReasonFor(head_plan, false, reached, stage[h].passes_run);
    if (!out->assignment.empty()) {
      const int64_t base = AssignmentBase(layer, h);
      for (int32_t i = 0; i < layer.HeadTokens(h); ++i) {
        int32_t& owner = out->assignment[base + i];
        if (owner >= 0) owner = stage[h].assignment[owner];
      }
    }
  }
  if (extra_passes == 0) return absl::OkStatus();
  CompressResult merged;
  merged.offsets.assign(1, 0);
  merged.key_dim = out->key_dim;
  merged.value_dim = out->value_dim;
  for (int32_t h = 0; h < out->num_heads; ++h) {
    AppendRows(replaced[h] ? stage[h] : *out, replaced[h] ? 0 : h, &merged);
  }
  out->offsets.swap(merged.offsets);
  out->keys.swap(merged.keys);
  out->values.swap(merged.values);
  out->counts.swap(merged.counts);
  out->passes_run += extra_passes;
  return absl::OkStatus();
}

}  // namespace centroidkv
