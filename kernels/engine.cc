// Validation and planning shared by every backend (the non-virtual half of ClusterEngine,
// as FAISS's Index::search wraps searchImpl_).
#include "centroidkv/kernels/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"

namespace centroidkv {
namespace {

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
      return absl::InvalidArgumentError(
          absl::StrCat(dim.field, " must be positive (got ", dim.value, ")"));
    }
    if (dim.value > dim.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(dim.field, " is ", dim.value, ", above the limit of ", dim.max));
    }
  }
  const int64_t elements = int64_t{layer.num_heads} * layer.num_tokens *
                           (int64_t{layer.key_dim} + layer.value_dim);
  if (elements > limits.max_layer_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "num_heads * num_tokens * (key_dim + value_dim) = ", elements,
        " elements exceeds the per-job limit of ", limits.max_layer_elements));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const LayerView& layer, const CompressOptions& options) {
  if (options.target_ratio.has_value() && options.target_tokens.has_value()) {
    return absl::InvalidArgumentError("set only one of target_ratio and target_tokens");
  }
  if (options.target_ratio.has_value() &&
      !(*options.target_ratio > 0.0 && *options.target_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_ratio must be in (0, 1] (got ", *options.target_ratio, ")"));
  }
  if (options.target_tokens.has_value() && *options.target_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_tokens must be at least 1 (got ", *options.target_tokens, ")"));
  }
  if (options.chunk_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size must be at least 2 (got ", options.chunk_size, ")"));
  }
  if (options.sink_tokens < 0 || options.recent_tokens < 0) {
    return absl::InvalidArgumentError(options.sink_tokens < 0
                                          ? "sink_tokens must not be negative"
                                          : "recent_tokens must not be negative");
  }
  if (options.min_similarity.has_value() &&
      !(*options.min_similarity >= -1.0 && *options.min_similarity <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_similarity must be in [-1, 1] (got ", *options.min_similarity, ")"));
  }
  if (!(options.tighten_per_pass >= 0.0) || !std::isfinite(options.tighten_per_pass)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tighten_per_pass must be a finite value >= 0 (got ", options.tighten_per_pass, ")"));
  }
  if (options.max_passes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_passes must be at least 1 (got ", options.max_passes, ")"));
  }
  for (int32_t head : options.passthrough_heads) {
    if (head < 0 || head >= layer.num_heads) {
      return absl::InvalidArgumentError(absl::StrCat("passthrough_heads names head ", head,
                                                     ", outside [0, ", layer.num_heads, ")"));
    }
  }
  return absl::OkStatus();
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
  }
  return false;
}

// The common case of CheckData in one fast sweep: every element finite, every count
// positive and every head's counts summing within uint32. Only when this fails does
// CheckData walk the job element by element to name the first offending field.
bool LooksValid(const LayerView& layer) {
  const int64_t rows = int64_t{layer.num_heads} * layer.num_tokens;
  if (!AllFinite(layer.keys, layer.dtype, rows * layer.key_dim) ||
      !AllFinite(layer.values, layer.dtype, rows * layer.value_dim)) {
    return false;
  }
  if (layer.counts == nullptr) return true;
  std::vector<uint64_t> sums(static_cast<size_t>(layer.num_heads), 0);
  uint32_t zero = 0;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    for (int32_t t = 0; t < layer.num_tokens; ++t) {
      const uint32_t count = layer.counts[layer.RowIndex(h, t)];
      zero |= static_cast<uint32_t>(count == 0);
      sums[h] += count;
    }
  }
  return zero == 0 && std::all_of(sums.begin(), sums.end(), [](uint64_t sum) {
           return sum <= std::numeric_limits<uint32_t>::max();
         });
}

// Every key and value must be finite; every count positive, and a head's counts must sum
// to something a uint32 output count can hold.
absl::Status CheckData(const LayerView& layer) {
  if (LooksValid(layer)) return absl::OkStatus();
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    uint64_t count_sum = 0;
    for (int32_t t = 0; t < layer.num_tokens; ++t) {
      const int64_t key_base = layer.KeyOffset(h, t);
      for (int32_t j = 0; j < layer.key_dim; ++j) {
        if (!std::isfinite(LoadAsFloat(layer.keys, layer.dtype, key_base + j))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "keys hold a NaN or Inf at head ", h, ", token ", t, ", dim ", j));
        }
      }
      const int64_t value_base = layer.ValueOffset(h, t);
      for (int32_t j = 0; j < layer.value_dim; ++j) {
        if (!std::isfinite(LoadAsFloat(layer.values, layer.dtype, value_base + j))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "values hold a NaN or Inf at head ", h, ", token ", t, ", dim ", j));
        }
      }
      const uint32_t count = layer.CountAt(h, t);
      if (count == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("counts must be at least 1; head ", h, ", token ", t, " has 0"));
      }
      count_sum += count;
    }
    if (count_sum > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "counts of head ", h, " sum to ", count_sum, ", more than a uint32 can hold"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view TensorLayoutName(TensorLayout layout) {
  return layout == TensorLayout::kHeadMajor ? "head_major" : "token_major";
}

double LayerPlan::FloorForPass(int32_t pass) const {
  if (!options.min_similarity.has_value()) {
    return -std::numeric_limits<double>::infinity();
  }
  return *options.min_similarity + pass * options.tighten_per_pass;
}

absl::Status ValidateJobShape(const LayerView& layer, const CompressOptions& options,
                              const EngineLimits& limits) {
  CKV_RETURN_IF_ERROR(CheckDims(layer, limits));
  return CheckOptions(layer, options);
}

absl::Status CheckLayerData(const LayerView& layer) { return CheckData(layer); }

namespace {

// PlanLayer, with or without the sweep over the data.
absl::StatusOr<LayerPlan> Plan(const LayerView& layer, const CompressOptions& options,
                               const EngineLimits& limits, bool check_data) {
  CKV_RETURN_IF_ERROR(ValidateJobShape(layer, options, limits));
  if (layer.keys == nullptr || layer.values == nullptr) {
    return absl::InvalidArgumentError(layer.keys == nullptr ? "keys are missing"
                                                            : "values are missing");
  }
  if (check_data) CKV_RETURN_IF_ERROR(CheckData(layer));

  LayerPlan plan;
  plan.options = options;
  if (options.target_tokens.has_value()) {
    plan.target_length = std::min<int64_t>(*options.target_tokens, layer.num_tokens);
  } else {
    // The same double arithmetic as the SPEC's ceil(rho * n), so that boundary cases such
    // as 0.3 * 40 round exactly as the golden implementation does.
    const double rho = options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio);
    plan.target_length = static_cast<int64_t>(std::ceil(rho * layer.num_tokens));
  }
  plan.passthrough.assign(layer.num_heads, false);
  for (int32_t head : options.passthrough_heads) plan.passthrough[head] = true;
  for (bool pass : plan.passthrough) plan.compressed_heads += pass ? 0 : 1;
  return plan;
}

}  // namespace

absl::StatusOr<LayerPlan> PlanLayer(const LayerView& layer, const CompressOptions& options,
                                    const EngineLimits& limits) {
  return Plan(layer, options, limits, /*check_data=*/true);
}

absl::StatusOr<CompressResult> ClusterEngine::Compress(const LayerView& layer,
                                                       const CompressOptions& options,
                                                       const CompressControl& control) const {
  CKV_ASSIGN_OR_RETURN(LayerPlan plan, Plan(layer, options, limits_, !ChecksLayerData()));
  if (control.IsCancelled()) {
    return absl::CancelledError("job cancelled before it started");
  }
  CompressResult result;
  CKV_RETURN_IF_ERROR(CompressImpl(plan, layer, control, &result));
  RoundResultRows(options.result_dtype, &result);
  return result;
}

absl::Status ClusterEngine::CompressInto(const LayerView& layer, const CompressOptions& options,
                                         CompressResult* result,
                                         const CompressControl& control) const {
  CKV_ASSIGN_OR_RETURN(LayerPlan plan, Plan(layer, options, limits_, !ChecksLayerData()));
  if (control.IsCancelled()) {
    return absl::CancelledError("job cancelled before it started");
  }
  CKV_RETURN_IF_ERROR(CompressReusingImpl(plan, layer, control, result));
  RoundResultRows(options.result_dtype, result);
  return absl::OkStatus();
}

absl::Status ClusterEngine::CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                                const CompressControl& control,
                                                CompressResult* out) const {
  out->num_heads = out->num_tokens = out->key_dim = out->value_dim = 0;
  out->dtype = DType::kFloat32;
  out->offsets.clear();
  out->keys.clear();
  out->values.clear();
  out->half_keys.clear();
  out->half_values.clear();
  out->counts.clear();
  out->assignment.clear();
  out->passes_run = 0;
  return CompressImpl(plan, layer, control, out);
}

void RoundResultRows(DType dtype, CompressResult* result) {
  if (result->dtype == dtype) return;
  auto round = [dtype](std::vector<float>& from, std::vector<uint16_t>& to) {
    to.resize(from.size());
    StoreFromFloats(to.data(), dtype, 0, static_cast<int64_t>(from.size()), from.data());
    from.clear();
  };
  round(result->keys, result->half_keys);
  round(result->values, result->half_values);
  result->dtype = dtype;
}

}  // namespace centroidkv
