// Tests of proto/grpc_status.cc: every absl code (0..16) maps to the gRPC code of the same
// meaning and back, messages pass through unchanged, and codes outside google.rpc.Code
// become UNKNOWN.
#include "centroidkv/wire/grpc_status.h"

#include <ostream>
#include <string>

#include "gtest/gtest.h"

namespace centroidkv {
namespace {

// The pairs are spelled out by name (not computed by a cast), so that the test would catch
// a mapping that is off by one or swaps two codes.
struct CodeCase {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
  const char* name;
};

void PrintTo(const CodeCase& c, std::ostream* os) { *os << c.name; }

class StatusCodeTest : public ::testing::TestWithParam<CodeCase> {};

TEST_P(StatusCodeTest, ToGrpcKeepsCodeAndMessage) {
  const CodeCase& c = GetParam();
  const std::string message = std::string("job 7: ") + c.name + " \xc3\xa9\n(details)";
  const grpc::Status status = ToGrpcStatus(absl::Status(c.absl_code, message));
  EXPECT_EQ(status.error_code(), c.grpc_code);
  if (c.absl_code == absl::StatusCode::kOk) {
    EXPECT_TRUE(status.ok());
    EXPECT_EQ(status.error_message(), "");
  } else {
    EXPECT_EQ(status.error_message(), message);
  }
}

TEST_P(StatusCodeTest, FromGrpcKeepsCodeAndMessage) {
  const CodeCase& c = GetParam();
  const std::string message = std::string("server says: ") + c.name;
  const absl::Status status = FromGrpcStatus(grpc::Status(c.grpc_code, message));
  EXPECT_EQ(status.code(), c.absl_code);
  if (c.grpc_code == grpc::StatusCode::OK) {
    EXPECT_TRUE(status.ok());
    EXPECT_EQ(status.message(), "");
  } else {
    EXPECT_EQ(std::string(status.message()), message);
  }
}

TEST_P(StatusCodeTest, RoundTripIsIdentity) {
  const CodeCase& c = GetParam();
  const absl::Status original(c.absl_code, "round trip");
  EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(original)), original);
}

INSTANTIATE_TEST_SUITE_P(
    EveryCode, StatusCodeTest,
    ::testing::Values(
        CodeCase{absl::StatusCode::kOk, grpc::StatusCode::OK, "Ok"},
        CodeCase{absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED, "Cancelled"},
        CodeCase{absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN, "Unknown"},
        CodeCase{absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT,
                 "InvalidArgument"},
        CodeCase{absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED,
                 "DeadlineExceeded"},
        CodeCase{absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND, "NotFound"},
        CodeCase{absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS,
                 "AlreadyExists"},
        CodeCase{absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED,
                 "PermissionDenied"},
        CodeCase{absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "ResourceExhausted"},
        CodeCase{absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION,
                 "FailedPrecondition"},
        CodeCase{absl::StatusCode::kAborted, grpc::StatusCode::ABORTED, "Aborted"},
        CodeCase{absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE, "OutOfRange"},
        CodeCase{absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED,
                 "Unimplemented"},
        CodeCase{absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL, "Internal"},
        CodeCase{absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE, "Unavailable"},
        CodeCase{absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS, "DataLoss"},
        CodeCase{absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED,
                 "Unauthenticated"}),
    [](const ::testing::TestParamInfo<CodeCase>& info) { return std::string(info.param.name); });

// The table above must cover every code: 17 distinct values, 0..16 on both sides.
TEST(StatusCodeTableTest, CoversZeroToSixteen) {
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kUnauthenticated), 16);
  EXPECT_EQ(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED), 16);
  EXPECT_EQ(static_cast<int>(grpc::StatusCode::DATA_LOSS), 15);
}

TEST(FromGrpcStatusTest, OutOfRangeCodeBecomesUnknownKeepingTheMessage) {
  // grpc::StatusCode has no fixed underlying type, so only 0-31 are values of it (UBSan:
  // 42 "is not a valid value for type 'grpc::StatusCode'"); 17-31 are the codes gRPC
  // does not name.
  for (int code : {17, 24, 31}) {
    SCOPED_TRACE(code);
    const absl::Status status =
        FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), "odd code"));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
    EXPECT_EQ(std::string(status.message()), "odd code");
  }
}

TEST(ToGrpcStatusTest, OutOfRangeCodeBecomesUnknownKeepingTheMessage) {
  for (int code : {17, 42, 1000}) {
    SCOPED_TRACE(code);
    const grpc::Status status =
        ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(code), "odd code"));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
    EXPECT_EQ(status.error_message(), "odd code");
  }
}

TEST(ToGrpcStatusTest, OkIsOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(WireCodeTest, JobErrorCodesRoundTripAndUnknownValuesBecomeUnknown) {
  for (int code = 0; code <= 16; ++code) {
    const auto absl_code = static_cast<absl::StatusCode>(code);
    EXPECT_EQ(ToWireCode(absl_code), code);
    EXPECT_EQ(FromWireCode(code), absl_code);
  }
  for (int32_t code : {17, 99, -1, 1 << 30}) {
    EXPECT_EQ(FromWireCode(code), absl::StatusCode::kUnknown) << code;
    EXPECT_EQ(ToWireCode(static_cast<absl::StatusCode>(code)), 2) << code;
  }
}

}  // namespace
}  // namespace centroidkv
