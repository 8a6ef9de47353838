// Wire <-> domain conversions for enums, CompressionParams, field names and stop reasons.
#include "centroidkv/wire/wire_convert.h"

#include <limits>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv {
namespace {

// A uint32 wire count as the engine's int32, the field named when it does not fit. A
// chunk_size that large is above every server's limit: RESOURCE_EXHAUSTED, as a chunk_size
// above limits.max_chunk_size is (docs/protocol.md).
absl::StatusOr<int32_t> ToInt32(uint32_t value, const char* field) {
  if (value > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    const bool limit = std::string_view(field) == "chunk_size";
    return FieldError(limit ? absl::StatusCode::kResourceExhausted
                            : absl::StatusCode::kInvalidArgument,
                      {field},
                      absl::StrCat(field, " is ", value, limit ? ", above the limit of every "
                                   "server (GetInfo limits.max_chunk_size)" : ", too large"));
  }
  return static_cast<int32_t>(value);
}

}  // namespace

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_FP8_E4M3:
      return DType::kFp8E4M3;
    case v1::DTYPE_FP8_E5M2:
      return DType::kFp8E5M2;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, " is ", static_cast<int>(dtype),
          ", not a known dtype (DTYPE_FLOAT32, DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FP8_E4M3, "
          "DTYPE_FP8_E5M2)"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kFp8E4M3:
      return v1::DTYPE_FP8_E4M3;
    case DType::kFp8E5M2:
      return v1::DTYPE_FP8_E5M2;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<TensorLayout> LayoutFromProto(v1::Layout layout) {
  switch (layout) {
    case v1::LAYOUT_HEAD_MAJOR:
      return TensorLayout::kHeadMajor;
    case v1::LAYOUT_TOKEN_MAJOR:
      return TensorLayout::kTokenMajor;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "start_job.layout is ", static_cast<int>(layout),
          ", not a known layout (LAYOUT_HEAD_MAJOR, LAYOUT_TOKEN_MAJOR)"));
  }
}

v1::Layout LayoutToProto(TensorLayout layout) {
  return layout == TensorLayout::kHeadMajor ? v1::LAYOUT_HEAD_MAJOR : v1::LAYOUT_TOKEN_MAJOR;
}

absl::StatusOr<BackendKind> BackendFromProto(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_UNSPECIFIED:
    case v1::BACKEND_AUTO:
      return BackendKind::kAuto;
    case v1::BACKEND_CPU:
      return BackendKind::kCpu;
    case v1::BACKEND_GPU:
      return BackendKind::kCuda;
    case v1::BACKEND_REFERENCE:
      return BackendKind::kReference;
    case v1::BACKEND_IDENTITY:
      return BackendKind::kIdentity;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("start_job.backend is ", static_cast<int>(backend),
                       ", not a known backend"));
  }
}

v1::Backend BackendToProto(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return v1::BACKEND_AUTO;
    case BackendKind::kCpu:
      return v1::BACKEND_CPU;
    case BackendKind::kCuda:
      return v1::BACKEND_GPU;
    case BackendKind::kReference:
      return v1::BACKEND_REFERENCE;
    case BackendKind::kIdentity:
      return v1::BACKEND_IDENTITY;
  }
  return v1::BACKEND_UNSPECIFIED;
}

absl::StatusOr<CompressOptions> OptionsFromProto(const v1::CompressionParams& params) {
  CompressOptions options;
  if (params.target_case() == v1::CompressionParams::kTargetRatio) {
    options.target_ratio = params.target_ratio();
  } else if (params.target_case() == v1::CompressionParams::kTargetTokens) {
    options.target_tokens = params.target_tokens();
  }
  struct IntField {
    bool present;
    uint32_t value;
    const char* name;
    int32_t* out;
  };
  const IntField fields[] = {
      {params.has_chunk_size(), params.chunk_size(), "chunk_size", &options.chunk_size},
      {params.has_sink_tokens(), params.sink_tokens(), "sink_tokens", &options.sink_tokens},
      {params.has_recent_tokens(), params.recent_tokens(), "recent_tokens",
       &options.recent_tokens},
      {params.has_max_passes(), params.max_passes(), "max_passes", &options.max_passes},
  };
  for (const IntField& field : fields) {
    if (!field.present) continue;
    auto value = ToInt32(field.value, field.name);
    if (!value.ok()) return value.status();
    *field.out = *value;
  }
  if (params.has_min_similarity()) options.min_similarity = params.min_similarity();
  if (params.has_tighten_per_pass()) options.tighten_per_pass = params.tighten_per_pass();
  if (params.has_uniform_heads()) options.uniform_heads = params.uniform_heads();
  for (uint32_t head : params.passthrough_heads()) {
    auto value = ToInt32(head, "passthrough_heads");
    if (!value.ok()) return value.status();
    options.passthrough_heads.push_back(*value);
  }
  return options;
}

v1::CompressionParams OptionsToProto(const CompressOptions& options) {
  v1::CompressionParams params;
  if (options.target_tokens.has_value()) {
    params.set_target_tokens(static_cast<uint32_t>(*options.target_tokens));
  } else {
    params.set_target_ratio(options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio));
  }
  params.set_chunk_size(static_cast<uint32_t>(options.chunk_size));
  params.set_sink_tokens(static_cast<uint32_t>(options.sink_tokens));
  params.set_recent_tokens(static_cast<uint32_t>(options.recent_tokens));
  if (options.min_similarity.has_value()) params.set_min_similarity(*options.min_similarity);
  params.set_tighten_per_pass(options.tighten_per_pass);
  params.set_max_passes(static_cast<uint32_t>(options.max_passes));
  params.set_uniform_heads(options.uniform_heads);
  for (int32_t head : options.passthrough_heads) {
    params.add_passthrough_heads(static_cast<uint32_t>(head));
  }
  return params;
}

std::string WireField(absl::string_view engine_field) {
  static constexpr absl::string_view kStartJobFields[] = {
      "num_heads", "num_tokens", "key_dim", "value_dim", "head_tokens", "layout", "dtype",
      "pad_to",    "pad_heads",  "exact_target", "output_layout", "timeout_ms", "priority",
      "key_scales", "value_scales", "output_key_scales", "output_value_scales",
      "output_dtype"};
  static constexpr absl::string_view kTensors[] = {"keys", "values", "counts", "scores",
                                                   "queries"};
  for (absl::string_view tensor : kTensors) {
    if (engine_field == tensor) return std::string(engine_field);
  }
  if (engine_field == "head_budgets") return "start_job.head_budgets";
  if (engine_field == "centroid_share" || engine_field == "max_cluster_size") {
    return absl::StrCat("start_job.selection.", engine_field);
  }
  if (engine_field == "num_query_heads" || engine_field == "num_queries") {
    return absl::StrCat("start_job.fit.", engine_field);
  }
  if (absl::StartsWith(engine_field, "fit.")) return absl::StrCat("start_job.", engine_field);
  if (engine_field.find('.') != absl::string_view::npos) return std::string(engine_field);
  for (absl::string_view field : kStartJobFields) {
    if (engine_field == field) return absl::StrCat("start_job.", engine_field);
  }
  return absl::StrCat("start_job.params.", engine_field);
}

StopReason StopReasonFromProto(v1::StopReason reason) {
  switch (reason) {
    case v1::STOP_REASON_PASSTHROUGH:
      return StopReason::kPassthrough;
    case v1::STOP_REASON_SIMILARITY_FLOOR:
      return StopReason::kSimilarityFloor;
    case v1::STOP_REASON_MAX_PASSES:
      return StopReason::kMaxPasses;
    case v1::STOP_REASON_PROTECTED:
      return StopReason::kProtected;
    case v1::STOP_REASON_UNIFORM_HEADS:
      return StopReason::kUniformHeads;
    default:
      return StopReason::kTargetReached;
  }
}

v1::StopReason StopReasonToProto(StopReason reason) {
  switch (reason) {
    case StopReason::kTargetReached:
      return v1::STOP_REASON_TARGET_REACHED;
    case StopReason::kPassthrough:
      return v1::STOP_REASON_PASSTHROUGH;
    case StopReason::kSimilarityFloor:
      return v1::STOP_REASON_SIMILARITY_FLOOR;
    case StopReason::kMaxPasses:
      return v1::STOP_REASON_MAX_PASSES;
    case StopReason::kProtected:
      return v1::STOP_REASON_PROTECTED;
    case StopReason::kUniformHeads:
      return v1::STOP_REASON_UNIFORM_HEADS;
  }
  return v1::STOP_REASON_UNSPECIFIED;
}

}  // namespace centroidkv
