// StartJob, JobResult header and JobError, both ways (job_codec.h).
#include "centroidkv/wire/job_codec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/wire/wire_convert.h"

namespace centroidkv {
namespace {

// A StartJob dimension as the engine's int32, located at start_job.<field>.
absl::StatusOr<int32_t> Dim(uint32_t value, const char* field, bool zero_allowed = false) {
  const std::string name = absl::StrCat("start_job.", field);
  if (value == 0 && !zero_allowed) {
    return InvalidFieldError({name}, absl::StrCat(name, " must be positive"));
  }
  if (value > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidFieldError({name}, absl::StrCat(name, " is too large"));
  }
  return static_cast<int32_t>(value);
}

// A decoded StartJob enum into `*out`, or its error located at `field`.
template <typename Kind>
absl::Status ReadKind(absl::StatusOr<Kind> decoded, const char* field, Kind* out) {
  if (!decoded.ok()) {
    if (GetFieldLocation(decoded.status()).has_value()) return decoded.status();
    return FieldError(decoded.status().code(), {field}, decoded.status().message());
  }
  *out = *decoded;
  return absl::OkStatus();
}

// head_tokens: one positive count per head; num_tokens 0 or the longest.
absl::Status ReadHeadTokens(const v1::StartJob& start, JobAnnouncement* job) {
  if (static_cast<uint32_t>(start.head_tokens_size()) != start.num_heads()) {
    return InvalidFieldError(
        {"start_job.head_tokens"},
        absl::StrCat("start_job.head_tokens has ", start.head_tokens_size(),
                     " entries; it needs one per head (num_heads ", start.num_heads(), ")"));
  }
  job->head_offsets.assign(1, 0);
  uint32_t longest = 0;
  for (int32_t h = 0; h < start.head_tokens_size(); ++h) {
    const uint32_t tokens = start.head_tokens(h);
    if (tokens == 0 || tokens > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return InvalidFieldError({"start_job.head_tokens", h},
                               absl::StrCat("start_job.head_tokens of head ", h, " is ", tokens,
                                            "; every head needs at least one entry"));
    }
    longest = std::max(longest, tokens);
    job->head_offsets.push_back(job->head_offsets.back() + tokens);
  }
  if (start.num_tokens() != 0 && start.num_tokens() != longest) {
    return InvalidFieldError(
        {"start_job.num_tokens"},
        absl::StrCat("start_job.num_tokens is ", start.num_tokens(),
                     "; with head_tokens it must be 0 or the longest head (", longest, ")"));
  }
  job->num_tokens = static_cast<int32_t>(longest);
  return absl::OkStatus();
}

// The honest account of a header (targets, entries, input tokens, stop reasons per head).
void AccountFromProto(const v1::JobResult& header, CompressResult* result) {
  result->target_length = static_cast<int64_t>(header.target_tokens());
  result->target_reached = header.target_reached();
  result->head_entries.assign(header.head_entries().begin(), header.head_entries().end());
  result->head_input_tokens.assign(header.head_input_tokens().begin(),
                                   header.head_input_tokens().end());
  result->stop_reasons.clear();
  for (int reason : header.stop_reasons()) {
    result->stop_reasons.push_back(StopReasonFromProto(static_cast<v1::StopReason>(reason)));
  }
  result->head_tokens.assign(header.head_tokens().begin(), header.head_tokens().end());
  result->padded_length = static_cast<int32_t>(header.padded_length());
  result->layout = header.layout() == v1::LAYOUT_TOKEN_MAJOR ? TensorLayout::kTokenMajor
                                                              : TensorLayout::kHeadMajor;
  result->head_budgets.assign(header.head_budgets().begin(), header.head_budgets().end());
  result->head_exact_entries.assign(header.head_exact_entries().begin(),
                                    header.head_exact_entries().end());
}

}  // namespace

LayerView JobAnnouncement::View(const void* keys, const void* values, const uint32_t* counts,
                                const float* scores, const float* queries) const {
  LayerView view{.dtype = dtype, .layout = layout, .num_heads = num_heads, .num_tokens = num_tokens,
      .key_dim = key_dim, .value_dim = value_dim, .keys = keys, .values = values,
      .counts = has_counts ? counts : nullptr,
      .head_offsets = head_offsets.empty() ? nullptr : head_offsets.data(),
      .key_scales = key_scales, .value_scales = value_scales,
      .scores = has_scores ? scores : nullptr,
      .queries = num_query_heads > 0 ? queries : nullptr,
      .num_query_heads = num_query_heads, .num_queries = num_queries};
  return view;
}

v1::StartJob StartJobToProto(uint64_t job_id, uint32_t layer_index, const LayerView& layer,
                             const CompressOptions& options, std::optional<DType> output_dtype,
                             BackendKind backend, std::chrono::milliseconds timeout,
                             int32_t priority) {
  v1::StartJob start;
  start.set_job_id(job_id);
  start.set_layer_index(layer_index);
  start.set_num_heads(static_cast<uint32_t>(layer.num_heads));
  start.set_num_tokens(static_cast<uint32_t>(layer.num_tokens));
  start.set_key_dim(static_cast<uint32_t>(layer.key_dim));
  start.set_value_dim(static_cast<uint32_t>(layer.value_dim));
  start.set_dtype(DTypeToProto(layer.dtype));
  start.set_layout(LayoutToProto(layer.layout));
  start.set_has_counts(layer.counts != nullptr);
  *start.mutable_params() = OptionsToProto(options);
  start.set_return_assignment(options.compute_assignment);
  if (output_dtype.has_value()) start.set_output_dtype(DTypeToProto(*output_dtype));
  start.set_backend(BackendToProto(backend));
  if (layer.head_offsets != nullptr) {
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      start.add_head_tokens(static_cast<uint32_t>(layer.HeadTokens(h)));
    }
  }
  start.set_pad_heads(options.pad_heads);
  start.set_pad_to(static_cast<uint32_t>(std::max(options.pad_to, 0)));
  start.set_exact_target(options.exact_target);
  if (options.output_layout != TensorLayout::kHeadMajor) {
    start.set_output_layout(LayoutToProto(options.output_layout));
  }
  start.set_timeout_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(timeout.count(), 0, std::numeric_limits<uint32_t>::max())));
  start.set_priority(priority);
  start.mutable_key_scales()->Add(layer.key_scales.begin(), layer.key_scales.end());
  start.mutable_value_scales()->Add(layer.value_scales.begin(), layer.value_scales.end());
  start.mutable_output_key_scales()->Add(options.result_key_scales.begin(),
                                         options.result_key_scales.end());
  start.mutable_output_value_scales()->Add(options.result_value_scales.begin(),
                                           options.result_value_scales.end());
  start.set_has_scores(layer.scores != nullptr);
  for (int32_t budget : options.head_budgets) {
    start.add_head_budgets(static_cast<uint32_t>(std::max(budget, 0)));
  }
  if (layer.scores != nullptr) {
    start.mutable_selection()->set_centroid_share(options.centroid_share);
    start.mutable_selection()->set_max_cluster_size(
        static_cast<uint32_t>(std::max(options.max_cluster_size, 0)));
  }
  if (layer.num_query_heads > 0) {
    v1::FitParams* fit = start.mutable_fit();
    fit->set_num_query_heads(static_cast<uint32_t>(layer.num_query_heads));
    fit->set_num_queries(static_cast<uint32_t>(std::max(layer.num_queries, 0)));
    fit->set_log_weight_bound(options.fit.log_weight_bound);
    fit->set_block_tokens(static_cast<uint32_t>(std::max(options.fit.block_tokens, 0)));
    fit->set_fit_values(options.fit.fit_values);
    if (options.fit.query_scale > 0.0) fit->set_query_scale(options.fit.query_scale);
  }
  return start;
}

namespace {

// SelectionParams and FitParams into `job` (absent fields: the defaults).
absl::Status ReadScoredAndFitted(const v1::StartJob& start, JobAnnouncement* job) {
  job->has_scores = start.has_scores();
  job->options.head_budgets.reserve(static_cast<size_t>(start.head_budgets_size()));
  for (int32_t h = 0; h < start.head_budgets_size(); ++h) {
    const uint32_t budget = start.head_budgets(h);
    if (budget > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return InvalidFieldError({"start_job.head_budgets", h},
                               absl::StrCat("start_job.head_budgets[", h, "] is too large"));
    }
    job->options.head_budgets.push_back(static_cast<int32_t>(budget));
  }
  const v1::SelectionParams& selection = start.selection();
  if (selection.has_centroid_share()) job->options.centroid_share = selection.centroid_share();
  if (selection.has_max_cluster_size()) {
    CKV_ASSIGN_OR_RETURN(job->options.max_cluster_size,
                         Dim(selection.max_cluster_size(), "selection.max_cluster_size", true));
  }
  const v1::FitParams& fit = start.fit();
  CKV_ASSIGN_OR_RETURN(job->num_query_heads,
                       Dim(fit.num_query_heads(), "fit.num_query_heads", true));
  CKV_ASSIGN_OR_RETURN(job->num_queries, Dim(fit.num_queries(), "fit.num_queries", true));
  if (fit.has_log_weight_bound()) job->options.fit.log_weight_bound = fit.log_weight_bound();
  if (fit.has_block_tokens()) {
    CKV_ASSIGN_OR_RETURN(job->options.fit.block_tokens,
                         Dim(fit.block_tokens(), "fit.block_tokens", true));
  }
  if (fit.has_fit_values()) job->options.fit.fit_values = fit.fit_values();
  if (fit.has_query_scale()) job->options.fit.query_scale = fit.query_scale();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobAnnouncement> StartJobFromProto(const v1::StartJob& start) {
  JobAnnouncement job;
  job.job_id = start.job_id();
  job.layer_index = start.layer_index();
  job.has_counts = start.has_counts();
  job.priority = start.priority();
  job.timeout = std::chrono::milliseconds(start.timeout_ms());
  CKV_RETURN_IF_ERROR(
      ReadKind(DTypeFromProto(start.dtype(), "start_job.dtype"), "start_job.dtype", &job.dtype));
  CKV_RETURN_IF_ERROR(ReadKind(LayoutFromProto(start.layout()), "start_job.layout", &job.layout));
  const bool ragged = start.head_tokens_size() > 0;
  CKV_ASSIGN_OR_RETURN(job.num_heads, Dim(start.num_heads(), "num_heads"));
  CKV_ASSIGN_OR_RETURN(job.num_tokens, Dim(start.num_tokens(), "num_tokens", ragged));
  CKV_ASSIGN_OR_RETURN(job.key_dim, Dim(start.key_dim(), "key_dim"));
  CKV_ASSIGN_OR_RETURN(job.value_dim, Dim(start.value_dim(), "value_dim"));
  if (ragged) CKV_RETURN_IF_ERROR(ReadHeadTokens(start, &job));
  job.output_dtype = job.dtype;
  if (start.output_dtype() != v1::DTYPE_UNSPECIFIED) {
    CKV_RETURN_IF_ERROR(ReadKind(DTypeFromProto(start.output_dtype(), "start_job.output_dtype"),
                                 "start_job.output_dtype", &job.output_dtype));
  }
  CKV_RETURN_IF_ERROR(
      ReadKind(BackendFromProto(start.backend()), "start_job.backend", &job.backend));
  {
    absl::StatusOr<CompressOptions> parsed = OptionsFromProto(start.params());
    if (!parsed.ok()) {
      std::optional<FieldLocation> location = GetFieldLocation(parsed.status());
      if (!location.has_value()) return WithPrefix(parsed.status(), "start_job: ");
      location->field = WireField(location->field);
      return FieldError(parsed.status().code(), *location,
                        absl::StrCat("start_job: ", parsed.status().message()));
    }
    job.options = *std::move(parsed);
  }
  job.options.compute_assignment = start.return_assignment();
  job.key_scales.assign(start.key_scales().begin(), start.key_scales().end());
  job.value_scales.assign(start.value_scales().begin(), start.value_scales().end());
  if (!IsFp8(job.output_dtype) &&
      (start.output_key_scales_size() > 0 || start.output_value_scales_size() > 0)) {
    const char* field = start.output_key_scales_size() > 0 ? "start_job.output_key_scales"
                                                           : "start_job.output_value_scales";
    return InvalidFieldError({field}, absl::StrCat(field, " are for fp8 results only (output_dtype is ",
                                                   std::string(DTypeName(job.output_dtype)), ")"));
  }
  if (IsFp8(job.output_dtype)) job.options.result_dtype = job.output_dtype;
  job.options.result_key_scales.assign(start.output_key_scales().begin(),
                                       start.output_key_scales().end());
  job.options.result_value_scales.assign(start.output_value_scales().begin(),
                                         start.output_value_scales().end());
  job.options.pad_heads = start.pad_heads();
  CKV_ASSIGN_OR_RETURN(job.options.pad_to, Dim(start.pad_to(), "pad_to", true));
  job.options.exact_target = start.exact_target();
  if (start.output_layout() != v1::LAYOUT_UNSPECIFIED) {
    absl::StatusOr<TensorLayout> layout = LayoutFromProto(start.output_layout());
    if (!layout.ok()) {
      return InvalidFieldError({"start_job.output_layout"},
                               absl::StrCat("start_job.output_layout is ",
                                            static_cast<int>(start.output_layout()),
                                            ", not a known layout"));
    }
    job.options.output_layout = *layout;
  }
  CKV_RETURN_IF_ERROR(ReadScoredAndFitted(start, &job));
  return job;
}

InputBytes InputBytesOf(const LayerView& layer) {
  const uint64_t rows = uint64_t(layer.TotalRows());
  const uint64_t element = uint64_t(DTypeSize(layer.dtype));
  InputBytes bytes;
  bytes.keys = rows * uint64_t(layer.key_dim) * element;
  bytes.values = rows * uint64_t(layer.value_dim) * element;
  bytes.counts = layer.counts != nullptr ? rows * sizeof(uint32_t) : 0;
  bytes.scores = layer.scores != nullptr ? rows * sizeof(float) : 0;
  if (layer.queries != nullptr) {
    bytes.queries = uint64_t(layer.num_query_heads) * uint64_t(layer.num_queries) *
                    uint64_t(layer.key_dim) * sizeof(float);
  }
  return bytes;
}

InputBytes InputBytesOf(const JobAnnouncement& job) {
  const LayerView shape = job.View(nullptr, nullptr, nullptr);
  InputBytes bytes = InputBytesOf(shape);
  const uint64_t rows = uint64_t(shape.TotalRows());
  if (job.has_counts) bytes.counts = rows * sizeof(uint32_t);
  if (job.has_scores) bytes.scores = rows * sizeof(float);
  bytes.queries = uint64_t(job.num_query_heads) * uint64_t(job.num_queries) *
                  uint64_t(job.key_dim) * sizeof(float);
  return bytes;
}

ResultBytes ResultBytesOf(const CompressResult& result, DType output_dtype) {
  ResultBytes bytes;
  bytes.keys = result.key_elements() * uint64_t(DTypeSize(output_dtype));
  bytes.values = result.value_elements() * uint64_t(DTypeSize(output_dtype));
  bytes.counts = result.counts.size() * sizeof(uint32_t);
  bytes.log_weights = result.log_weights.size() * sizeof(float);
  bytes.assignment = result.assignment.size() * sizeof(int32_t);
  return bytes;
}

ResultBytes ResultBytesOf(const v1::JobResult& header) {
  return ResultBytes{header.out_keys_bytes(), header.out_values_bytes(),
                     header.out_counts_bytes(), header.out_log_weights_bytes(),
                     header.assignment_bytes()};
}

uint64_t MaxResultBytes(const LayerView& shape, const CompressOptions& options,
                        DType output_dtype) {
  return MaxResultTensorBytes(shape, options, output_dtype).total();
}

ResultBytes MaxResultTensorBytes(const LayerView& shape, const CompressOptions& options,
                                 DType output_dtype) {
  // Every entry kept, each head padded to the longest (num_tokens) or to pad_to.
  const uint64_t length = std::max<uint64_t>(uint64_t(shape.num_tokens),
                                             uint64_t(std::max(options.pad_to, 0)));
  const uint64_t rows = uint64_t(shape.num_heads) * length;
  const uint64_t element = uint64_t(DTypeSize(output_dtype));
  ResultBytes bytes;
  bytes.keys = rows * uint64_t(shape.key_dim) * element;
  bytes.values = rows * uint64_t(shape.value_dim) * element;
  bytes.counts = rows * sizeof(uint32_t);
  if (shape.num_query_heads > 0) bytes.log_weights = rows * sizeof(float);
  if (options.compute_assignment) bytes.assignment = uint64_t(shape.TotalRows()) * sizeof(int32_t);
  return bytes;
}

v1::JobResult JobResultHeaderToProto(uint64_t job_id, uint32_t layer_index,
                                     const CompressResult& result, DType output_dtype,
                                     const ResultProvenance& provenance) {
  v1::JobResult header;
  header.set_job_id(job_id);
  header.set_layer_index(layer_index);
  header.set_num_heads(static_cast<uint32_t>(result.num_heads));
  header.set_num_tokens(static_cast<uint32_t>(result.num_tokens));
  header.set_key_dim(static_cast<uint32_t>(result.key_dim));
  header.set_value_dim(static_cast<uint32_t>(result.value_dim));
  header.set_dtype(DTypeToProto(output_dtype));
  for (int64_t offset : result.offsets) header.add_offsets(offset);
  header.set_has_assignment(!result.assignment.empty());
  const ResultBytes bytes = ResultBytesOf(result, output_dtype);
  header.set_out_keys_bytes(bytes.keys);
  header.set_out_values_bytes(bytes.values);
  header.set_out_counts_bytes(bytes.counts);
  header.set_out_log_weights_bytes(bytes.log_weights);
  header.set_assignment_bytes(bytes.assignment);
  header.set_backend(provenance.backend);
  header.set_passes_run(static_cast<uint32_t>(result.passes_run));
  header.set_compute_seconds(provenance.compute_seconds);
  header.set_queue_seconds(provenance.queue_seconds);
  header.set_target_tokens(static_cast<uint64_t>(result.target_length));
  header.set_target_reached(result.target_reached);
  for (int32_t entries : result.head_entries) {
    header.add_head_entries(static_cast<uint32_t>(entries));
  }
  for (uint64_t tokens : result.head_input_tokens) header.add_head_input_tokens(tokens);
  for (StopReason reason : result.stop_reasons) {
    header.add_stop_reasons(StopReasonToProto(reason));
  }
  for (int32_t tokens : result.head_tokens) {
    header.add_head_tokens(static_cast<uint32_t>(tokens));
  }
  header.set_padded_length(static_cast<uint32_t>(result.padded_length));
  header.set_layout(LayoutToProto(result.layout));
  header.mutable_key_scales()->Add(result.key_scales.begin(), result.key_scales.end());
  header.mutable_value_scales()->Add(result.value_scales.begin(), result.value_scales.end());
  for (int32_t budget : result.head_budgets) header.add_head_budgets(static_cast<uint32_t>(budget));
  for (int32_t exact : result.head_exact_entries) {
    header.add_head_exact_entries(static_cast<uint32_t>(exact));
  }
  return header;
}

absl::Status JobResultHeaderFromProto(const v1::JobResult& header, CompressResult* result,
                                      ResultProvenance* provenance) {
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "result.dtype");
  if (!dtype.ok()) return absl::DataLossError(dtype.status().message());
  result->dtype = *dtype;
  result->num_heads = static_cast<int32_t>(header.num_heads());
  result->num_tokens = static_cast<int32_t>(header.num_tokens());
  result->key_dim = static_cast<int32_t>(header.key_dim());
  result->value_dim = static_cast<int32_t>(header.value_dim());
  result->offsets.assign(header.offsets().begin(), header.offsets().end());
  result->passes_run = static_cast<int32_t>(header.passes_run());
  result->key_scales.assign(header.key_scales().begin(), header.key_scales().end());
  result->value_scales.assign(header.value_scales().begin(), header.value_scales().end());
  AccountFromProto(header, result);
  provenance->backend = header.backend();
  provenance->compute_seconds = header.compute_seconds();
  provenance->queue_seconds = header.queue_seconds();
  return absl::OkStatus();
}

v1::JobError JobErrorToProto(uint64_t job_id, const absl::Status& status) {
  v1::JobError error;
  error.set_job_id(job_id);
  error.set_code(ToWireCode(status.code()));
  error.set_message(std::string(status.message()));
  if (std::optional<FieldLocation> location = GetFieldLocation(status); location.has_value()) {
    error.set_field(WireField(location->field));
    if (location->head.has_value()) error.set_head(static_cast<uint32_t>(*location->head));
    if (location->token.has_value()) error.set_token(static_cast<uint32_t>(*location->token));
  }
  return error;
}

absl::Status StatusFromJobError(const v1::JobError& error) {
  absl::StatusCode code = FromWireCode(error.code());
  // A JobError always reports a failure: a code of OK (a broken peer) is not success.
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  if (error.field().empty()) return absl::Status(code, error.message());
  FieldLocation location{error.field()};
  if (error.has_head()) location.head = error.head();
  if (error.has_token()) location.token = error.token();
  return FieldError(code, location, error.message());
}

}  // namespace centroidkv
