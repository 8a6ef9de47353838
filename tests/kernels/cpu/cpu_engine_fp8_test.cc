// Tests of the cpu backend's own fp8 rows (kernels/cpu: RowBlock's fp8 element types and
// scales, the kernels' fp8 loads, BlockWriter's fp8 narrowing): at every SIMD level this CPU
// supports, an fp8 job gives exactly the reference engine's result, which widens the input
// and quantises the result above the backend (kernels/fp8_rows.h): on random jobs of many
// shapes and layouts, with every code of both formats, with static result scales into the
// result's arrays and into caller memory, and bad codes or scales rejected with the
// reference's error.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_engine.h"
#include "kernels/reference/reference_engine.h"
#include "tests/testing/fp8_layer.h"
#include "tests/kernels/cpu/cpu_engine_testing.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::cpu {
namespace {

using test::CompressOrFail;
using test::ExpectBitIdentical;
using test::Fp8Layer;
using test::Options;
using test::RandomLayer;
using test::Spec;

constexpr DType kFormats[] = {DType::kFp8E4M3, DType::kFp8E5M2};

// `options` with fp8 results of `dtype` in static scales: one per head (scale_per_head) or
// one per layer.
CompressOptions StaticFp8Result(CompressOptions options, DType dtype, int32_t heads,
                                bool scale_per_head) {
  options.result_dtype = dtype;
  if (scale_per_head) {
    for (int32_t h = 0; h < heads; ++h) {
      options.result_key_scales.push_back(0.004f * static_cast<float>(h + 1));
      options.result_value_scales.push_back(0.006f / static_cast<float>(h + 1));
    }
  } else {
    options.result_key_scales = {0.0075f};
    options.result_value_scales = {0.005f};
  }
  return options;
}

class CpuEngineFp8Test : public ::testing::TestWithParam<SimdLevel> {
 protected:
  CpuEngineFp8Test() : engine_({}, CpuEngineOptions{GetParam()}) {}

  // The reference's result and ours, through Compress and through CompressInto over an
  // earlier result of another shape.
  void ExpectSameAsReference(const LayerView& layer, const CompressOptions& options) {
    const CompressResult expected = CompressOrFail(reference_, layer, options);
    ExpectBitIdentical(expected, CompressOrFail(engine_, layer, options));
    ASSERT_TRUE(engine_.CompressInto(layer, options, &reused_).ok());
    ExpectBitIdentical(expected, reused_);
    // The kernels read fp8 rows as they are: no widened float32 copy above the backend.
    EXPECT_TRUE(reused_.fp8_input_scratch.empty());
  }

  ReferenceEngine reference_;
  CpuEngine engine_;
  CompressResult reused_;
};

struct Job {
  std::string name;
  test::RandomLayerSpec spec;
  CompressOptions options;
};

std::vector<Job> Jobs() {
  constexpr TensorLayout kTokenMajor = TensorLayout::kTokenMajor;
  std::vector<Job> jobs = {
      {"Dim128Chunk256OnePass", Spec(2, 1100, 128, 64, 21), Options(256, 16, 64, 0.5, 1)},
      {"TokenMajorCountsChunk64", Spec(3, 700, 64, 32, 22, DType::kFloat32, kTokenMajor),
       Options(64, 4, 32, 0.25)},
      {"OddDimsOddChunk", Spec(2, 501, 33, 9, 23), Options(7, 3, 5, 0.3)},
      {"Dim40Chunk96", Spec(2, 600, 40, 19, 24), Options(96, 0, 0, 0.2)},
      {"Dim1", Spec(2, 200, 1, 3, 25), Options(16, 0, 0, 0.25)},
  };
  jobs[1].spec.with_counts = true;
  jobs[3].spec.prototypes = 4;
  jobs[3].spec.noise = 0.05;
  // A floor (match, select, then merge: the merges read the fp8 input rows), several passes.
  Job floor{"FloorPassthroughChunk32", Spec(4, 400, 16, 16, 26), Options(32, 4, 8, 0.2)};
  floor.spec.prototypes = 6;
  floor.spec.noise = 0.15;
  floor.options.min_similarity = 0.9;
  floor.options.tighten_per_pass = 0.005;
  floor.options.uniform_heads = false;
  floor.options.passthrough_heads = {3};
  jobs.push_back(floor);
  // Top r below the candidates, chunks long enough for a matrix engine.
  Job select{"TopRChunk512", Spec(2, 2100, 32, 8, 27), Options(512, 8, 16, 0.1)};
  select.spec.prototypes = 3;
  select.spec.noise = 0.01;
  select.options.target_ratio.reset();
  select.options.target_tokens = 900;
  jobs.push_back(select);
  return jobs;
}

TEST_P(CpuEngineFp8Test, ReadsAndWritesFp8Itself) {
  EXPECT_TRUE(engine_.caps().ReadsInputDType(DType::kFp8E4M3));
  EXPECT_TRUE(engine_.caps().ReadsInputDType(DType::kFp8E5M2));
  EXPECT_TRUE(engine_.caps().WritesResultDType(DType::kFp8E4M3));
  EXPECT_FALSE(reference_.caps().ReadsInputDType(DType::kFp8E4M3));
}

// fp8 input into float32, fp16 and static-scale fp8 results (per head and per layer).
TEST_P(CpuEngineFp8Test, BitIdenticalToReferenceOnRandomJobs) {
  for (const Job& job : Jobs()) {
    const RandomLayer source = RandomLayer::Generate(job.spec);
    for (const DType format : kFormats) {
      SCOPED_TRACE(job.name + " " + std::string(DTypeName(format)) + ": " + job.spec.ToString());
      const Fp8Layer layer = Fp8Layer::From(source, format);
      const int32_t heads = job.spec.num_heads;
      CompressOptions half = job.options;
      half.result_dtype = DType::kFloat16;
      CompressOptions dynamic = job.options;
      dynamic.result_dtype = format;
      CompressOptions mixed = StaticFp8Result(job.options, DType::kFp8E4M3, heads, true);
      mixed.result_value_scales.clear();  // static keys, dynamic values
      const CompressOptions cases[] = {
          job.options, half, StaticFp8Result(job.options, DType::kFp8E4M3, heads, true),
          StaticFp8Result(job.options, format, heads, false), dynamic, mixed};
      for (const CompressOptions& options : cases) {
        SCOPED_TRACE("result " + std::string(DTypeName(options.result_dtype)));
        ExpectSameAsReference(layer.Fp8View(), options);
      }
      // Static fp8 results of a float input as well.
      ExpectSameAsReference(source.view(), StaticFp8Result(job.options, format, heads, true));
    }
  }
}

// exact_target (its second stage above the backend works on the first stage's float32
// rows): the input is still read as fp8 codes by the backend, the result quantised above it.
TEST_P(CpuEngineFp8Test, ExactTargetJobsReadFp8Too) {
  const RandomLayer source = RandomLayer::Generate(Spec(3, 300, 24, 16, 61));
  for (const DType format : kFormats) {
    SCOPED_TRACE(std::string(DTypeName(format)));
    const Fp8Layer layer = Fp8Layer::From(source, format);
    CompressOptions exact = Options(32, 4, 8, 0.2, 2);  // two passes leave heads above t
    exact.exact_target = true;
    exact.compute_assignment = true;
    CompressOptions half = exact;
    half.result_dtype = DType::kFloat16;
    CompressOptions dynamic = exact;
    dynamic.result_dtype = format;
    for (const CompressOptions& options :
         {exact, half, dynamic, StaticFp8Result(exact, format, 3, true)}) {
      SCOPED_TRACE("result " + std::string(DTypeName(options.result_dtype)));
      ExpectSameAsReference(layer.Fp8View(), options);
      EXPECT_GT(reused_.passes_run, 2) << "the second stage ran";
      EXPECT_TRUE(reused_.target_reached);
    }
  }
}

// Every code of both formats (NaN codes excepted) in key and value rows, with scales that
// make some widened values subnormal and some near the float maximum: passthrough heads
// (rows copied) and merged heads (pair means and weighted sums).
TEST_P(CpuEngineFp8Test, EveryCodeWidensAsTheReferenceWidensIt) {
  for (const DType format : kFormats) {
    for (const float scale : {1.0f, 3.0e-38f, 7.0e33f, 0.1f}) {
      SCOPED_TRACE(std::string(DTypeName(format)) + " scale " + std::to_string(scale));
      const bool e4m3 = format == DType::kFp8E4M3;
      std::vector<uint8_t> codes;
      for (int code = 0; code < 256; ++code) {
        const int magnitude = code & 0x7f;
        if (e4m3 ? magnitude == 0x7f : magnitude >= 0x7c) continue;  // NaN (E5M2: Inf too)
        if (!std::isfinite(Fp8ToFloat(static_cast<uint8_t>(code), format) * scale)) continue;
        codes.push_back(static_cast<uint8_t>(code));
      }
      // Rows of 40 (vector lanes and a tail), each code in several rows and columns.
      const int32_t dim = 40, tokens = 96, heads = 2;
      const RandomLayer source = RandomLayer::Generate(Spec(heads, tokens, dim, dim, 31));
      Fp8Layer layer = Fp8Layer::From(source, format);
      size_t next = 0;
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t t = 0; t < tokens; ++t) {
          for (int32_t j = 0; j < dim; ++j, ++next) {
            layer.SetKeyCode(h, t, j, codes[next % codes.size()]);
            layer.SetValueCode(h, t, j, codes[(next * 7 + 3) % codes.size()]);
          }
        }
      }
      layer.key_scales = {scale, scale};
      layer.value_scales = {scale, scale};
      CompressOptions options = Options(16, 2, 2, 0.5, 2);
      options.passthrough_heads = {1};
      ExpectSameAsReference(layer.Fp8View(), options);
      // The float result rows of the same job are the widened codes where nothing merged.
      const CompressResult fp8 = CompressOrFail(engine_, layer.Fp8View(), options);
      const CompressResult wide = CompressOrFail(engine_, layer.WideView(), options);
      ExpectBitIdentical(wide, fp8);
    }
  }
}

// fp8 results straight into caller memory (the service's shared memory), with the input fp8
// too: the codes in the target are those of the result's own arrays, with static and with
// dynamic scales.
TEST_P(CpuEngineFp8Test, Fp8RowsGoIntoCallerMemory) {
  const RandomLayer source = RandomLayer::Generate(Spec(3, 256, 24, 16, 41));
  const Fp8Layer layer = Fp8Layer::From(source, DType::kFp8E4M3);
  for (const bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic scales" : "static scales");
    CompressOptions options = StaticFp8Result(Options(32, 4, 8, 0.25), DType::kFp8E4M3, 3, true);
    if (dynamic) {
      options.result_key_scales.clear();
      options.result_value_scales.clear();
    }
    const CompressResult in_arrays = CompressOrFail(engine_, layer.Fp8View(), options);
    ASSERT_EQ(in_arrays.dtype, DType::kFp8E4M3);
    std::vector<uint8_t> keys(3 * 256 * 24, 0xee), values(3 * 256 * 16, 0xee);
    const ResultRowTarget target{keys.data(), keys.size(), values.data(), values.size()};
    CompressControl control;
    control.row_target = &target;
    CompressResult in_target;
    ASSERT_TRUE(engine_.CompressInto(layer.Fp8View(), options, &in_target, control).ok());
    ASSERT_TRUE(in_target.rows_in_target);
    EXPECT_TRUE(in_target.fp8_keys.empty() && in_target.fp8_values.empty());
    EXPECT_EQ(in_target.key_scales, in_arrays.key_scales);
    EXPECT_EQ(in_target.value_scales, in_arrays.value_scales);
    const size_t key_bytes = in_arrays.fp8_keys.size(), value_bytes = in_arrays.fp8_values.size();
    EXPECT_EQ(std::vector<uint8_t>(keys.begin(), keys.begin() + key_bytes), in_arrays.fp8_keys);
    EXPECT_EQ(std::vector<uint8_t>(values.begin(), values.begin() + value_bytes),
              in_arrays.fp8_values);
    EXPECT_EQ(keys[key_bytes], 0xee) << "a byte past the result was written";
    EXPECT_EQ(values[value_bytes], 0xee) << "a byte past the result was written";
    EXPECT_TRUE(in_target.keys.empty() && in_target.values.empty());
  }
}

// A NaN code (E5M2: an Inf code too) anywhere the engine reads (a chunk's key or value, a
// protected row, a passthrough head), or a finite code whose value times its scale
// overflows: the reference's INVALID_ARGUMENT, naming the field, head and token.
TEST_P(CpuEngineFp8Test, RejectsBadCodesAndOverflowingScalesAsTheReferenceDoes) {
  struct Placement {
    const char* name;
    bool key;
    int32_t head, token, dim;
  };
  const Placement placements[] = {
      {"ChunkKey", true, 1, 40, 3},     {"ChunkValue", false, 0, 41, 5},
      {"ChunkSourceValue", false, 1, 44, 7},
      {"SinkKey", true, 0, 2, 1},       {"RecentValue", false, 2, 297, 6},
      {"PassthroughKey", true, 2, 50, 7}};
  CompressOptions fused = Options(32, 4, 8, 0.5, 1);
  fused.passthrough_heads = {2};
  CompressOptions floor = Options(32, 4, 8, 0.5, 2);
  floor.min_similarity = 0.2;
  const CompressOptions variants[] = {fused, floor,
                                      StaticFp8Result(fused, DType::kFp8E4M3, 3, false)};
  for (const DType format : kFormats) {
    const RandomLayer source = RandomLayer::Generate(Spec(3, 300, 8, 8, 51));
    const uint8_t nan = format == DType::kFp8E4M3 ? 0x7f : 0x7e;
    const uint8_t largest = format == DType::kFp8E4M3 ? 0x7e : 0x7b;
    for (const Placement& at : placements) {
      for (const CompressOptions& options : variants) {
        for (const bool overflow : {false, true}) {
          SCOPED_TRACE(std::string(at.name) + " " + std::string(DTypeName(format)) +
                       (overflow ? " overflowing scale" : " NaN code") + " result " +
                       std::string(DTypeName(options.result_dtype)));
          Fp8Layer layer = Fp8Layer::From(source, format);
          if (overflow) {  // only this element overflows: the others' codes are small
            std::vector<float>& scales = at.key ? layer.key_scales : layer.value_scales;
            scales[at.head] = 1.0e36f;
            for (int32_t t = 0; t < 300; ++t) {
              for (int32_t j = 0; j < 8; ++j) {
                if (at.key) {
                  layer.SetKeyCode(at.head, t, j, static_cast<uint8_t>(1 + (t + j) % 8));
                } else {
                  layer.SetValueCode(at.head, t, j, static_cast<uint8_t>(1 + (t + j) % 8));
                }
              }
            }
          }
          const uint8_t code = overflow ? largest : nan;
          if (at.key) {
            layer.SetKeyCode(at.head, at.token, at.dim, code);
          } else {
            layer.SetValueCode(at.head, at.token, at.dim, code);
          }
          const absl::Status expected = reference_.Compress(layer.Fp8View(), options).status();
          ASSERT_EQ(expected.code(), absl::StatusCode::kInvalidArgument) << expected;
          EXPECT_EQ(engine_.Compress(layer.Fp8View(), options).status(), expected);
          EXPECT_EQ(engine_.CompressInto(layer.Fp8View(), options, &reused_), expected);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuEngineFp8Test, ::testing::ValuesIn(SupportedSimdLevels()),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(SimdLevelName(info.param));
                         });

}  // namespace
}  // namespace centroidkv::cpu
