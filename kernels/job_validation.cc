// Validation and planning of a layer job, shared by every backend: the shape and
// parameters (what a server can check as soon as a job is announced), the data (NaN / Inf,
// counts), and the resolved LayerPlan. Errors name the field as the wire API spells it.
#include "kernels/job_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/common/status_macros.h"

namespace centroidkv {
namespace {

// The reference queries' shape, where a job has them: [Hq, m, key_dim], Hq a multiple of
// the KV heads (GQA groups), m within the token limit.
absl::Status CheckQueryDims(const LayerView& layer, const EngineLimits& limits) {
  if (layer.num_query_heads == 0 && layer.num_queries == 0) return absl::OkStatus();
  if (layer.num_query_heads < 1 || layer.num_query_heads > limits.max_heads) {
    return InvalidFieldError({"num_query_heads"},
                             absl::StrCat("num_query_heads is ", layer.num_query_heads,
                                          ", outside [1, ", limits.max_heads, "]"));
  }
  if (layer.num_query_heads % layer.num_heads != 0) {
    return InvalidFieldError(
        {"num_query_heads"},
        absl::StrCat("num_query_heads is ", layer.num_query_heads,
                     ", not a multiple of num_heads (", layer.num_heads,
                     "): each KV head needs the same group of query heads"));
  }
  if (layer.num_queries < 1 || layer.num_queries > limits.max_tokens) {
    return InvalidFieldError({"num_queries"},
                             absl::StrCat("num_queries is ", layer.num_queries, ", outside [1, ",
                                          limits.max_tokens, "]"));
  }
  const int64_t elements = int64_t{layer.num_query_heads} * layer.num_queries * layer.key_dim;
  if (elements > limits.max_layer_elements) {
    return FieldError(absl::StatusCode::kResourceExhausted, {"num_queries"},
                      absl::StrCat("num_query_heads * num_queries * key_dim = ", elements,
                                   " elements exceeds the per-job limit of ",
                                   limits.max_layer_elements));
  }
  return absl::OkStatus();
}

absl::Status CheckDims(const LayerView& layer, const EngineLimits& limits) {
  struct Dim {
    const char* field;
    int32_t value;
    int32_t max;
  };
  const Dim dims[] = {{"num_heads", layer.num_heads, limits.max_heads},
                      {"num_tokens", layer.num_tokens, limits.max_tokens},
                      {"key_dim", layer.key_dim, limits.max_dim},
                      {"value_dim", layer.value_dim, limits.max_dim}};
  for (const Dim& dim : dims) {
    if (dim.value <= 0) {
      return InvalidFieldError({dim.field},
                               absl::StrCat(dim.field, " must be positive (got ", dim.value, ")"));
    }
    if (dim.value > dim.max) {
      return InvalidFieldError(
          {dim.field}, absl::StrCat(dim.field, " is ", dim.value, ", above the limit of ", dim.max));
    }
  }
  if (layer.head_offsets != nullptr) {
    if (layer.layout != TensorLayout::kHeadMajor) {
      return InvalidFieldError({"layout"}, "layout must be head-major when heads are ragged");
    }
    int32_t longest = 0;
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      const int64_t length = layer.head_offsets[h + 1] - layer.head_offsets[h];
      if ((h == 0 && layer.head_offsets[0] != 0) || length < 1 || length > limits.max_tokens) {
        return InvalidFieldError(
            {"head_tokens", h},
            absl::StrCat("head_tokens of head ", h, " is ", length, ", outside [1, ",
                         limits.max_tokens, "]"));
      }
      longest = std::max(longest, static_cast<int32_t>(length));
    }
    if (longest != layer.num_tokens) {
      return InvalidFieldError({"num_tokens"},
                               absl::StrCat("num_tokens is ", layer.num_tokens,
                                            ", not the longest head_tokens (", longest, ")"));
    }
  }
  const int64_t elements = layer.TotalRows() * (int64_t{layer.key_dim} + layer.value_dim);
  if (elements > limits.max_layer_elements) {
    return FieldError(absl::StatusCode::kResourceExhausted, {"num_tokens"},
                      absl::StrCat("num_heads * num_tokens * (key_dim + value_dim) = ", elements,
                                   " elements exceeds the per-job limit of ",
                                   limits.max_layer_elements));
  }
  return CheckQueryDims(layer, limits);
}

// The fp8 scales `scales` (field `field`) of a tensor in `dtype` (field `dtype_field`):
// for an fp8 dtype one entry or one per head, each finite and > 0 (none: dynamic, where
// `empty_allowed`); for any other dtype none.
absl::Status CheckScales(const char* field, std::span<const float> scales, DType dtype,
                         const char* dtype_field, const LayerView& layer,
                         bool empty_allowed = false) {
  if (!IsFp8(dtype)) {
    if (scales.empty()) return absl::OkStatus();
    return InvalidFieldError(
        {field}, absl::StrCat(field, " are for fp8 tensors only (", dtype_field, " is ",
                              std::string(DTypeName(dtype)), ")"));
  }
  if (scales.empty() && empty_allowed) return absl::OkStatus();
  if (scales.size() != 1 && scales.size() != static_cast<size_t>(layer.num_heads)) {
    return InvalidFieldError(
        {field}, absl::StrCat(field, " has ", scales.size(), " entries; an ", std::string(DTypeName(dtype)),
                              " tensor needs 1 (per layer) or num_heads (", layer.num_heads,
                              ", per head)", empty_allowed ? ", or none (dynamic)" : ""));
  }
  for (size_t h = 0; h < scales.size(); ++h) {
    if (!(scales[h] > 0.0f) || !std::isfinite(scales[h])) {
      return InvalidFieldError({field, static_cast<int32_t>(h)},
                               absl::StrCat(field, "[", h, "] is ", scales[h],
                                            "; a scale must be finite and > 0"));
    }
  }
  return absl::OkStatus();
}

// head_budgets, centroid_share, max_cluster_size and the fit's options, as far as the
// shape tells (a passthrough head's budget against its length is PlanJob's).
absl::Status CheckBudgetOptions(const LayerView& layer, const CompressOptions& options) {
  const std::vector<int32_t>& budgets = options.head_budgets;
  if (!budgets.empty() && budgets.size() != static_cast<size_t>(layer.num_heads)) {
    return InvalidFieldError({"head_budgets"},
                             absl::StrCat("head_budgets has ", budgets.size(),
                                          " entries; it needs one per head (", layer.num_heads,
                                          ") or none"));
  }
  for (size_t h = 0; h < budgets.size(); ++h) {
    if (budgets[h] < 1) {
      return InvalidFieldError({"head_budgets", static_cast<int32_t>(h)},
                               absl::StrCat("head_budgets[", h, "] is ", budgets[h],
                                            "; a head keeps at least 1 entry"));
    }
  }
  if (!(options.centroid_share >= 0.0 && options.centroid_share <= 1.0)) {
    return InvalidFieldError({"centroid_share"},
                             absl::StrCat("centroid_share must be in [0, 1] (got ",
                                          options.centroid_share, ")"));
  }
  if (options.max_cluster_size < 0) {
    return InvalidFieldError({"max_cluster_size"},
                             absl::StrCat("max_cluster_size must not be negative (got ",
                                          options.max_cluster_size, ")"));
  }
  const FitOptions& fit = options.fit;
  if (!(fit.log_weight_bound > 0.0) || !std::isfinite(fit.log_weight_bound)) {
    return InvalidFieldError({"fit.log_weight_bound"},
                             absl::StrCat("fit.log_weight_bound must be finite and > 0 (got ",
                                          fit.log_weight_bound, ")"));
  }
  if (fit.block_tokens < 1) {
    return InvalidFieldError({"fit.block_tokens"},
                             absl::StrCat("fit.block_tokens must be at least 1 (got ",
                                          fit.block_tokens, ")"));
  }
  if (!(fit.query_scale >= 0.0) || !std::isfinite(fit.query_scale)) {
    return InvalidFieldError({"fit.query_scale"},
                             absl::StrCat("fit.query_scale must be finite and >= 0 (got ",
                                          fit.query_scale, "; 0: 1 / sqrt(key_dim))"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const LayerView& layer, const CompressOptions& options,
                          const EngineLimits& limits) {
  if (options.target_ratio.has_value() && options.target_tokens.has_value()) {
    return InvalidFieldError({"target_tokens"}, "set only one of target_ratio and target_tokens");
  }
  if (options.target_ratio.has_value() &&
      !(*options.target_ratio > 0.0 && *options.target_ratio <= 1.0)) {
    return InvalidFieldError(
        {"target_ratio"},
        absl::StrCat("target_ratio must be in (0, 1] (got ", *options.target_ratio, ")"));
  }
  if (options.target_tokens.has_value() && *options.target_tokens < 1) {
    return InvalidFieldError(
        {"target_tokens"},
        absl::StrCat("target_tokens must be at least 1 (got ", *options.target_tokens, ")"));
  }
  if (options.chunk_size < 2) {
    return InvalidFieldError(
        {"chunk_size"}, absl::StrCat("chunk_size must be at least 2 (got ", options.chunk_size, ")"));
  }
  if (options.chunk_size > limits.max_chunk_size) {
    return FieldError(absl::StatusCode::kResourceExhausted, {"chunk_size"},
                      absl::StrCat("chunk_size is ", options.chunk_size, ", above the limit of ",
                                   limits.max_chunk_size, " (GetInfo limits.max_chunk_size)"));
  }
  if (options.sink_tokens < 0 || options.recent_tokens < 0) {
    return options.sink_tokens < 0
               ? InvalidFieldError({"sink_tokens"}, "sink_tokens must not be negative")
               : InvalidFieldError({"recent_tokens"}, "recent_tokens must not be negative");
  }
  if (options.min_similarity.has_value() &&
      !(*options.min_similarity >= -1.0 && *options.min_similarity <= 1.0)) {
    return InvalidFieldError(
        {"min_similarity"},
        absl::StrCat("min_similarity must be in [-1, 1] (got ", *options.min_similarity, ")"));
  }
  if (!(options.tighten_per_pass >= 0.0) || !std::isfinite(options.tighten_per_pass)) {
    return InvalidFieldError(
        {"tighten_per_pass"}, absl::StrCat("tighten_per_pass must be a finite value >= 0 (got ",
                                           options.tighten_per_pass, ")"));
  }
  if (options.max_passes < 1) {
    return InvalidFieldError(
        {"max_passes"}, absl::StrCat("max_passes must be at least 1 (got ", options.max_passes, ")"));
  }
  for (int32_t head : options.passthrough_heads) {
    if (head < 0 || head >= layer.num_heads) {
      return InvalidFieldError({"passthrough_heads", head},
                               absl::StrCat("passthrough_heads names head ", head,
                                            ", outside [0, ", layer.num_heads, ")"));
    }
  }
  if (options.pad_to < 0) {
    return InvalidFieldError({"pad_to"}, "pad_to must not be negative");
  }
  CKV_RETURN_IF_ERROR(CheckBudgetOptions(layer, options));
  CKV_RETURN_IF_ERROR(CheckScales("key_scales", layer.key_scales, layer.dtype, "dtype", layer));
  CKV_RETURN_IF_ERROR(
      CheckScales("value_scales", layer.value_scales, layer.dtype, "dtype", layer));
  CKV_RETURN_IF_ERROR(CheckScales("output_key_scales", options.result_key_scales,
                                  options.result_dtype, "output_dtype", layer,
                                  /*empty_allowed=*/true));
  return CheckScales("output_value_scales", options.result_value_scales, options.result_dtype,
                     "output_dtype", layer, /*empty_allowed=*/true);
}

// Whether none of `count` elements of a buffer of `dtype` is Inf or NaN: an all-ones
// exponent field. Integer bit tests only, so the compiler vectorises the loop.
// In blocks of a fixed length, because -O2 vectorises only loops without a remainder.
template <typename Bits>
bool NoneHasMaxExponent(const void* data, int64_t count, Bits exponent_mask) {
  constexpr int64_t kBlock = 256;
  const Bits* bits = static_cast<const Bits*>(data);
  Bits found = 0;
  int64_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) {
      found |= static_cast<Bits>((bits[i + k] & exponent_mask) == exponent_mask);
    }
  }
  for (; i < count; ++i) found |= static_cast<Bits>((bits[i] & exponent_mask) == exponent_mask);
  return found == 0;
}

bool AllFinite(const void* data, DType dtype, int64_t count) {
  switch (dtype) {
    case DType::kFloat32:
      return NoneHasMaxExponent<uint32_t>(data, count, 0x7f800000u);
    case DType::kFloat16:
      return NoneHasMaxExponent<uint16_t>(data, count, 0x7c00u);
    case DType::kBFloat16:
      return NoneHasMaxExponent<uint16_t>(data, count, 0x7f80u);
    case DType::kFp8E4M3:  // no infinities; NaN is S.1111.111
      return NoneHasMaxExponent<uint8_t>(data, count, 0x7fu);
    case DType::kFp8E5M2:
      return NoneHasMaxExponent<uint8_t>(data, count, 0x7cu);
  }
  return false;
}

// The common case of CheckData in one fast sweep: every element finite, every count
// positive (or count-0 padding after a head's last entry) and every head's counts summing
// within uint32. Only when this fails does CheckData walk the job element by element to
// name the first offending field.
bool LooksValid(const LayerView& layer) {
  const int64_t rows = layer.TotalRows();
  if (!AllFinite(layer.keys, layer.dtype, rows * layer.key_dim) ||
      !AllFinite(layer.values, layer.dtype, rows * layer.value_dim)) {
    return false;
  }
  if (IsFp8(layer.dtype)) {  // a finite code times its scale can still overflow
    const float largest = Fp8MaxFinite(layer.dtype);
    for (const std::span<const float> scales : {layer.key_scales, layer.value_scales}) {
      for (float scale : scales) {
        if (!std::isfinite(largest * scale)) return false;
      }
    }
  }
  if (layer.counts == nullptr) return true;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int32_t n = layer.HeadTokens(h);
    uint64_t sum = 0;
    uint32_t zero = 0, misplaced_zero = 0;
    for (int32_t t = 0; t < n; ++t) {
      const uint32_t count = layer.counts[layer.RowIndex(h, t)];
      misplaced_zero |= zero & static_cast<uint32_t>(count != 0);
      zero |= static_cast<uint32_t>(count == 0);
      sum += count;
    }
    if (misplaced_zero != 0 || sum == 0 || sum > std::numeric_limits<uint32_t>::max()) {
      return false;
    }
  }
  return true;
}

// One element of `tensor` ("keys" / "values") at (head, token, dim): finite, and finite
// once multiplied by its fp8 scale (1 for other dtypes). A finite code whose scale makes it
// overflow names the scale.
absl::Status CheckElement(const char* tensor, const char* scales, int32_t head, int32_t token,
                          int32_t dim, float scale, float element) {
  if (!std::isfinite(element)) {
    return InvalidFieldError({tensor, head, token},
                             absl::StrCat(tensor, " hold a NaN or Inf at head ", head,
                                          ", token ", token, ", dim ", dim));
  }
  if (!std::isfinite(element * scale)) {
    return InvalidFieldError(
        {scales, head},
        absl::StrCat(scales, " of head ", head, " is ", scale, ": times the ", tensor,
                     "' element ", element, " at token ", token, ", dim ", dim,
                     " it overflows float32"));
  }
  return absl::OkStatus();
}

// Every key and value must be finite; every count positive except count-0 padding at the
// end of a head (which must hold at least one entry), and a head's counts must sum to
// something a uint32 output count can hold.
absl::Status CheckData(const LayerView& layer) {
  if (LooksValid(layer)) return absl::OkStatus();
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int32_t n = layer.HeadTokens(h);
    uint64_t count_sum = 0;
    int32_t first_zero = -1;
    // An fp8 element stands for its value times its scale (docs/fp8.md).
    const float key_scale = layer.key_scales.empty() ? 1.0f : layer.KeyScale(h);
    const float value_scale = layer.value_scales.empty() ? 1.0f : layer.ValueScale(h);
    for (int32_t t = 0; t < n; ++t) {
      const int64_t key_base = layer.KeyOffset(h, t);
      for (int32_t j = 0; j < layer.key_dim; ++j) {
        CKV_RETURN_IF_ERROR(CheckElement("keys", "key_scales", h, t, j, key_scale,
                                         LoadAsFloat(layer.keys, layer.dtype, key_base + j)));
      }
      const int64_t value_base = layer.ValueOffset(h, t);
      for (int32_t j = 0; j < layer.value_dim; ++j) {
        CKV_RETURN_IF_ERROR(
            CheckElement("values", "value_scales", h, t, j, value_scale,
                         LoadAsFloat(layer.values, layer.dtype, value_base + j)));
      }
      const uint32_t count = layer.CountAt(h, t);
      if (count == 0 && first_zero < 0) first_zero = t;
      if (count != 0 && first_zero >= 0) {
        return InvalidFieldError(
            {"counts", h, first_zero},
            absl::StrCat("counts must be at least 1; head ", h, ", token ", first_zero,
                         " has 0 (count-0 padding may only follow a head's last entry)"));
      }
      count_sum += count;
    }
    if (count_sum == 0) {
      return InvalidFieldError({"counts", h},
                               absl::StrCat("counts must be at least 1; every entry of head ", h,
                                            " has 0 (a head needs at least one entry)"));
    }
    if (count_sum > std::numeric_limits<uint32_t>::max()) {
      return InvalidFieldError({"counts", h},
                               absl::StrCat("counts of head ", h, " sum to ", count_sum,
                                            ", more than a uint32 can hold"));
    }
  }
  return absl::OkStatus();
}

// Scores and reference queries, where the job has them: every element finite. The
// backends never read them, so this runs whatever the backend checks.
absl::Status CheckScoresAndQueries(const LayerView& layer) {
  if (layer.scores != nullptr &&
      !AllFinite(layer.scores, DType::kFloat32, layer.TotalRows())) {
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      for (int32_t t = 0; t < layer.HeadTokens(h); ++t) {
        const float score = layer.scores[layer.RowIndex(h, t)];
        if (!std::isfinite(score)) {
          return InvalidFieldError({"scores", h, t},
                                   absl::StrCat("scores hold ", score, " at head ", h,
                                                ", token ", t, "; a score must be finite"));
        }
      }
    }
  }
  const int64_t query_rows = int64_t{layer.num_query_heads} * layer.num_queries;
  if (layer.queries != nullptr &&
      !AllFinite(layer.queries, DType::kFloat32, query_rows * layer.key_dim)) {
    for (int64_t row = 0; row < query_rows; ++row) {
      for (int32_t j = 0; j < layer.key_dim; ++j) {
        const float element = layer.queries[row * layer.key_dim + j];
        if (!std::isfinite(element)) {
          const auto head = static_cast<int32_t>(row / layer.num_queries);
          const auto query = static_cast<int32_t>(row % layer.num_queries);
          return InvalidFieldError({"queries", head, query},
                                   absl::StrCat("queries hold ", element, " at query head ", head,
                                                ", query ", query, ", dim ", j));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Each head's budget resolved (budgeted jobs only), and checked against what the head must
// keep: a passthrough head all of its entries; a head over its budget its sink and recent
// entries, which are never merged. `field` is the option that set the budget.
absl::Status ResolveBudgets(const LayerView& layer, LayerPlan* plan) {
  const CompressOptions& options = plan->options;
  if (options.head_budgets.empty() && !plan->scored) return absl::OkStatus();
  const char* field = !options.head_budgets.empty() ? "head_budgets"
                      : options.target_tokens.has_value() ? "target_tokens"
                                                          : "target_ratio";
  plan->head_budgets.resize(static_cast<size_t>(layer.num_heads));
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t length = plan->head_lengths[h];
    int64_t budget = 0;
    if (!options.head_budgets.empty()) {
      budget = options.head_budgets[h];
    } else {
      budget = plan->passthrough[h] ? length : plan->target_length;
    }
    if (plan->passthrough[h] && budget < length) {
      return InvalidFieldError(
          {field, h}, absl::StrCat(field, " gives head ", h, " a budget of ", budget,
                                   " entries, but it is a passthrough head of ", length,
                                   " (a passthrough head keeps every entry)"));
    }
    // Sink and recent entries are never merged; without scores, merging the entries
    // between them leaves at least one.
    const int64_t protected_entries = int64_t{options.sink_tokens} + options.recent_tokens;
    const int64_t least = std::min<int64_t>(length, protected_entries + (plan->scored ? 0 : 1));
    if (budget < length && budget < least) {
      return InvalidFieldError(
          {field, h},
          absl::StrCat(field, " gives head ", h, " a budget of ", budget,
                       " entries, below the ", least, " it keeps at least (sink_tokens ",
                       options.sink_tokens, " + recent_tokens ", options.recent_tokens,
                       plan->scored ? "" : " + 1 merged entry",
                       "): lower them or raise the budget"));
    }
    plan->head_budgets[h] = budget;
  }
  return absl::OkStatus();
}

// Entries of each head without its count-0 padding (the padding itself is checked by
// CheckData): only the rows from the end back to the last counted one are read.
std::vector<int32_t> RealHeadLengths(const LayerView& layer) {
  std::vector<int32_t> lengths(static_cast<size_t>(layer.num_heads));
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    int32_t n = layer.HeadTokens(h);
    if (layer.counts != nullptr) {
      while (n > 1 && layer.counts[layer.RowIndex(h, n - 1)] == 0) --n;
    }
    lengths[h] = n;
  }
  return lengths;
}

// Whether the backend can run the job as it is: no ragged heads, and every head's `lengths`
// (RealHeadLengths) the full n, no count-0 padding. Otherwise stages above the backend split
// it into regular jobs, on float32 rows.
bool RegularHeads(const LayerView& layer, const std::vector<int32_t>& lengths) {
  return layer.head_offsets == nullptr &&
         std::all_of(lengths.begin(), lengths.end(),
                     [&](int32_t length) { return length == layer.num_tokens; });
}

}  // namespace

double LayerPlan::FloorForPass(int32_t pass) const {
  if (!options.min_similarity.has_value()) {
    return -std::numeric_limits<double>::infinity();
  }
  return *options.min_similarity + pass * options.tighten_per_pass;
}

absl::Status ValidateJobShape(const LayerView& layer, const CompressOptions& options,
                              const EngineLimits& limits) {
  CKV_RETURN_IF_ERROR(CheckDims(layer, limits));
  return CheckOptions(layer, options, limits);
}

absl::Status CheckLayerData(const LayerView& layer) { return CheckData(layer); }

absl::StatusOr<LayerPlan> PlanJob(const LayerView& layer, const CompressOptions& options,
                                  const EngineLimits& limits, bool check_data) {
  CKV_RETURN_IF_ERROR(ValidateJobShape(layer, options, limits));
  if (layer.keys == nullptr || layer.values == nullptr) {
    return absl::InvalidArgumentError(layer.keys == nullptr ? "keys are missing"
                                                            : "values are missing");
  }
  LayerPlan plan;
  plan.options = options;
  plan.input_dtype = layer.dtype;
  plan.head_lengths = RealHeadLengths(layer);
  const int32_t longest = *std::max_element(plan.head_lengths.begin(), plan.head_lengths.end());
  plan.regular = RegularHeads(layer, plan.head_lengths);
  // Padded and ragged jobs are split above the backends, which never see padding: check
  // their data here whatever the backend does.
  if (check_data || !plan.regular) CKV_RETURN_IF_ERROR(CheckData(layer));
  // n of the target is the longest head without its padding.
  if (options.target_tokens.has_value()) {
    plan.target_length = std::min<int64_t>(*options.target_tokens, longest);
  } else {
    // The same double arithmetic as the SPEC's ceil(rho * n), so that boundary cases such
    // as 0.3 * 40 round exactly as the golden implementation does.
    const double rho = options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio);
    plan.target_length = static_cast<int64_t>(std::ceil(rho * longest));
  }
  plan.passthrough.assign(layer.num_heads, false);
  for (int32_t head : options.passthrough_heads) plan.passthrough[head] = true;
  for (bool pass : plan.passthrough) plan.compressed_heads += pass ? 0 : 1;
  if (layer.num_query_heads > 0 && layer.queries == nullptr) {
    return InvalidFieldError({"queries"},
                             "queries are missing (num_query_heads is set, the tensor is not)");
  }
  CKV_RETURN_IF_ERROR(CheckScoresAndQueries(layer));
  plan.scored = layer.scores != nullptr;
  plan.fitted = layer.queries != nullptr;
  CKV_RETURN_IF_ERROR(ResolveBudgets(layer, &plan));
  return plan;
}

absl::StatusOr<LayerPlan> PlanLayer(const LayerView& layer, const CompressOptions& options,
                                    const EngineLimits& limits) {
  return PlanJob(layer, options, limits, /*check_data=*/true);
}


}  // namespace centroidkv
