// Tests of proto/wire_convert.cc: every wire enum mapped both ways (and unknown values
// rejected naming the field), CompressionParams <-> CompressOptions with every field, absent
// fields taking the SPEC defaults, and values the engine's int32 fields cannot hold.
#include "centroidkv/wire/wire_convert.h"

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "tests/testing/result_checks.h"

namespace centroidkv {
namespace {

// EXPECT_TRUE(Names(status, "field")): the status message mentions `part`.
::testing::AssertionResult Names(const absl::Status& status, const std::string& part) {
  if (std::string(status.message()).find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "message of " << status << " does not name '" << part
                                       << "'";
}

// ---------------------------------------------------------------------------------------
// Enums. Each table lists every engine value with its wire value; both directions are
// checked, so a swapped pair in either function fails.

struct DTypeCase {
  DType engine;
  v1::DType wire;
};

void PrintTo(const DTypeCase& c, std::ostream* os) { *os << DTypeName(c.engine); }

class DTypeMappingTest : public ::testing::TestWithParam<DTypeCase> {};

TEST_P(DTypeMappingTest, MapsBothWays) {
  const DTypeCase& c = GetParam();
  EXPECT_EQ(DTypeToProto(c.engine), c.wire);
  absl::StatusOr<DType> back = DTypeFromProto(c.wire, "start_job.dtype");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c.engine);
}

INSTANTIATE_TEST_SUITE_P(Every, DTypeMappingTest,
                         ::testing::Values(DTypeCase{DType::kFloat32, v1::DTYPE_FLOAT32},
                                           DTypeCase{DType::kFloat16, v1::DTYPE_FLOAT16},
                                           DTypeCase{DType::kBFloat16, v1::DTYPE_BFLOAT16}),
                         [](const ::testing::TestParamInfo<DTypeCase>& info) {
                           std::string name(DTypeName(info.param.engine));  // "float32"
                           name[0] = static_cast<char>(name[0] - 'a' + 'A');
                           return name;
                         });

TEST(DTypeFromProtoTest, RejectsUnspecifiedNamingTheGivenField) {
  absl::StatusOr<DType> dtype = DTypeFromProto(v1::DTYPE_UNSPECIFIED, "start_job.output_dtype");
  ASSERT_FALSE(dtype.ok());
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(dtype.status(), "start_job.output_dtype"));
}

TEST(DTypeFromProtoTest, RejectsUnknownValue) {
  absl::StatusOr<DType> dtype = DTypeFromProto(static_cast<v1::DType>(42), "start_job.dtype");
  ASSERT_FALSE(dtype.ok());
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(dtype.status(), "start_job.dtype"));
  EXPECT_TRUE(Names(dtype.status(), "42"));
}

struct LayoutCase {
  TensorLayout engine;
  v1::Layout wire;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << TensorLayoutName(c.engine); }

class LayoutMappingTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(LayoutMappingTest, MapsBothWays) {
  const LayoutCase& c = GetParam();
  EXPECT_EQ(LayoutToProto(c.engine), c.wire);
  absl::StatusOr<TensorLayout> back = LayoutFromProto(c.wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c.engine);
}

INSTANTIATE_TEST_SUITE_P(
    Every, LayoutMappingTest,
    ::testing::Values(LayoutCase{TensorLayout::kHeadMajor, v1::LAYOUT_HEAD_MAJOR},
                      LayoutCase{TensorLayout::kTokenMajor, v1::LAYOUT_TOKEN_MAJOR}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) {
      return info.param.engine == TensorLayout::kHeadMajor ? "HeadMajor" : "TokenMajor";
    });

TEST(LayoutFromProtoTest, RejectsUnspecifiedAndUnknownNamingTheField) {
  for (v1::Layout layout : {v1::LAYOUT_UNSPECIFIED, static_cast<v1::Layout>(7)}) {
    SCOPED_TRACE(static_cast<int>(layout));
    absl::StatusOr<TensorLayout> result = LayoutFromProto(layout);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Names(result.status(), "start_job.layout"));
  }
}

struct BackendCase {
  BackendKind engine;
  v1::Backend wire;
  const char* name;
};

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

class BackendMappingTest : public ::testing::TestWithParam<BackendCase> {};

TEST_P(BackendMappingTest, MapsBothWays) {
  const BackendCase& c = GetParam();
  EXPECT_EQ(BackendToProto(c.engine), c.wire);
  absl::StatusOr<BackendKind> back = BackendFromProto(c.wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c.engine);
}

INSTANTIATE_TEST_SUITE_P(
    Every, BackendMappingTest,
    ::testing::Values(BackendCase{BackendKind::kAuto, v1::BACKEND_AUTO, "Auto"},
                      BackendCase{BackendKind::kCpu, v1::BACKEND_CPU, "Cpu"},
                      BackendCase{BackendKind::kCuda, v1::BACKEND_GPU, "Gpu"},
                      BackendCase{BackendKind::kReference, v1::BACKEND_REFERENCE, "Reference"},
                      BackendCase{BackendKind::kIdentity, v1::BACKEND_IDENTITY, "Identity"}),
    [](const ::testing::TestParamInfo<BackendCase>& info) { return std::string(info.param.name); });

TEST(BackendFromProtoTest, UnspecifiedMeansAuto) {
  absl::StatusOr<BackendKind> kind = BackendFromProto(v1::BACKEND_UNSPECIFIED);
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_EQ(*kind, BackendKind::kAuto);
}

TEST(BackendFromProtoTest, RejectsUnknownValueNamingTheField) {
  absl::StatusOr<BackendKind> kind = BackendFromProto(static_cast<v1::Backend>(99));
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(kind.status(), "start_job.backend"));
}

// ---------------------------------------------------------------------------------------
// CompressionParams.

TEST(OptionsFromProtoTest, AbsentFieldsTakeTheSpecDefaults) {
  absl::StatusOr<CompressOptions> options = OptionsFromProto(v1::CompressionParams());
  ASSERT_TRUE(options.ok()) << options.status();
  // SPEC.md section 2: target_ratio 0.25 (left unset: the engine applies it), C 256, S 16,
  // W 64, tau off, delta 0, P 8, uniform heads, no passthrough heads.
  EXPECT_FALSE(options->target_ratio.has_value());
  EXPECT_FALSE(options->target_tokens.has_value());
  EXPECT_EQ(options->chunk_size, 256);
  EXPECT_EQ(options->sink_tokens, 16);
  EXPECT_EQ(options->recent_tokens, 64);
  EXPECT_FALSE(options->min_similarity.has_value());
  EXPECT_EQ(options->tighten_per_pass, 0.0);
  EXPECT_EQ(options->max_passes, 8);
  EXPECT_TRUE(options->uniform_heads);
  EXPECT_TRUE(options->passthrough_heads.empty());
}

TEST(OptionsFromProtoTest, ReadsEveryField) {
  v1::CompressionParams params;
  params.set_target_ratio(0.4);
  params.set_chunk_size(7);
  params.set_sink_tokens(3);
  params.set_recent_tokens(5);
  params.set_min_similarity(-0.25);
  params.set_tighten_per_pass(0.125);
  params.set_max_passes(2);
  params.set_uniform_heads(false);
  params.add_passthrough_heads(4);
  params.add_passthrough_heads(1);
  absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
  ASSERT_TRUE(options.ok()) << options.status();
  CompressOptions expected{.target_ratio = 0.4, .chunk_size = 7, .sink_tokens = 3,
      .recent_tokens = 5, .min_similarity = -0.25, .tighten_per_pass = 0.125, .max_passes = 2,
      .uniform_heads = false, .passthrough_heads = {4, 1}};
  test::ExpectOptionsEqual(expected, *options);
}

// Zero is a value, not "absent": explicitly set zeros must not fall back to the defaults.
TEST(OptionsFromProtoTest, ExplicitZerosAreKept) {
  v1::CompressionParams params;
  params.set_sink_tokens(0);
  params.set_recent_tokens(0);
  params.set_min_similarity(0.0);
  params.set_uniform_heads(false);
  absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->sink_tokens, 0);
  EXPECT_EQ(options->recent_tokens, 0);
  ASSERT_TRUE(options->min_similarity.has_value());
  EXPECT_EQ(*options->min_similarity, 0.0);
  EXPECT_FALSE(options->uniform_heads);
}

TEST(OptionsFromProtoTest, TargetTokensIsAbsolute) {
  v1::CompressionParams params;
  params.set_target_tokens(20);
  absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->target_ratio.has_value());
  ASSERT_TRUE(options->target_tokens.has_value());
  EXPECT_EQ(*options->target_tokens, 20);
}

// target_tokens is int64 in the engine, so every uint32 fits (the engine clamps it to n).
TEST(OptionsFromProtoTest, TargetTokensKeepsTheFullUint32Range) {
  v1::CompressionParams params;
  params.set_target_tokens(std::numeric_limits<uint32_t>::max());
  absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_TRUE(options->target_tokens.has_value());
  EXPECT_EQ(*options->target_tokens, int64_t{std::numeric_limits<uint32_t>::max()});
}

// The uint32 wire fields that land in int32 engine fields.
enum class IntField { kChunkSize, kSinkTokens, kRecentTokens, kMaxPasses, kPassthroughHeads };

struct IntFieldCase {
  IntField field;
  const char* name;  // as the proto spells it
};

void SetIntField(IntField field, uint32_t value, v1::CompressionParams* params) {
  switch (field) {
    case IntField::kChunkSize:
      params->set_chunk_size(value);
      return;
    case IntField::kSinkTokens:
      params->set_sink_tokens(value);
      return;
    case IntField::kRecentTokens:
      params->set_recent_tokens(value);
      return;
    case IntField::kMaxPasses:
      params->set_max_passes(value);
      return;
    case IntField::kPassthroughHeads:
      params->add_passthrough_heads(0);
      params->add_passthrough_heads(value);
      return;
  }
}

int64_t ReadIntField(IntField field, const CompressOptions& options) {
  switch (field) {
    case IntField::kChunkSize:
      return options.chunk_size;
    case IntField::kSinkTokens:
      return options.sink_tokens;
    case IntField::kRecentTokens:
      return options.recent_tokens;
    case IntField::kMaxPasses:
      return options.max_passes;
    case IntField::kPassthroughHeads:
      return options.passthrough_heads.empty() ? -1 : options.passthrough_heads.back();
  }
  return -1;
}

void PrintTo(const IntFieldCase& c, std::ostream* os) { *os << c.name; }

class IntFieldRangeTest : public ::testing::TestWithParam<IntFieldCase> {};

TEST_P(IntFieldRangeTest, AcceptsInt32Max) {
  v1::CompressionParams params;
  constexpr uint32_t kMax = std::numeric_limits<int32_t>::max();
  SetIntField(GetParam().field, kMax, &params);
  absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(ReadIntField(GetParam().field, *options), int64_t{kMax});
}

TEST_P(IntFieldRangeTest, RefusesValuesOverInt32MaxNamingTheField) {
  for (uint32_t value : {uint32_t{1} << 31, std::numeric_limits<uint32_t>::max()}) {
    SCOPED_TRACE(value);
    v1::CompressionParams params;
    SetIntField(GetParam().field, value, &params);
    absl::StatusOr<CompressOptions> options = OptionsFromProto(params);
    ASSERT_FALSE(options.ok());
    // A chunk_size no int32 holds is above every server's limit (docs/protocol.md's table).
    EXPECT_EQ(options.status().code(), GetParam().field == IntField::kChunkSize
                                           ? absl::StatusCode::kResourceExhausted
                                           : absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(GetFieldLocation(options.status()).has_value()) << options.status();
    EXPECT_EQ(GetFieldLocation(options.status())->field, GetParam().name);
    EXPECT_TRUE(Names(options.status(), GetParam().name));
    EXPECT_TRUE(Names(options.status(), std::to_string(value)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Every, IntFieldRangeTest,
    ::testing::Values(IntFieldCase{IntField::kChunkSize, "chunk_size"},
                      IntFieldCase{IntField::kSinkTokens, "sink_tokens"},
                      IntFieldCase{IntField::kRecentTokens, "recent_tokens"},
                      IntFieldCase{IntField::kMaxPasses, "max_passes"},
                      IntFieldCase{IntField::kPassthroughHeads, "passthrough_heads"}),
    [](const ::testing::TestParamInfo<IntFieldCase>& info) {
      // "chunk_size" -> "ChunkSize".
      std::string name;
      bool upper = true;
      for (const char* p = info.param.name; *p != '\0'; ++p) {
        if (*p == '_') {
          upper = true;
        } else {
          name.push_back(upper ? static_cast<char>(*p - 'a' + 'A') : *p);
          upper = false;
        }
      }
      return name;
    });

TEST(OptionsToProtoTest, WritesEveryFieldExplicitly) {
  const v1::CompressionParams params = OptionsToProto(CompressOptions{});
  // With neither target set, the default ratio is written out.
  ASSERT_EQ(params.target_case(), v1::CompressionParams::kTargetRatio);
  EXPECT_EQ(params.target_ratio(), CompressOptions::kDefaultTargetRatio);
  EXPECT_TRUE(params.has_chunk_size());
  EXPECT_EQ(params.chunk_size(), 256u);
  EXPECT_TRUE(params.has_sink_tokens());
  EXPECT_EQ(params.sink_tokens(), 16u);
  EXPECT_TRUE(params.has_recent_tokens());
  EXPECT_EQ(params.recent_tokens(), 64u);
  EXPECT_FALSE(params.has_min_similarity());  // off stays off
  EXPECT_TRUE(params.has_tighten_per_pass());
  EXPECT_EQ(params.tighten_per_pass(), 0.0);
  EXPECT_TRUE(params.has_max_passes());
  EXPECT_EQ(params.max_passes(), 8u);
  EXPECT_TRUE(params.has_uniform_heads());
  EXPECT_TRUE(params.uniform_heads());
  EXPECT_EQ(params.passthrough_heads_size(), 0);
}

TEST(OptionsToProtoTest, TargetTokensWinsOverTheDefaultRatio) {
  CompressOptions options;
  options.target_tokens = 33;
  const v1::CompressionParams params = OptionsToProto(options);
  ASSERT_EQ(params.target_case(), v1::CompressionParams::kTargetTokens);
  EXPECT_EQ(params.target_tokens(), 33u);
}

// Every field survives OptionsToProto, a wire round trip (serialize, parse) and
// OptionsFromProto, for each kind of target.
class OptionsRoundTripTest : public ::testing::TestWithParam<bool> {};

TEST_P(OptionsRoundTripTest, EveryFieldSurvives) {
  const bool absolute_target = GetParam();
  CompressOptions original;
  if (absolute_target) {
    original.target_tokens = 1234;
  } else {
    original.target_ratio = 0.3125;
  }
  original.chunk_size = 9;
  original.sink_tokens = 0;
  original.recent_tokens = 17;
  original.min_similarity = 0.987654321;
  original.tighten_per_pass = 0.0031;
  original.max_passes = 3;
  original.uniform_heads = false;
  original.passthrough_heads = {0, 5, 2};

  std::string bytes;
  ASSERT_TRUE(OptionsToProto(original).SerializeToString(&bytes));
  v1::CompressionParams parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  absl::StatusOr<CompressOptions> back = OptionsFromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  test::ExpectOptionsEqual(original, *back);
}

TEST_P(OptionsRoundTripTest, DefaultsSurvive) {
  CompressOptions original;
  if (GetParam()) original.target_tokens = 1;
  absl::StatusOr<CompressOptions> back = OptionsFromProto(OptionsToProto(original));
  ASSERT_TRUE(back.ok()) << back.status();
  // The default target comes back explicit; everything else unchanged.
  if (!GetParam()) original.target_ratio = CompressOptions::kDefaultTargetRatio;
  test::ExpectOptionsEqual(original, *back);
}

INSTANTIATE_TEST_SUITE_P(Targets, OptionsRoundTripTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "TargetTokens" : "TargetRatio";
                         });

TEST(WireFieldTest, EngineFieldsGetTheirWireNames) {
  EXPECT_EQ(WireField("passthrough_heads"), "start_job.params.passthrough_heads");
  EXPECT_EQ(WireField("target_ratio"), "start_job.params.target_ratio");
  EXPECT_EQ(WireField("num_tokens"), "start_job.num_tokens");
  EXPECT_EQ(WireField("head_tokens"), "start_job.head_tokens");
  EXPECT_EQ(WireField("pad_to"), "start_job.pad_to");
  EXPECT_EQ(WireField("keys"), "keys");
  EXPECT_EQ(WireField("counts"), "counts");
  EXPECT_EQ(WireField("slab.data"), "slab.data");
  EXPECT_EQ(WireField("start_job.backend"), "start_job.backend");
}

TEST(StopReasonTest, EveryReasonRoundTrips) {
  for (StopReason reason : {StopReason::kTargetReached, StopReason::kPassthrough,
                            StopReason::kSimilarityFloor, StopReason::kMaxPasses,
                            StopReason::kProtected, StopReason::kUniformHeads}) {
    EXPECT_EQ(StopReasonFromProto(StopReasonToProto(reason)), reason);
    EXPECT_NE(StopReasonToProto(reason), v1::STOP_REASON_UNSPECIFIED);
  }
}

}  // namespace
}  // namespace centroidkv
