// The conformance suite every ClusterEngine backend must pass (SPEC.md section 2), one
// TEST_P suite instantiated per backend kind: the golden cases, properties on seeded random
// and drawn layers of many shapes, agreement with the reference engine, determinism,
// concurrency, layouts, dtypes and options. The hand-made cases whose result follows from the
// SPEC by hand are in engine_conformance_handmade_test.cc, the shared machinery in
// engine_conformance.h. The INSTANTIATE lines at the end of this file are the suite's only
// ones: gtest applies them to every TEST_P of EngineConformanceTest, whichever file defines
// it. A new backend adds one INSTANTIATE line here.
// The gpu backend's cases skip, with a message saying so, where there is no CUDA device; the
// CUDA backend's algorithm also runs everywhere as its host twin (cuda::HostPipelineEngine).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "tests/kernels/engine_conformance.h"
#include "tests/kernels/reference_agreement.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::conformance {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;

TEST_P(EngineConformanceTest, GoldenCases) {
  const std::vector<std::string> names = test::ListGoldenCases();
  ASSERT_FALSE(names.empty()) << "no golden cases under " << test::GoldenRoot();
  for (const std::string& name : names) {
    SCOPED_TRACE("golden case " + name);
    absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    const LayerView layer = test::GoldenLayerView(*golden);
    CompressResult result;
    ASSERT_NO_FATAL_FAILURE(Run(layer, golden->options, &result));
    test::ExpectMatchesGolden(*golden, result);
    ExpectInvariants(layer, golden->options, result);
  }
}

TEST_P(EngineConformanceTest, RandomLayersSatisfyInvariants) {
  for (const RandomCase& c : RandomCases()) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    CompressResult result;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &result));
    ExpectInvariants(layer.view(), c.options, result);
  }
}

// The engine under test against the reference engine: every backend but the reference
// itself (comparing it with itself proves nothing).
class EngineAgreementTest : public EngineConformanceTest {};

TEST_P(EngineAgreementTest, RandomLayersMatchReference) {
  for (const RandomCase& c : RandomCases()) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    // Identical decisions, or a divergence traced to genuine near ties (and reported).
    test::ExpectAgreesWithReference(*engine_, *reference_, layer.view(), c.options,
                                    kEngineRelTolerance);
  }
}

// Shapes and options drawn at random (a fixed seed, printed on failure): the invariants
// hold and the result agrees with the reference engine (for the reference, the invariants).
TEST_P(EngineConformanceTest, DrawnJobsSatisfyInvariantsAndMatchReference) {
  constexpr uint64_t kSeed = 0x5eed2025;
  constexpr int kJobs = 150;
  std::mt19937_64 rng(kSeed);
  int merged_jobs = 0;
  for (int i = 0; i < kJobs; ++i) {
    const RandomCase c = DrawCase(rng, i);
    SCOPED_TRACE(c.name + " (generator seed " + std::to_string(kSeed) + "): " + c.spec.ToString() +
                 "; " + Describe(c.options));
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    CompressResult actual;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &actual));
    ExpectInvariants(layer.view(), c.options, actual);
    if (engine_ != reference_) {
      test::ExpectAgreesWithReference(*engine_, *reference_, layer.view(), c.options,
                                      kEngineRelTolerance);
    }
    merged_jobs += actual.passes_run > 0 ? 1 : 0;
  }
  // The generator must keep producing jobs that actually merge.
  EXPECT_GE(merged_jobs, kJobs / 3);
}

TEST_P(EngineConformanceTest, IsDeterministic) {
  const RandomCase cases[] = {
      {"ClusteredFloor", Clustered(WithCounts(Spec(3, 700, 32, 16, 101)), 5, 0.1),
       Opts().Floor(0.9, 0.01).Chunk(64).Protect(4, 16)},
      {"Independent", Spec(2, 1500, 16, 16, 102), Opts().Chunk(128)}};
  for (const RandomCase& c : cases) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    CompressResult first, second;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &first));
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &second));
    ExpectBitIdentical(first, second);
  }
}

TEST_P(EngineConformanceTest, ConcurrentCallsAgree) {
  const RandomLayerSpec spec = Clustered(WithCounts(Spec(2, 600, 16, 16, 103)), 6, 0.1);
  SCOPED_TRACE(spec.ToString());
  const RandomLayer layer = RandomLayer::Generate(spec);
  const CompressOptions options = Opts().Chunk(32).Protect(4, 8);
  CompressResult serial;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &serial));
  std::vector<absl::StatusOr<CompressResult>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&] { result = engine_->Compress(layer.view(), options); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectBitIdentical(serial, *result);
  }
}

TEST_P(EngineConformanceTest, LayoutsAgree) {
  const RandomCase cases[] = {
      {"Counts", WithCounts(Spec(3, 500, 16, 24, 104)), Opts().Chunk(32).Protect(4, 8)},
      {"ClusteredFloorRagged", Clustered(Spec(4, 300, 8, 8, 105), 4, 0.2),
       Opts().Floor(0.9).Uniform(false).Chunk(16).Protect(2, 2)},
      {"Fp16", Stored(Spec(2, 256, 32, 32, 106), DType::kFloat16, TensorLayout::kHeadMajor),
       Opts().Chunk(64).Protect(0, 0)}};
  for (const RandomCase& c : cases) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer head_major = RandomLayer::Generate(c.spec);
    const RandomLayer token_major = head_major.WithLayout(TensorLayout::kTokenMajor);
    ASSERT_EQ(token_major.view().layout, TensorLayout::kTokenMajor);
    CompressResult from_head_major, from_token_major;
    ASSERT_NO_FATAL_FAILURE(Run(head_major.view(), c.options, &from_head_major));
    ASSERT_NO_FATAL_FAILURE(Run(token_major.view(), c.options, &from_token_major));
    ExpectBitIdentical(from_head_major, from_token_major);
  }
}

// fp16/bf16 inputs are widened on load: the same job on the widened float32 values gives the
// same result (up to the backend's float rounding).
TEST_P(EngineConformanceTest, HalfPrecisionMatchesWidenedFloat) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const RandomLayerSpec spec = Stored(Clustered(WithCounts(Spec(2, 700, 64, 32, 107)), 6, 0.1),
                                        dtype, TensorLayout::kHeadMajor);
    SCOPED_TRACE(spec.ToString());
    const RandomLayer narrow = RandomLayer::Generate(spec);
    const RandomLayer widened = narrow.WithDType(DType::kFloat32);
    ASSERT_EQ(widened.Key(1, 5, 3), narrow.Key(1, 5, 3));
    const CompressOptions options = Opts().Chunk(64).Protect(4, 16).Floor(0.5, 0.1);
    CompressResult from_narrow, from_widened;
    ASSERT_NO_FATAL_FAILURE(Run(narrow.view(), options, &from_narrow));
    ASSERT_NO_FATAL_FAILURE(Run(widened.view(), options, &from_widened));
    test::ExpectResultsNear(from_widened, from_narrow, kEngineRelTolerance);
    EXPECT_EQ(from_narrow.passes_run, from_widened.passes_run);
  }
}

TEST_P(EngineConformanceTest, NothingToMergeReturnsTheInput) {
  const RandomCase cases[] = {
      {"RatioOne", WithCounts(Spec(2, 64, 8, 8, 108)), Opts().Ratio(1.0).Protect(0, 0)},
      {"TargetAboveTokens", Spec(2, 64, 8, 8, 109), Opts().Tokens(65).Protect(0, 0)},
      {"EverythingProtected", Spec(2, 64, 8, 8, 110), Opts().Protect(32, 32)},
      {"OneCompressibleEntry", Spec(2, 64, 8, 8, 111), Opts().Protect(30, 33)},
      {"FloorAboveEveryScore", Spec(2, 64, 8, 8, 112), Opts().Floor(1.0).Protect(0, 0)},
      {"AllPassthrough", Spec(3, 64, 8, 8, 113), Opts().Passthrough({0, 1, 2}).Protect(0, 0)},
      {"OneToken", Stored(Spec(2, 1, 8, 8, 114), DType::kBFloat16, TensorLayout::kTokenMajor),
       Opts().Protect(0, 0).Chunk(2)}};
  for (const RandomCase& c : cases) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    CompressResult result;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), c.options, &result));
    ASSERT_TRUE(ExpectWellFormed(layer.view(), c.options, result));
    EXPECT_EQ(result.passes_run, 0);
    const int32_t n = c.spec.num_tokens;
    int reported = 0;
    for (int32_t h = 0; h < c.spec.num_heads; ++h) {
      ASSERT_EQ(result.offsets[h + 1] - result.offsets[h], n) << "head " << h;
      for (int32_t i = 0; i < n; ++i) ExpectUntouched(layer.view(), result, h, i, i, &reported);
    }
  }
}

TEST_P(EngineConformanceTest, AssignmentIsOptional) {
  const RandomLayerSpec spec = WithCounts(Spec(2, 300, 16, 8, 115));
  const RandomLayer layer = RandomLayer::Generate(spec);
  CompressOptions options = Opts().Chunk(32).Protect(4, 8);
  CompressResult with, without;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &with));
  options.compute_assignment = false;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &without));
  EXPECT_TRUE(without.assignment.empty());
  ASSERT_FALSE(with.assignment.empty());
  with.assignment.clear();
  ExpectBitIdentical(with, without);
}

// Rows asked for in fp16 / bf16 (CompressOptions::result_dtype) are the float32 rows rounded
// once to nearest even, whether the backend writes them itself (the GPU) or rounds after
// (RoundResultRows); Compress and CompressInto alike. Plain passes, a rising floor, and a
// floor above every score (nothing merges: the GPU's early-stop output path).
TEST_P(EngineConformanceTest, HalfResultRowsAreTheFloatRowsRoundedOnce) {
  const RandomLayer layer = RandomLayer::Generate(WithCounts(Spec(3, 400, 24, 12, 116)));
  const CompressOptions cases[] = {Opts().Chunk(48).Protect(4, 8).Passthrough({1}),
                                   Opts().Chunk(32).Protect(2, 6).Floor(0.3, 0.2),
                                   Opts().Chunk(32).Floor(1.0)};
  for (const CompressOptions& base : cases) {
    CompressResult floats;
    ASSERT_NO_FATAL_FAILURE(Run(layer.view(), base, &floats));
    ASSERT_EQ(floats.dtype, DType::kFloat32);
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)));
      CompressOptions options = base;
      options.result_dtype = dtype;
      CompressResult expected = floats;
      RoundResultRows(dtype, &expected);
      ASSERT_FALSE(expected.half_keys.empty());
      CompressResult half;
      ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &half));
      EXPECT_TRUE(half.keys.empty() && half.values.empty());
      ExpectBitIdentical(expected, half);
      CompressResult reused = floats;  // CompressInto over an earlier float32 result
      ASSERT_TRUE(engine_->CompressInto(layer.view(), options, &reused).ok());
      ExpectBitIdentical(expected, reused);
    }
  }
}

// Rows into caller memory (CompressControl::row_target, what the service passes for a
// client's shared memory output region): a backend that writes rows in place puts exactly the
// rows Compress returns there, in the result dtype, and writes no byte past them; the rest
// of the result is unchanged. Jobs that a stage above the backend reshapes (padding,
// token-major rows, exact_target's second stage) and backends that cannot write in place
// leave the target untouched and return their rows as usual. CompressInto over an earlier result alike.
TEST_P(EngineConformanceTest, RowsGoToTheCallersMemoryWhenTheBackendWritesInPlace) {
  const RandomLayer float_layer = RandomLayer::Generate(WithCounts(Spec(3, 300, 24, 12, 117)));
  const RandomLayer half_layer = RandomLayer::Generate(
      Stored(WithCounts(Spec(2, 260, 16, 20, 118)), DType::kFloat16, TensorLayout::kTokenMajor));
  CompressOptions with_assignment = Opts().Chunk(48).Protect(4, 8).Passthrough({1});
  with_assignment.compute_assignment = true;
  CompressOptions padded = Opts().Chunk(32);
  padded.pad_heads = true;
  CompressOptions token_major = Opts().Chunk(32);
  token_major.output_layout = TensorLayout::kTokenMajor;
  CompressOptions exact = Opts().Chunk(32).Tokens(50);  // the protected rows exceed t
  exact.exact_target = true;
  CompressOptions exact_by_passes = Opts().Chunk(32).Tokens(50).Protect(0, 0);
  exact_by_passes.exact_target = true;  // the passes reach t: a plain job
  struct Case {
    const char* name;
    const RandomLayer* layer;
    CompressOptions options;
    bool reshaped;  // a stage above the backend rearranges the rows
  };
  const Case cases[] = {{"plain", &float_layer, with_assignment, false},
                        {"nothing merges", &float_layer, Opts().Chunk(32).Floor(1.0), false},
                        {"fp16 token-major input", &half_layer, Opts().Chunk(64), false},
                        {"pad_heads", &float_layer, padded, true},
                        {"token-major rows", &float_layer, token_major, true},
                        {"exact_target", &float_layer, exact, true},
                        {"exact_target the passes reach", &float_layer, exact_by_passes, false}};
  for (const Case& c : cases) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(c.name) + ", rows in " + std::string(DTypeName(dtype)));
      const LayerView layer = c.layer->view();
      CompressOptions options = c.options;
      options.result_dtype = dtype;
      CompressResult expected;
      ASSERT_NO_FATAL_FAILURE(Run(layer, options, &expected));
      // A target of H * n rows of each tensor (the most a job returns), filled with a marker.
      constexpr uint8_t kMarker = 0xa5;
      const size_t element = DTypeSize(dtype);
      const size_t rows = static_cast<size_t>(layer.num_heads) * layer.num_tokens;
      std::vector<uint8_t> key_memory(rows * layer.key_dim * element, kMarker);
      std::vector<uint8_t> value_memory(rows * layer.value_dim * element, kMarker);
      const ResultRowTarget target{key_memory.data(), key_memory.size(), value_memory.data(),
                                   value_memory.size()};
      CompressControl control;
      control.row_target = &target;
      CompressResult actual = expected;  // CompressInto over an earlier result
      ASSERT_TRUE(engine_->CompressInto(layer, options, &actual, control).ok());
      const bool in_place = engine_->caps().writes_rows_in_place && !c.reshaped;
      ASSERT_EQ(actual.rows_in_target, in_place);
      const size_t key_bytes = expected.key_elements() * element;
      const size_t value_bytes = expected.value_elements() * element;
      if (in_place) {
        EXPECT_EQ(actual.key_elements(), expected.key_elements());
        EXPECT_EQ(actual.value_elements(), expected.value_elements());
        EXPECT_TRUE(actual.keys.empty() && actual.half_keys.empty() && actual.values.empty() &&
                    actual.half_values.empty());
        // The target's rows as the result's arrays: then every field is bit-identical.
        auto take = [&](const std::vector<uint8_t>& memory, size_t bytes, std::vector<float>* f,
                        std::vector<uint16_t>* h) {
          if (dtype == DType::kFloat32) {
            f->resize(bytes / sizeof(float));
            std::memcpy(f->data(), memory.data(), bytes);
          } else {
            h->resize(bytes / sizeof(uint16_t));
            std::memcpy(h->data(), memory.data(), bytes);
          }
        };
        take(key_memory, key_bytes, &actual.keys, &actual.half_keys);
        take(value_memory, value_bytes, &actual.values, &actual.half_values);
        actual.rows_in_target = false;
      }
      ExpectBitIdentical(expected, actual);
      // Not one byte written past the rows (nor any at all when not in place).
      const size_t key_written = in_place ? key_bytes : 0;
      const size_t value_written = in_place ? value_bytes : 0;
      EXPECT_EQ(std::count(key_memory.begin() + static_cast<std::ptrdiff_t>(key_written),
                           key_memory.end(), kMarker),
                static_cast<std::ptrdiff_t>(key_memory.size() - key_written));
      EXPECT_EQ(std::count(value_memory.begin() + static_cast<std::ptrdiff_t>(value_written),
                           value_memory.end(), kMarker),
                static_cast<std::ptrdiff_t>(value_memory.size() - value_written));
    }
  }
}

// A target that cannot hold H * n rows is refused before the backend writes anything (a
// backend that never writes in place ignores it and returns its rows as usual).
TEST_P(EngineConformanceTest, RowTargetTooSmallIsAnInternalError) {
  const RandomLayer layer = RandomLayer::Generate(Spec(2, 128, 8, 8, 119));
  std::vector<float> keys(2 * 128 * 8 - 1), values(2 * 128 * 8);
  const ResultRowTarget target{keys.data(), keys.size() * sizeof(float), values.data(),
                               values.size() * sizeof(float)};
  CompressControl control;
  control.row_target = &target;
  CompressResult result;
  const absl::Status status =
      engine_->CompressInto(layer.view(), Opts().Chunk(32), &result, control);
  if (engine_->caps().writes_rows_in_place) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  } else {
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_FALSE(result.rows_in_target);
    EXPECT_EQ(result.keys.size(), static_cast<size_t>(result.total_entries()) * 8);
  }
  EXPECT_EQ(std::count(keys.begin(), keys.end(), 0.0f), static_cast<std::ptrdiff_t>(keys.size()));
}

// The suite's only instantiations (they cover the TEST_Ps of every file of the suite).

// The test name of a backend: Reference, Cpu, Cuda (the CUDA device; skipped with "no CUDA
// device: ..." where there is none) or CudaStagesOnHost (the CUDA backend's stages run on
// the host: the GPU algorithm, checked on every machine).
std::string BackendTestName(const ::testing::TestParamInfo<Backend>& info) {
  if (info.param.cuda_stages_on_host) return "CudaStagesOnHost";
  if (info.param.cpu_int16_every_chunk && info.param.cpu_level == cpu::SimdLevel::kAvx512) {
    return "CpuAvx512Int16";
  }
  if (info.param.cpu_level == cpu::SimdLevel::kAvx2) return "CpuAvx2";
  switch (info.param.kind) {
    case BackendKind::kReference:
      return "Reference";
    case BackendKind::kCpu:
      return "Cpu";
    case BackendKind::kCuda:
      return "Cuda";
    default:
      return std::string(BackendKindName(info.param.kind));
  }
}

constexpr Backend kReferenceBackend{BackendKind::kReference};
constexpr Backend kCpuBackend{BackendKind::kCpu};
constexpr Backend kCudaBackend{BackendKind::kCuda};
constexpr Backend kCudaStagesOnHost{BackendKind::kCuda, true};
// The cpu backend's AVX2 level (integer matching) on any x86-64 that has it, also
// where the run-time choice is AVX-512 or AMX.
constexpr Backend kCpuAvx2{BackendKind::kCpu, false, cpu::SimdLevel::kAvx2};
// The AVX-512 level's int16 matching (VNNI vpdpwssd) at every chunk length: at run
// time it takes only chunks of kAvx512Int16MinChunk rows and more, and most cases here are
// shorter. Skipped on CPUs without AVX-512 VNNI.
constexpr Backend kCpuAvx512Int16{BackendKind::kCpu, false, cpu::SimdLevel::kAvx512, true};

INSTANTIATE_TEST_SUITE_P(Reference, EngineConformanceTest,
                         ::testing::Values(kReferenceBackend), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Cpu, EngineConformanceTest, ::testing::Values(kCpuBackend),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CpuAvx2, EngineConformanceTest, ::testing::Values(kCpuAvx2),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CpuAvx512Int16, EngineConformanceTest,
                         ::testing::Values(kCpuAvx512Int16), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Cuda, EngineConformanceTest, ::testing::Values(kCudaBackend),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CudaStagesOnHost, EngineConformanceTest,
                         ::testing::Values(kCudaStagesOnHost), BackendTestName);

// The agreement suite: every backend but the reference.
INSTANTIATE_TEST_SUITE_P(Cpu, EngineAgreementTest, ::testing::Values(kCpuBackend),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CpuAvx2, EngineAgreementTest, ::testing::Values(kCpuAvx2),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CpuAvx512Int16, EngineAgreementTest,
                         ::testing::Values(kCpuAvx512Int16), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Cuda, EngineAgreementTest, ::testing::Values(kCudaBackend),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(CudaStagesOnHost, EngineAgreementTest,
                         ::testing::Values(kCudaStagesOnHost), BackendTestName);

}  // namespace
}  // namespace centroidkv::conformance
