// CheckResultFitsDType: float32 rows beyond fp16's range (65504, or anything that rounds
// to Inf: from 65520 up) and bf16 rows already Inf fail with OUT_OF_RANGE naming
// output_dtype; values at the edge of the range pass. (The server path is in
// compress_reactor_test.)
#include "service/result_range.h"

#include <gtest/gtest.h>

#include <limits>

#include "centroidkv/common/dtype.h"

namespace centroidkv::service {
namespace {

CompressResult FloatResult(float key, float value) {
  CompressResult result;
  result.dtype = DType::kFloat32;
  result.keys = {1.0f, -key, 0.5f};
  result.values = {value, 2.0f, -3.0f};
  return result;
}

TEST(ResultRangeTest, Float32RowsAgainstFloat16) {
  EXPECT_TRUE(CheckResultFitsDType(FloatResult(65504.0f, 1.0f), DType::kFloat16, 1).ok());
  EXPECT_TRUE(CheckResultFitsDType(FloatResult(65519.0f, 1.0f), DType::kFloat16, 1).ok());
  const absl::Status keys = CheckResultFitsDType(FloatResult(65520.0f, 1.0f), DType::kFloat16, 4);
  EXPECT_EQ(keys.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(keys.message().find("output_dtype"), std::string::npos) << keys;
  EXPECT_NE(keys.message().find("keys"), std::string::npos) << keys;
  EXPECT_NE(keys.message().find("job 4"), std::string::npos) << keys;
  const absl::Status values =
      CheckResultFitsDType(FloatResult(1.0f, -1e9f), DType::kFloat16, 4);
  EXPECT_NE(values.message().find("values"), std::string::npos) << values;
}

TEST(ResultRangeTest, Float32OutputAndBFloat16RangeAcceptLargeValues) {
  EXPECT_TRUE(CheckResultFitsDType(FloatResult(3e38f, 1e30f), DType::kFloat32, 1).ok());
  EXPECT_TRUE(CheckResultFitsDType(FloatResult(1e38f, 1e30f), DType::kBFloat16, 1).ok());
  EXPECT_FALSE(CheckResultFitsDType(FloatResult(std::numeric_limits<float>::max(), 1.0f),
                                    DType::kBFloat16, 1)
                   .ok());
}

TEST(ResultRangeTest, HalfRowsWrittenByTheEngine) {
  CompressResult result;
  result.dtype = DType::kFloat16;
  result.half_keys = {FloatToHalf(1.0f), FloatToHalf(65504.0f)};
  result.half_values = {FloatToHalf(-2.0f)};
  EXPECT_TRUE(CheckResultFitsDType(result, DType::kFloat16, 1).ok());
  result.half_values.push_back(FloatToHalf(-1e6f));  // -Inf
  const absl::Status status = CheckResultFitsDType(result, DType::kFloat16, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(status.message().find("values"), std::string::npos) << status;
}

// An engine that rounded the rows itself and says how it went (CompressResult::key_rounding,
// value_rounding) is believed without a second read of the rows; a check of another dtype,
// or none, is not.
TEST(ResultRangeTest, TheEnginesOwnRoundingCheckIsUsed) {
  using Check = CompressResult::RoundingCheck;
  CompressResult result;
  result.dtype = DType::kFloat16;
  result.half_keys = {FloatToHalf(1.0f)};
  result.half_values = {FloatToHalf(-1e6f)};  // -Inf in the rows
  result.key_rounding = Check::kFits;
  result.value_rounding = Check::kFits;
  EXPECT_TRUE(CheckResultFitsDType(result, DType::kFloat16, 1).ok());
  result.value_rounding = Check::kNotChecked;  // the rows are read
  EXPECT_EQ(CheckResultFitsDType(result, DType::kFloat16, 1).code(),
            absl::StatusCode::kOutOfRange);
  result.half_values = {FloatToHalf(2.0f)};
  result.value_rounding = Check::kFits;
  result.key_rounding = Check::kOverflows;
  const absl::Status status = CheckResultFitsDType(result, DType::kFloat16, 7);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(status.message().find("keys"), std::string::npos) << status;
  // float32 rows for a fp16 output: the check (of float rows) says nothing about fp16.
  CompressResult floats = FloatResult(65520.0f, 1.0f);
  floats.key_rounding = Check::kFits;
  EXPECT_EQ(CheckResultFitsDType(floats, DType::kFloat16, 1).code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace centroidkv::service
