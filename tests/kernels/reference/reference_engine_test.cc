// Tests of kernels/reference/reference_engine.cc: every golden case of ../shared/golden
// (an independent float64 implementation of SPEC.md section 2) reproduced exactly.
#include "kernels/reference/reference_engine.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace centroidkv {
namespace {

using test::GoldenCase;

// "stories260K_layer2" -> "Stories260KLayer2": test names carry no underscores.
std::string CamelCase(const std::string& snake) {
  std::string out;
  bool upper = true;
  for (char c : snake) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c);
    upper = false;
  }
  return out;
}

class ReferenceEngineGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceEngineGoldenTest, MatchesGolden) {
  absl::StatusOr<GoldenCase> golden = test::LoadGoldenCase(GetParam());
  ASSERT_TRUE(golden.ok()) << golden.status();
  // The engine's result is always float32, the exact result before any rounding to an
  // output dtype, which is what the golden output holds (also for the fp16 case).
  const ReferenceEngine engine;
  absl::StatusOr<CompressResult> result =
      engine.Compress(test::GoldenLayerView(*golden), golden->options);
  ASSERT_TRUE(result.ok()) << result.status();
  test::ExpectMatchesGolden(*golden, *result);
  EXPECT_GE(result->passes_run, 1);
  EXPECT_LE(result->passes_run, golden->options.max_passes);
}

TEST_P(ReferenceEngineGoldenTest, MatchesGoldenWithoutAssignment) {
  absl::StatusOr<GoldenCase> golden = test::LoadGoldenCase(GetParam());
  ASSERT_TRUE(golden.ok()) << golden.status();
  CompressOptions options = golden->options;
  options.compute_assignment = false;
  absl::StatusOr<CompressResult> result =
      ReferenceEngine().Compress(test::GoldenLayerView(*golden), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->assignment.empty());
  CompressResult expected = test::GoldenExpectedResult(*golden);
  expected.assignment.clear();
  test::ExpectResultsNear(expected, *result, test::kGoldenRelTolerance);
}

INSTANTIATE_TEST_SUITE_P(Golden, ReferenceEngineGoldenTest,
                         ::testing::ValuesIn(test::ListGoldenCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return CamelCase(info.param);
                         });

TEST(ReferenceEngineTest, GoldenCasesArePresent) {
  const std::vector<std::string> names = test::ListGoldenCases();
  for (const char* expected : {"small_basic", "odd_chunks_dv", "counts_in", "floor_tighten",
                               "uniform_passthrough", "d128_fp16", "stories260K_layer2"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end())
        << expected << " missing under " << test::GoldenRoot();
  }
}

TEST(ReferenceEngineTest, GoldenConfigsParse) {
  absl::StatusOr<GoldenCase> golden = test::LoadGoldenCase("uniform_passthrough");
  ASSERT_TRUE(golden.ok()) << golden.status();
  EXPECT_EQ(golden->options.target_ratio, 0.25);
  EXPECT_FALSE(golden->options.target_tokens.has_value());
  EXPECT_EQ(golden->options.chunk_size, 32);
  EXPECT_EQ(golden->options.min_similarity, 0.985);
  EXPECT_EQ(golden->options.passthrough_heads, std::vector<int32_t>{1});
  EXPECT_TRUE(golden->options.uniform_heads);                                 // default
  EXPECT_EQ(golden->options.max_passes, CompressOptions::kDefaultMaxPasses);  // default
  EXPECT_EQ(golden->num_heads, 4);

  absl::StatusOr<GoldenCase> fp16 = test::LoadGoldenCase("d128_fp16");
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ(fp16->dtype, DType::kFloat16);
  EXPECT_EQ(fp16->key_dim, 128);
}

TEST(ReferenceEngineTest, GoldenConfigRejectsUnknownParameters) {
  EXPECT_FALSE(test::ParseGoldenConfig(R"({"config": {"chunk_sise": 8}})").ok());
  EXPECT_FALSE(test::ParseGoldenConfig(R"({"config": {"chunk_size": "8"}})").ok());
  EXPECT_FALSE(test::ParseGoldenConfig("not json").ok());
  absl::StatusOr<CompressOptions> options = test::ParseGoldenConfig(
      R"({"config": {"target_tokens": 20, "uniform_heads": false, "tighten_per_pass": 0.5,
                     "max_passes": 3, "sink_tokens": 0, "recent_tokens": 1}})");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->target_tokens, 20);
  EXPECT_FALSE(options->uniform_heads);
  EXPECT_EQ(options->tighten_per_pass, 0.5);
  EXPECT_EQ(options->max_passes, 3);
  EXPECT_EQ(options->sink_tokens, 0);
  EXPECT_EQ(options->recent_tokens, 1);
  EXPECT_EQ(options->chunk_size, CompressOptions::kDefaultChunkSize);
}

TEST(ReferenceEngineTest, Name) { EXPECT_EQ(ReferenceEngine().name(), "reference"); }

}  // namespace
}  // namespace centroidkv
