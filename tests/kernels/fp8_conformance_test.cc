// fp8 in and out on every backend (the TEST_Ps of EngineConformanceTest, instantiated once
// per backend in engine_conformance_test.cc): the fp8 golden cases bit for bit, fp8 input as
// the job on its widened floats, fp8 results as the float result divided by its scales and
// rounded once (static and per-head dynamic scales, padded and token-major rows, rows into
// caller memory), and bad scales refused naming the field.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "tests/kernels/engine_conformance.h"
#include "tests/testing/fp8_layer.h"
#include "tests/testing/golden_fp8.h"

namespace centroidkv::conformance {
namespace {

using test::Fp8Layer;
using test::RandomLayer;
using test::Spec;

// The head of row `row` of a result (head-major by offsets, or token-major r * H + h).
int32_t HeadOfRow(const CompressResult& result, int64_t row) {
  if (result.layout == TensorLayout::kTokenMajor) {
    return static_cast<int32_t>(row % result.num_heads);
  }
  int32_t h = 0;
  while (row >= result.offsets[h + 1]) ++h;
  return h;
}

// `floats` (a float32 result) as the fp8 result the engine must give with `options`.
CompressResult ExpectedFp8(const CompressResult& floats, const CompressOptions& options) {
  CompressResult expected = floats;
  const DType dtype = options.result_dtype;
  auto scales_for = [&](const std::vector<float>& rows, int32_t dim,
                        const std::vector<float>& given) {
    if (given.size() == 1) return std::vector<float>(floats.num_heads, given[0]);
    if (!given.empty()) return given;
    std::vector<float> amax(floats.num_heads, 0.0f);
    for (size_t i = 0; i < rows.size(); ++i) {
      float& m = amax[HeadOfRow(floats, static_cast<int64_t>(i) / dim)];
      m = std::max(m, std::fabs(rows[i]));
    }
    for (float& s : amax) {
      s = s > 0 ? std::max(s / Fp8MaxFinite(dtype), std::numeric_limits<float>::min()) : 1.0f;
    }
    return amax;
  };
  expected.key_scales = scales_for(floats.keys, floats.key_dim, options.result_key_scales);
  expected.value_scales =
      scales_for(floats.values, floats.value_dim, options.result_value_scales);
  auto narrow = [&](const std::vector<float>& rows, int32_t dim, const std::vector<float>& s) {
    std::vector<uint8_t> codes(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      codes[i] = FloatToFp8(rows[i] / s[HeadOfRow(floats, static_cast<int64_t>(i) / dim)], dtype);
    }
    return codes;
  };
  expected.fp8_keys = narrow(floats.keys, floats.key_dim, expected.key_scales);
  expected.fp8_values = narrow(floats.values, floats.value_dim, expected.value_scales);
  expected.keys.clear();
  expected.values.clear();
  expected.dtype = dtype;
  return expected;
}

TEST_P(EngineConformanceTest, Fp8GoldenCasesBitForBit) {
  const std::vector<std::string> names = test::ListFp8GoldenCases();
  ASSERT_FALSE(names.empty()) << "no fp8 golden cases under " << test::Fp8GoldenRoot();
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    absl::StatusOr<test::Fp8GoldenCase> golden = test::LoadFp8GoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    CompressResult result;
    ASSERT_NO_FATAL_FAILURE(Run(test::Fp8GoldenLayerView(*golden), golden->options, &result));
    test::ExpectFp8ResultsEqual(golden->expected, result);
  }
}

TEST_P(EngineConformanceTest, Fp8InputRunsAsItsWidenedFloats) {
  test::RandomLayerSpec spec = WithCounts(Spec(3, 300, 16, 12, 171));
  const RandomLayer source = RandomLayer::Generate(Clustered(spec, 6, 0.2));
  for (const DType dtype : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const Fp8Layer layer = Fp8Layer::From(source, dtype);
    const CompressOptions jobs[] = {Opts().Chunk(64).Protect(4, 16), Opts().Ratio(0.1).Chunk(32)};
    for (const CompressOptions& options : jobs) {
      CompressResult from_fp8, from_floats;
      ASSERT_NO_FATAL_FAILURE(Run(layer.Fp8View(), options, &from_fp8));
      ASSERT_NO_FATAL_FAILURE(Run(layer.WideView(), options, &from_floats));
      ExpectBitIdentical(from_floats, from_fp8);
      EXPECT_GT(from_fp8.passes_run, 0);
    }
  }
}

TEST_P(EngineConformanceTest, Fp8ResultsAreTheFloatResultScaledAndRoundedOnce) {
  const RandomLayer layer = RandomLayer::Generate(WithCounts(Spec(3, 256, 16, 8, 172)));
  struct Case {
    const char* name;
    CompressOptions options;
    std::vector<float> key_scales, value_scales;
  };
  CompressOptions token_major = Opts().Chunk(64);
  token_major.output_layout = TensorLayout::kTokenMajor;
  CompressOptions padded = Opts().Chunk(64).Ratio(0.3);
  padded.pad_to = 200;
  const Case cases[] = {
      {"dynamic", Opts().Chunk(64).Protect(4, 8), {}, {}},
      {"static per layer (saturating)", Opts().Chunk(64), {0.001f}, {0.002f}},
      {"static per head", Opts().Chunk(32).Passthrough({1}), {0.01f, 0.02f, 0.03f},
       {0.03f, 0.02f, 0.01f}},
      {"dynamic, token-major", token_major, {}, {}},
      {"dynamic, padded", padded, {}, {}},
  };
  for (const Case& c : cases) {
    for (const DType dtype : {DType::kFp8E4M3, DType::kFp8E5M2}) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(DTypeName(dtype)));
      CompressResult floats;
      ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &floats));
      CompressOptions options = c.options;
      options.result_dtype = dtype;
      options.result_key_scales = c.key_scales;
      options.result_value_scales = c.value_scales;
      CompressResult fp8;
      ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &fp8));
      ExpectBitIdentical(ExpectedFp8(floats, options), fp8);
      EXPECT_EQ(fp8.key_elements(), floats.keys.size());
      CompressResult reused = floats;  // CompressInto over an earlier float32 result
      ASSERT_TRUE(engine_->CompressInto(layer.view(), options, &reused).ok());
      ExpectBitIdentical(fp8, reused);
    }
  }
}

// Caller memory for the rows (the service's shared-memory path): the fp8 codes go there
// directly, equal to the result's own arrays otherwise.
TEST_P(EngineConformanceTest, Fp8RowsGoIntoCallerMemory) {
  const RandomLayer layer = RandomLayer::Generate(Spec(2, 128, 8, 8, 173));
  CompressOptions options = Opts().Chunk(32);
  options.result_dtype = DType::kFp8E4M3;
  CompressResult in_arrays;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &in_arrays));
  std::vector<uint8_t> keys(2 * 128 * 8, 0xee), values(2 * 128 * 8, 0xee);
  const ResultRowTarget target{keys.data(), keys.size(), values.data(), values.size()};
  CompressControl control;
  control.row_target = &target;
  CompressResult in_target;
  ASSERT_TRUE(engine_->CompressInto(layer.view(), options, &in_target, control).ok());
  ASSERT_TRUE(in_target.rows_in_target);
  EXPECT_TRUE(in_target.fp8_keys.empty());
  EXPECT_EQ(in_target.key_scales, in_arrays.key_scales);
  const size_t key_bytes = in_arrays.fp8_keys.size();
  EXPECT_EQ(std::vector<uint8_t>(keys.begin(), keys.begin() + key_bytes), in_arrays.fp8_keys);
  EXPECT_EQ(std::vector<uint8_t>(values.begin(), values.begin() + key_bytes),
            in_arrays.fp8_values);
  EXPECT_EQ(keys[key_bytes], 0xee) << "a byte past the result was written";
}

// One result reused for an fp8 job and then a float one (as the service's result pool
// does): nothing of the fp8 job (codes, scales) stays in the float result.
TEST_P(EngineConformanceTest, AReusedResultKeepsNoFp8StateOfAnEarlierJob) {
  const RandomLayer layer = RandomLayer::Generate(Spec(2, 96, 8, 8, 175));
  CompressOptions fp8 = Opts().Chunk(32);
  fp8.result_dtype = DType::kFp8E4M3;
  CompressResult reused;
  ASSERT_TRUE(engine_->CompressInto(layer.view(), fp8, &reused).ok());
  ASSERT_EQ(reused.key_scales.size(), 2u);
  for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
    CompressOptions plain = Opts().Chunk(32);
    plain.result_dtype = dtype;
    ASSERT_TRUE(engine_->CompressInto(layer.view(), fp8, &reused).ok());
    ASSERT_TRUE(engine_->CompressInto(layer.view(), plain, &reused).ok());
    CompressResult fresh;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), plain, &fresh));
    ExpectBitIdentical(fresh, reused);
    EXPECT_TRUE(reused.key_scales.empty() && reused.value_scales.empty());
    EXPECT_TRUE(reused.fp8_keys.empty() && reused.fp8_values.empty());
  }
}

TEST_P(EngineConformanceTest, BadFp8ScalesAreRefusedNamingTheField) {
  const RandomLayer source = RandomLayer::Generate(Spec(3, 64, 8, 8, 174));
  const Fp8Layer layer = Fp8Layer::From(source, DType::kFp8E4M3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> good = {0.01f};
  struct Case {
    const char* name;
    std::vector<float> key_scales, value_scales;
    const char* field;
    std::optional<int32_t> head;
  };
  const Case cases[] = {
      {"zero", {0.0f}, good, "key_scales", 0},
      {"negative", good, {0.1f, -0.1f, 0.1f}, "value_scales", 1},
      {"NaN", {0.1f, 0.1f, nan}, good, "key_scales", 2},
      {"infinite", good, {std::numeric_limits<float>::infinity()}, "value_scales", 0},
      {"missing", {}, good, "key_scales", std::nullopt},
      {"two for three heads", {0.1f, 0.2f}, good, "key_scales", std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LayerView view = layer.Fp8View();
    view.key_scales = c.key_scales;
    view.value_scales = c.value_scales;
    const absl::StatusOr<CompressResult> result = engine_->Compress(view, Opts());
    ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    const std::optional<FieldLocation> location = GetFieldLocation(result.status());
    ASSERT_TRUE(location.has_value()) << result.status();
    EXPECT_EQ(location->field, c.field) << result.status();
    EXPECT_EQ(location->head, c.head) << result.status();
  }
  // Scales on tensors that are not fp8.
  LayerView floats = layer.WideView();
  floats.key_scales = good;
  EXPECT_EQ(GetFieldLocation(engine_->Compress(floats, Opts()).status())->field, "key_scales");
  CompressOptions half = Opts();
  half.result_dtype = DType::kFloat16;
  half.result_value_scales = good;
  EXPECT_EQ(GetFieldLocation(engine_->Compress(layer.WideView(), half).status())->field,
            "output_value_scales");
  CompressOptions fp8 = Opts();
  fp8.result_dtype = DType::kFp8E5M2;
  fp8.result_key_scales = {-1.0f};
  const absl::Status status = engine_->Compress(layer.WideView(), fp8).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFieldLocation(status)->field, "output_key_scales") << status;
}

}  // namespace
}  // namespace centroidkv::conformance
