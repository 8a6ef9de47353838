// Stop reasons, the per-head account, and padding / token-major layout of a result.
#include "kernels/result_shape.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv {
namespace {

// `rows` ([total, dim], heads concatenated at `offsets`) rearranged so that head h's row r
// is at h * length + r (head-major) or r * H + h (token-major); missing rows are zero.
template <typename T>
void PlaceRows(const std::vector<int64_t>& offsets, int64_t dim, int64_t length,
               bool token_major, std::vector<T>* rows) {
  const int64_t heads = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<T> placed(static_cast<size_t>(heads * length * dim), T{0});
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < offsets[h + 1] - offsets[h]; ++r) {
      const int64_t to = token_major ? r * heads + h : h * length + r;
      std::copy_n(rows->begin() + (offsets[h] + r) * dim, dim, placed.begin() + to * dim);
    }
  }
  rows->swap(placed);
}

}  // namespace

void ClearResult(CompressResult* result) {
  result->num_heads = result->num_tokens = result->key_dim = result->value_dim = 0;
  result->dtype = DType::kFloat32;
  result->offsets.clear();
  result->keys.clear();
  result->values.clear();
  result->half_keys.clear();
  result->half_values.clear();
  result->fp8_keys.clear();
  result->fp8_values.clear();
  result->key_scales.clear();
  result->value_scales.clear();
  result->counts.clear();
  result->assignment.clear();
  result->rows_in_target = false;
  result->passes_run = 0;
  result->layout = TensorLayout::kHeadMajor;
  result->padded_length = 0;
  result->target_length = 0;
  result->target_reached = false;
  result->head_tokens.clear();
  result->head_entries.clear();
  result->head_input_tokens.clear();
  result->stop_reasons.clear();
  result->head_budgets.clear();
  result->head_exact_entries.clear();
  result->log_weights.clear();
}

StopReason StopReasonFor(const LayerPlan& plan, bool passthrough, int64_t entries,
                         int32_t passes_run) {
  const CompressOptions& options = plan.options;
  if (passthrough) return StopReason::kPassthrough;
  if (entries <= plan.target_length) return StopReason::kTargetReached;
  // The SPEC's compressible range [S, m - W) holds no edge.
  if (entries - options.sink_tokens - options.recent_tokens < 2) return StopReason::kProtected;
  // The pass loop ends early only when a pass merges nothing.
  if (passes_run >= options.max_passes) return StopReason::kMaxPasses;
  // Without a floor every source in range is a candidate: only another head's zero can
  // have held this one back (uniform_heads).
  return options.min_similarity.has_value() ? StopReason::kSimilarityFloor
                                            : StopReason::kUniformHeads;
}

void FillStopReasons(const LayerPlan& plan, int32_t passes_run, int32_t first_head,
                     int32_t count, CompressResult* result) {
  result->stop_reasons.resize(static_cast<size_t>(result->num_heads), StopReason::kTargetReached);
  for (int32_t h = first_head; h < first_head + count; ++h) {
    result->stop_reasons[h] = StopReasonFor(plan, plan.passthrough[h],
                                            result->offsets[h + 1] - result->offsets[h],
                                            passes_run);
  }
}

void FillAccount(const LayerPlan& plan, const LayerView& layer, CompressResult* result) {
  const int32_t heads = layer.num_heads;
  result->layout = TensorLayout::kHeadMajor;
  result->padded_length = 0;
  result->target_length = plan.target_length;
  result->head_tokens.resize(static_cast<size_t>(heads));
  result->head_entries.resize(static_cast<size_t>(heads));
  result->head_input_tokens.resize(static_cast<size_t>(heads));
  result->target_reached = true;
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = layer.HeadTokens(h);
    result->head_tokens[h] = n;
    result->head_entries[h] = static_cast<int32_t>(result->offsets[h + 1] - result->offsets[h]);
    uint64_t sum = static_cast<uint64_t>(n);
    if (layer.counts != nullptr) {
      sum = 0;
      for (int32_t t = 0; t < n; ++t) sum += layer.counts[layer.RowIndex(h, t)];
    }
    result->head_input_tokens[h] = sum;
    const int64_t target = plan.budgeted() ? plan.head_budgets[h] : plan.target_length;
    if (!plan.passthrough[h] && result->head_entries[h] > target) {
      result->target_reached = false;
    }
  }
}

bool ReshapesRows(const CompressOptions& options) {
  return options.pad_to > 0 || options.pad_heads ||
         options.output_layout == TensorLayout::kTokenMajor;
}

absl::Status ShapeRows(const CompressOptions& options, CompressResult* result) {
  if (!ReshapesRows(options)) return absl::OkStatus();
  const bool token_major = options.output_layout == TensorLayout::kTokenMajor;
  const int32_t heads = result->num_heads;
  int64_t longest = 0;
  for (int32_t h = 0; h < heads; ++h) {
    longest = std::max(longest, result->offsets[h + 1] - result->offsets[h]);
  }
  int64_t length = 0;
  if (options.pad_to > 0) {
    length = options.pad_to;
    for (int32_t h = 0; h < heads; ++h) {
      const int64_t entries = result->offsets[h + 1] - result->offsets[h];
      if (entries > length) {
        return FieldError(absl::StatusCode::kFailedPrecondition, {"pad_to", h},
                          absl::StrCat("pad_to is ", length, " but head ", h, " has ", entries,
                                       " entries (raise pad_to, or set exact_target)"));
      }
    }
  } else if (options.pad_heads || token_major) {
    length = longest;
  }
  if (length == 0) return absl::OkStatus();
  const std::vector<int64_t> offsets = result->offsets;
  if (result->dtype == DType::kFloat32) {
    PlaceRows(offsets, result->key_dim, length, token_major, &result->keys);
    PlaceRows(offsets, result->value_dim, length, token_major, &result->values);
  } else {
    PlaceRows(offsets, result->key_dim, length, token_major, &result->half_keys);
    PlaceRows(offsets, result->value_dim, length, token_major, &result->half_values);
  }
  PlaceRows(offsets, 1, length, token_major, &result->counts);
  if (!result->log_weights.empty()) {
    // Padding rows weigh nothing: ln(0), as their count 0 says.
    PlaceRows(offsets, 1, length, token_major, &result->log_weights);
    for (size_t row = 0; row < result->counts.size(); ++row) {
      if (result->counts[row] == 0) {
        result->log_weights[row] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  for (int32_t h = 0; h <= heads; ++h) result->offsets[h] = h * length;
  result->padded_length = static_cast<int32_t>(length);
  result->layout = options.output_layout;
  return absl::OkStatus();
}

}  // namespace centroidkv
