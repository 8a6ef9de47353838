// absl <-> gRPC status codes: both enumerate google.rpc.Code, so each value maps to the
// value of the same number; anything outside that range becomes UNKNOWN.
#include "centroidkv/wire/grpc_status.h"

#include <string>

namespace centroidkv {
namespace {
constexpr int kLastCode = static_cast<int>(absl::StatusCode::kUnauthenticated);  // 16
}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  const auto grpc_code = (code > 0 && code <= kLastCode) ? static_cast<grpc::StatusCode>(code)
                                                         : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const auto absl_code = (code > 0 && code <= kLastCode) ? static_cast<absl::StatusCode>(code)
                                                         : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

}  // namespace centroidkv
