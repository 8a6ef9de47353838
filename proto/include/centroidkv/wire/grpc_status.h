// The one mapping between absl::Status (used from the engine up) and grpc::Status (used on
// the wire), in the manner of Triton's GrpcStatusUtil. absl codes are the google.rpc codes,
// so the mapping is a cast; the message passes through unchanged. Thread-safe.
#pragma once

#include <cstdint>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace centroidkv {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The google.rpc.Code carried by a JobError, both ways, checked: a value outside the
// known codes (a newer or broken peer) becomes UNKNOWN, never an out-of-range enum.
int32_t ToWireCode(absl::StatusCode code);
absl::StatusCode FromWireCode(int32_t code);

}  // namespace centroidkv
