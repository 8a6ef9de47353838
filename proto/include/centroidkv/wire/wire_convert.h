// Conversions between wire enums / parameter messages and the domain types (types/). Errors name
// the field as the proto spells it. Thread-safe: pure functions.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv {

// `field` names the message field in errors, e.g. "start_job.dtype".
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field);
v1::DType DTypeToProto(DType dtype);

absl::StatusOr<TensorLayout> LayoutFromProto(v1::Layout layout);
v1::Layout LayoutToProto(TensorLayout layout);

absl::StatusOr<BackendKind> BackendFromProto(v1::Backend backend);
v1::Backend BackendToProto(BackendKind kind);

// Absent fields take the SPEC defaults. Range checks beyond "fits the engine's integer
// types" are the engine's (PlanLayer), so that in-process and remote calls agree.
absl::StatusOr<CompressOptions> OptionsFromProto(const v1::CompressionParams& params);
// Writes only what differs from "unset": every field of `options` is explicit.
v1::CompressionParams OptionsToProto(const CompressOptions& options);

// The request field an engine error names (FieldLocation::field), as the wire spells it:
// "passthrough_heads" -> "start_job.params.passthrough_heads", "num_tokens" ->
// "start_job.num_tokens", "centroid_share" -> "start_job.selection.centroid_share",
// "fit.block_tokens" -> "start_job.fit.block_tokens"; the input tensors ("keys", "values",
// "counts", "scores", "queries") and names already spelled the wire's way ("slab.data",
// "start_job....") stay as they are.
std::string WireField(absl::string_view engine_field);

StopReason StopReasonFromProto(v1::StopReason reason);
v1::StopReason StopReasonToProto(StopReason reason);

}  // namespace centroidkv
