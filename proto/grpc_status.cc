// absl <-> gRPC status codes: both enumerate google.rpc.Code, so each value maps to the
// value of the same number; anything outside that range becomes UNKNOWN. JobError codes
// cross the wire through ToWireCode / FromWireCode, checked the same way.
#include "centroidkv/wire/grpc_status.h"

#include <string>

namespace centroidkv {
namespace {
constexpr int kLastCode = static_cast<int>(absl::StatusCode::kUnauthenticated);  // 16

bool KnownCode(int code) { return code >= 0 && code <= kLastCode; }

}  // namespace

int32_t ToWireCode(absl::StatusCode code) {
  const int value = static_cast<int>(code);
  return KnownCode(value) ? value : static_cast<int32_t>(absl::StatusCode::kUnknown);
}

absl::StatusCode FromWireCode(int32_t code) {
  return KnownCode(code) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = ToWireCode(status.code());
  // OK with an error message is not a thing: an error always maps to an error code.
  const auto grpc_code =
      code == 0 ? grpc::StatusCode::UNKNOWN : static_cast<grpc::StatusCode>(code);
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const absl::StatusCode code = FromWireCode(static_cast<int32_t>(status.error_code()));
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                      status.error_message());
}

}  // namespace centroidkv
