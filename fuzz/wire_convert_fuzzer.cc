// libFuzzer target: the wire conversions (proto/wire_convert.cc). The input is a serialized
// StartJob, as the server decodes it; its enums and its CompressionParams go through the
// conversions. Every accepted value converts back to what was sent (options up to the SPEC
// defaults the wire leaves implicit), and every refusal names its field: INVALID_ARGUMENT,
// but RESOURCE_EXHAUSTED for a chunk_size no int32 holds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "absl/strings/string_view.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/wire/wire_convert.h"

namespace {

namespace v1 = ::centroidkv::v1;

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "wire_convert_fuzzer: %s\n", what);
    std::abort();
  }
}

void CheckRefusal(const absl::Status& status, std::initializer_list<absl::string_view> fields) {
  Check(status.code() == absl::StatusCode::kInvalidArgument, "refusal is not INVALID_ARGUMENT");
  bool named = false;
  for (absl::string_view field : fields) {
    named = named || status.message().find(field) != absl::string_view::npos;
  }
  Check(named, "refusal does not name the field");
}

bool SameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The options a job runs with: equal when the engine would see the same parameters.
bool SameOptions(const centroidkv::CompressOptions& a, const centroidkv::CompressOptions& b) {
  using centroidkv::CompressOptions;
  if (a.target_tokens != b.target_tokens) return false;
  if (!a.target_tokens.has_value() &&
      !SameDouble(a.target_ratio.value_or(CompressOptions::kDefaultTargetRatio),
                  b.target_ratio.value_or(CompressOptions::kDefaultTargetRatio))) {
    return false;
  }
  if (a.min_similarity.has_value() != b.min_similarity.has_value()) return false;
  if (a.min_similarity.has_value() && !SameDouble(*a.min_similarity, *b.min_similarity)) {
    return false;
  }
  return a.chunk_size == b.chunk_size && a.sink_tokens == b.sink_tokens &&
         a.recent_tokens == b.recent_tokens && SameDouble(a.tighten_per_pass, b.tighten_per_pass) &&
         a.max_passes == b.max_passes && a.uniform_heads == b.uniform_heads &&
         a.passthrough_heads == b.passthrough_heads;
}

void CheckDType(v1::DType dtype) {
  absl::StatusOr<centroidkv::DType> value = centroidkv::DTypeFromProto(dtype, "start_job.dtype");
  if (!value.ok()) return CheckRefusal(value.status(), {"start_job.dtype"});
  Check(centroidkv::DTypeToProto(*value) == dtype, "dtype does not round-trip");
}

void CheckLayout(v1::Layout layout) {
  absl::StatusOr<centroidkv::TensorLayout> value = centroidkv::LayoutFromProto(layout);
  if (!value.ok()) return CheckRefusal(value.status(), {"start_job.layout"});
  Check(centroidkv::LayoutToProto(*value) == layout, "layout does not round-trip");
}

void CheckBackend(v1::Backend backend) {
  absl::StatusOr<centroidkv::BackendKind> value = centroidkv::BackendFromProto(backend);
  if (!value.ok()) return CheckRefusal(value.status(), {"start_job.backend"});
  // UNSPECIFIED means AUTO; every other accepted value comes back as sent.
  absl::StatusOr<centroidkv::BackendKind> back =
      centroidkv::BackendFromProto(centroidkv::BackendToProto(*value));
  Check(back.ok() && *back == *value, "backend does not round-trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::StartJob start;
  if (!start.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC refuses it first
  CheckDType(start.dtype());
  CheckDType(start.output_dtype());
  CheckLayout(start.layout());
  CheckBackend(start.backend());

  absl::StatusOr<centroidkv::CompressOptions> options =
      centroidkv::OptionsFromProto(start.params());
  if (!options.ok()) {
    // A count no int32 holds: the field named in the status's location; a chunk_size that
    // large is above every server's limit, RESOURCE_EXHAUSTED (docs/protocol.md).
    const std::optional<centroidkv::FieldLocation> at =
        centroidkv::GetFieldLocation(options.status());
    Check(at.has_value(), "an options refusal carries no field");
    const bool chunk = at->field == "chunk_size";
    Check(options.status().code() == (chunk ? absl::StatusCode::kResourceExhausted
                                            : absl::StatusCode::kInvalidArgument),
          "an options refusal has the wrong code");
    Check(chunk || at->field == "sink_tokens" || at->field == "recent_tokens" ||
              at->field == "max_passes" || at->field == "passthrough_heads",
          "an options refusal names no int field");
    Check(options.status().message().find(at->field) != absl::string_view::npos,
          "refusal does not name the field");
    return 0;
  }
  // The client's direction: what OptionsToProto writes, the server reads back unchanged,
  // also after a trip through the wire bytes.
  const v1::CompressionParams params = centroidkv::OptionsToProto(*options);
  v1::CompressionParams reparsed;
  Check(reparsed.ParseFromString(params.SerializeAsString()), "OptionsToProto output does not parse");
  absl::StatusOr<centroidkv::CompressOptions> again = centroidkv::OptionsFromProto(reparsed);
  Check(again.ok(), "OptionsToProto output is refused");
  Check(SameOptions(*options, *again), "options do not round-trip");
  return 0;
}
