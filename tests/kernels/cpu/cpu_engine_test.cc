// Tests of kernels/cpu/cpu_engine.cc (and layer_job.cc, edge_decisions.cc): the CPU engine
// at every SIMD level this CPU supports returns exactly the reference engine's result, bit
// for bit: on random jobs of many shapes, on layers full of exact and near ties (where the
// float32 search cannot decide and the engine must rescore in float64), at the edges of the
// float range, with many passes (rows kept in float64 and compacted in place), and under
// concurrency and scratch reuse. The conformance suite (engine_conformance_test.cc) covers
// the SPEC properties and the golden cases through EngineSet.
#include "kernels/cpu/cpu_engine.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "kernels/cpu/layer_job.h"
#include "kernels/reference/reference_engine.h"
#include "oneapi/tbb/task_arena.h"
#include "oneapi/tbb/task_group.h"
#include "tests/kernels/cpu/cpu_engine_testing.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::cpu {
namespace {

using test::CompressOrFail;
using test::ExpectBitIdentical;
using test::Options;
using test::RandomLayer;
using test::RandomLayerSpec;
using test::Spec;

class CpuEngineTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  CpuEngineTest() : engine_({}, CpuEngineOptions{GetParam()}) {}

  void ExpectSameAsReference(const LayerView& layer, const CompressOptions& options) {
    const CompressResult expected = CompressOrFail(reference_, layer, options);
    const CompressResult actual = CompressOrFail(engine_, layer, options);
    ExpectBitIdentical(expected, actual);
  }

  ReferenceEngine reference_;
  CpuEngine engine_;
};

TEST_P(CpuEngineTest, UsesTheRequestedLevel) {
  EXPECT_EQ(engine_.simd_level(), GetParam());
  EXPECT_EQ(engine_.name(), "cpu");
}

struct Job {
  std::string name;
  RandomLayerSpec spec;
  CompressOptions options;
};

std::vector<Job> Jobs() {
  constexpr DType kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;
  constexpr TensorLayout kTokenMajor = TensorLayout::kTokenMajor;
  std::vector<Job> jobs = {
      {"Fp16Dim128Chunk256", Spec(2, 1100, 128, 64, 1, kF16), Options(256, 16, 64, 0.5, 1)},
      {"Bf16TokenMajorChunk64", Spec(3, 700, 64, 32, 2, kBF16, kTokenMajor),
       Options(64, 4, 32, 0.25)},
      {"OddDimsOddChunk", Spec(2, 501, 33, 9, 3), Options(7, 3, 5, 0.3)},
      {"Dim127Chunk33", Spec(2, 400, 127, 17, 4, kF16), Options(33, 0, 0, 0.2)},
      {"ChunkTwo", Spec(1, 301, 8, 8, 5), Options(2, 1, 2, 0.1)},
      {"Chunk4096", Spec(1, 4300, 16, 4, 6, kBF16), Options(4096, 16, 64, 0.5, 2)},
      {"Dim256", Spec(2, 300, 256, 8, 7), Options(100, 2, 2, 0.4)},
      {"Dim1", Spec(2, 200, 1, 3, 8), Options(16, 0, 0, 0.25)},
  };
  jobs[1].spec.with_counts = true;
  jobs[2].spec.with_counts = true;
  jobs[3].spec.prototypes = 4;
  jobs[3].spec.noise = 0.02;
  // A floor (exact decisions at the floor, ragged heads), uniform heads with passthrough.
  Job floor{"FloorRagged", Spec(4, 400, 16, 16, 9), Options(32, 4, 8, 0.2)};
  floor.spec.prototypes = 6;
  floor.spec.noise = 0.15;
  floor.options.min_similarity = 0.95;
  floor.options.tighten_per_pass = 0.005;
  floor.options.uniform_heads = false;
  jobs.push_back(floor);
  Job passthrough{"FloorPassthroughUniform", Spec(4, 300, 8, 8, 10), Options(32, 4, 8, 0.25)};
  passthrough.spec.prototypes = 4;
  passthrough.spec.noise = 0.2;
  passthrough.options.min_similarity = 0.9;
  passthrough.options.passthrough_heads = {3};
  jobs.push_back(passthrough);
  // Top r below the candidates (the selection step), with many passes.
  Job select{"TopRAcrossChunks", Spec(2, 900, 24, 12, 11), Options(64, 8, 16, 0.1)};
  select.options.target_ratio.reset();
  select.options.target_tokens = 500;
  jobs.push_back(select);
  // The same decisions with chunks long enough for a matrix engine (its wider bound, its
  // near-tie lists): clustered keys, a floor, top r across chunks, several passes.
  Job long_floor{"FloorChunk256", Spec(3, 1500, 64, 16, 12, kF16), Options(256, 4, 8, 0.2)};
  long_floor.spec.prototypes = 5;
  long_floor.spec.noise = 0.01;
  long_floor.options.min_similarity = 0.99;
  long_floor.options.tighten_per_pass = 0.0005;
  jobs.push_back(long_floor);
  Job long_select{"TopRChunk512", Spec(2, 2100, 32, 8, 13, kBF16), Options(512, 8, 16, 0.1)};
  long_select.spec.prototypes = 3;
  long_select.spec.noise = 0.003;
  long_select.options.target_ratio.reset();
  long_select.options.target_tokens = 900;
  jobs.push_back(long_select);
  return jobs;
}

TEST_P(CpuEngineTest, BitIdenticalToReferenceOnRandomJobs) {
  for (const Job& job : Jobs()) {
    SCOPED_TRACE(job.name + ": " + job.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(job.spec);
    ExpectSameAsReference(layer.view(), job.options);
  }
}

// Result rows in fp16 / bf16, which the engine rounds as it streams them out (BlockWriter,
// KernelTable::stream_halves): the reference's float32 rows rounded once (RoundResultRows),
// bit for bit, through Compress and through CompressInto over the float32 result of the
// same job. The jobs include chunks of 256 and more (the AMX level's matrix path).
TEST_P(CpuEngineTest, HalfRowsBitIdenticalToReferenceOnRandomJobs) {
  EXPECT_TRUE(engine_.caps().WritesResultDType(DType::kFloat16));
  EXPECT_TRUE(engine_.caps().WritesResultDType(DType::kBFloat16));
  for (const Job& job : Jobs()) {
    SCOPED_TRACE(job.name + ": " + job.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(job.spec);
    const CompressResult floats = CompressOrFail(reference_, layer.view(), job.options);
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)));
      CompressOptions options = job.options;
      options.result_dtype = dtype;
      CompressResult expected = floats;
      RoundResultRows(dtype, &expected);
      ExpectBitIdentical(expected, CompressOrFail(engine_, layer.view(), options));
      CompressResult reused = floats;
      ASSERT_TRUE(engine_.CompressInto(layer.view(), options, &reused).ok());
      ExpectBitIdentical(expected, reused);
    }
  }
}

// Many passes: the first merge writes float64 rows, later passes compact them in place.
TEST_P(CpuEngineTest, BitIdenticalOverManyPasses) {
  for (int32_t chunk : {3, 16, 64}) {
    RandomLayerSpec spec = Spec(3, 800, 16, 24, 20 + chunk);
    spec.with_counts = true;
    spec.prototypes = 5;
    spec.noise = 0.1;
    SCOPED_TRACE("chunk " + std::to_string(chunk) + ": " + spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(spec);
    CompressOptions options = Options(chunk, 4, 8, 0.05, 8);
    options.uniform_heads = chunk != 16;
    ExpectSameAsReference(layer.view(), options);
  }
}

// Exact duplicates and rows one float ulp apart: every argmax, floor and top-r decision is a
// tie or a near tie, which the float search cannot decide on its own.
TEST_P(CpuEngineTest, BitIdenticalOnTiesAndNearTies) {
  RandomLayer layer = RandomLayer::Generate(Spec(2, 600, 32, 8, 30));
  for (int32_t h = 0; h < 2; ++h) {
    for (int32_t t = 0; t < 600; ++t) {
      const int32_t prototype = (t * 7) % 5;
      for (int32_t j = 0; j < 32; ++j) {
        float x = static_cast<float>(((prototype + 1) * (j + 3)) % 11) - 5.0f;
        if (t % 3 == 1) x = std::nextafter(x, 100.0f);  // one ulp away
        if (t % 7 == 2) x *= 2.0f;                      // parallel: exactly cosine 1
        layer.SetKey(h, t, j, x);
      }
    }
  }
  for (double ratio : {0.5, 0.3, 0.1}) {
    for (int32_t chunk : {8, 31, 256}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + ", chunk " + std::to_string(chunk));
      CompressOptions options = Options(chunk, 2, 4, ratio);
      ExpectSameAsReference(layer.view(), options);
      options.min_similarity = 1.0;  // only exact duplicates (or parallels) qualify
      ExpectSameAsReference(layer.view(), options);
    }
  }
}

// All-zero keys: every score is 0, so every source of a chunk of 4096 goes to its first
// destination (2048 merge terms for one row).
TEST_P(CpuEngineTest, BitIdenticalWhenEverySourceTies) {
  RandomLayer layer = RandomLayer::Generate(Spec(1, 4200, 4, 3, 31));
  for (int32_t t = 0; t < 4200; ++t) {
    for (int32_t j = 0; j < 4; ++j) layer.SetKey(0, t, j, 0.0f);
  }
  ExpectSameAsReference(layer.view(), Options(4096, 0, 0, 0.5, 1));
  ExpectSameAsReference(layer.view(), Options(4096, 0, 0, 0.3, 2));
}

// Keys whose float sum of squares overflows or whose norm clamps at 1e-6, and values whose
// means are subnormal or whose float sums overflow.
TEST_P(CpuEngineTest, BitIdenticalAtTheEdgesOfFloat) {
  RandomLayer layer = RandomLayer::Generate(Spec(2, 300, 20, 20, 32));
  for (int32_t t = 0; t < 300; ++t) {
    const float key_scale = t % 5 == 0 ? 1e30f : t % 5 == 1 ? 1e-30f : 1.0f;
    const float value_scale = t % 4 == 0 ? 3e38f : t % 4 == 1 ? 3e-38f : 1.0f;
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t j = 0; j < 20; ++j) {
        const float base = static_cast<float>((t * 13 + j * 7 + h) % 17) / 17.0f;
        layer.SetKey(h, t, j, key_scale * (base - 0.4f));
        layer.SetValue(h, t, j, value_scale * (j % 2 == 0 ? base : 0.9f + base / 10));
      }
    }
  }
  ExpectSameAsReference(layer.view(), Options(16, 2, 2, 0.5, 1));
  ExpectSameAsReference(layer.view(), Options(16, 2, 2, 0.2, 4));
}

// Two sources of one destination whose scores are equal in float but not in double: the
// reference sums the higher-scored source first, and here the order changes the sum
// (1 - 2^53 + 2^53 = 1, but 1 + 2^53 - 2^53 = 0 in double).
TEST_P(CpuEngineTest, SumsSourcesInTheReferenceOrder) {
  RandomLayer layer = RandomLayer::Generate(Spec(1, 3, 2, 1, 35));
  const float key_x[3] = {1.0f, 1.0f, 1.0f}, key_y[3] = {1e-4f, 0.0f, 0.99e-4f};
  const float values[3] = {0x1p53f, 1.0f, -0x1p53f};
  for (int32_t t = 0; t < 3; ++t) {
    layer.SetKey(0, t, 0, key_x[t]);
    layer.SetKey(0, t, 1, key_y[t]);
    layer.SetValue(0, t, 0, values[t]);
  }
  CompressOptions options = Options(3, 0, 0, 0.3, 1);
  const CompressResult expected = CompressOrFail(reference_, layer.view(), options);
  ASSERT_EQ(expected.values.size(), 1u);
  EXPECT_EQ(expected.values[0], static_cast<float>(1.0 / 3.0));
  ExpectSameAsReference(layer.view(), options);
}

TEST_P(CpuEngineTest, NothingToMergeReturnsTheInput) {
  const RandomLayer layer =
      RandomLayer::Generate(Spec(2, 64, 8, 8, 33, DType::kBFloat16, TensorLayout::kTokenMajor));
  ExpectSameAsReference(layer.view(), Options(8, 32, 32, 0.5));
  ExpectSameAsReference(layer.view(), Options(8, 0, 0, 1.0));
}

// The engine checks its input itself (EngineCaps::checks_layer_data), chunk by chunk as it reads it: a
// NaN or Inf anywhere (a chunk's key or value, a protected row, a passthrough head, a head
// with nothing to do, a job that merges nothing, a job of three passes, whose chunks' values
// are checked in the result rows) and bad counts give the reference's error.
TEST_P(CpuEngineTest, RejectsBadDataAsTheReferenceDoes) {
  struct Placement {
    const char* name;
    bool key;
    int32_t head, token, dim;
  };
  // H=3, n=300, sink 4, recent 8, chunk 32: token 40 is in a chunk, 2 a sink, 297 recent;
  // in a chunk, odd offsets (41) are destinations and even ones (44) sources merged into them.
  const Placement placements[] = {{"ChunkKey", true, 1, 40, 3},    {"ChunkValue", false, 0, 41, 5},
                                  {"ChunkSourceValue", false, 1, 44, 7},
                                  {"LastChunkKey", true, 2, 291, 0}, {"SinkKey", true, 0, 2, 1},
                                  {"RecentValue", false, 2, 297, 6}, {"PassthroughKey", true, 2, 50, 7}};
  const float bad[] = {std::nanf(""), -__builtin_huge_valf()};
  struct Variant {
    const char* name;
    CompressOptions options;
  };
  std::vector<Variant> variants = {{"Fused", Options(32, 4, 8, 0.5, 1)},
                                   {"Floor", Options(32, 4, 8, 0.5, 2)},
                                   {"NothingToDo", Options(32, 4, 8, 1.0)},
                                   {"NoMergesUniform", Options(32, 4, 8, 0.5)},
                                   {"ThreePasses", Options(32, 4, 8, 0.2, 3)}};
  variants[0].options.passthrough_heads = {2};
  variants[1].options.min_similarity = 0.2;
  variants[1].options.passthrough_heads = {2};
  variants[3].options.recent_tokens = 299;  // one compressible entry: no head merges
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (TensorLayout layout : {TensorLayout::kHeadMajor, TensorLayout::kTokenMajor}) {
      for (const Placement& at : placements) {
        for (const Variant& variant : variants) {
          for (float value : bad) {
            SCOPED_TRACE(std::string(at.name) + " " + variant.name + " " + std::string(DTypeName(dtype)) +
                         " " + std::string(TensorLayoutName(layout)) + " " + std::to_string(value));
            RandomLayer layer = RandomLayer::Generate(Spec(3, 300, 8, 8, 77, dtype, layout));
            if (at.key) {
              layer.SetKey(at.head, at.token, at.dim, value);
            } else {
              layer.SetValue(at.head, at.token, at.dim, value);
            }
            const absl::Status expected =
                reference_.Compress(layer.view(), variant.options).status();
            ASSERT_EQ(expected.code(), absl::StatusCode::kInvalidArgument) << expected;
            EXPECT_EQ(engine_.Compress(layer.view(), variant.options).status(), expected);
            CompressResult reused;
            EXPECT_EQ(engine_.CompressInto(layer.view(), variant.options, &reused), expected);
          }
        }
      }
    }
  }
  for (uint32_t count : {0u, 0xffffffffu}) {
    RandomLayer layer = RandomLayer::Generate(Spec(3, 300, 8, 8, 78));
    layer.SetKey(2, 100, 0, std::nanf(""));  // after the count in (head, token) order
    layer.SetCount(1, 250, count);
    const CompressOptions options = Options(32, 4, 8, 0.5, 1);
    const absl::Status expected = reference_.Compress(layer.view(), options).status();
    ASSERT_EQ(expected.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_EQ(engine_.Compress(layer.view(), options).status(), expected);
  }
}

// fp16 / bf16 result rows: the engine notes, per tensor, whether a rounding made a finite
// value Inf (CompressResult::key_rounding / value_rounding, what the service then need not
// read the rows again for), and its verdict is what reading the rows gives: values around
// fp16's edge (65504 .. 65520 and past it, alone and merged, in chunks and protected rows).
// A reused result keeps no earlier verdict: float32 rows and the reference's rows carry none.
TEST_P(CpuEngineTest, NotesWhetherRoundingTheRowsMadeAnInf) {
  using Check = CompressResult::RoundingCheck;
  auto any_inf = [](const std::vector<uint16_t>& rows, DType dtype) {
    const uint16_t exponent = dtype == DType::kFloat16 ? 0x7c00u : 0x7f80u;
    for (uint16_t bits : rows) {
      if ((bits & exponent) == exponent) return true;
    }
    return false;
  };
  CompressResult reused;
  int overflows = 0, jobs = 0;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (float edge : {65504.0f, 65519.0f, 65520.0f, 70000.0f, 3.4e38f}) {
      for (int32_t token : {1, 40, 41, 299}) {  // a sink, a source, a destination, recent
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " value " + std::to_string(edge) +
                     " at token " + std::to_string(token));
        RandomLayer layer = RandomLayer::Generate(Spec(2, 300, 8, 8, 91));
        layer.SetValue(1, token, 3, edge);
        layer.SetValue(1, token ^ 1, 3, edge);  // its pair too: a merged row keeps the edge
        CompressOptions options = Options(32, 4, 8, 0.5, 1);
        options.result_dtype = dtype;
        ASSERT_TRUE(engine_.CompressInto(layer.view(), options, &reused).ok());
        ASSERT_EQ(reused.dtype, dtype);
        EXPECT_EQ(reused.key_rounding, Check::kFits);
        EXPECT_EQ(reused.value_rounding,
                  any_inf(reused.half_values, dtype) ? Check::kOverflows : Check::kFits);
        overflows += reused.value_rounding == Check::kOverflows ? 1 : 0;
        ++jobs;
      }
    }
  }
  EXPECT_GT(overflows, 0);  // the cases hold both verdicts
  EXPECT_LT(overflows, jobs);
  const RandomLayer layer = RandomLayer::Generate(Spec(2, 300, 8, 8, 92));
  ASSERT_TRUE(engine_.CompressInto(layer.view(), Options(32, 4, 8, 0.5, 1), &reused).ok());
  EXPECT_EQ(reused.key_rounding, Check::kNotChecked);
  EXPECT_EQ(reused.value_rounding, Check::kNotChecked);
  CompressOptions half = Options(32, 4, 8, 0.5, 1);
  half.result_dtype = DType::kFloat16;
  ASSERT_TRUE(engine_.CompressInto(layer.view(), half, &reused).ok());
  ASSERT_EQ(reused.value_rounding, Check::kFits);
  ASSERT_TRUE(reference_.CompressInto(layer.view(), half, &reused).ok());
  EXPECT_EQ(reused.key_rounding, Check::kNotChecked);
  EXPECT_EQ(reused.value_rounding, Check::kNotChecked);
}

// CompressInto overwrites whatever result it is given: one result reused over jobs of every
// shape and result dtype, with and without the assignment, equals the reference's fresh
// result each time.
TEST_P(CpuEngineTest, CompressIntoReusesAnyEarlierResult) {
  const std::vector<Job> jobs = Jobs();
  CompressResult reused;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& job = jobs[(i * 5 + round) % jobs.size()];
      CompressOptions options = job.options;
      options.compute_assignment = (i + round) % 3 != 0;
      constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
      options.result_dtype = kDTypes[(i + 2 * round) % 3];
      SCOPED_TRACE(job.name + (options.compute_assignment ? "" : " without assignment") + " " +
                   std::string(DTypeName(options.result_dtype)));
      const RandomLayer layer = RandomLayer::Generate(job.spec);
      const CompressResult expected = CompressOrFail(reference_, layer.view(), options);
      ASSERT_TRUE(engine_.CompressInto(layer.view(), options, &reused).ok());
      EXPECT_EQ(reused.num_heads, expected.num_heads);
      EXPECT_EQ(reused.num_tokens, expected.num_tokens);
      EXPECT_EQ(reused.key_dim, expected.key_dim);
      EXPECT_EQ(reused.value_dim, expected.value_dim);
      ExpectBitIdentical(expected, reused);
    }
  }
}

// The process's CPU time (every thread).
double ProcessCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// One chunk as long as the layer (32768 sources x 32768 destinations x 64 dims: seconds of
// matching at any level), cancelled 100 ms in by its flag and, separately, by its deadline:
// the engine returns CANCELLED having used at most 50 ms of CPU after the cancel, because
// the match kernels poll the job's control inside the chunk (StopCheck).
TEST_P(CpuEngineTest, CancelStopsTheCpuInsideAChunk) {
  EngineLimits limits;
  limits.max_chunk_size = 1 << 22;  // the largest a server accepts (--max-chunk-size)
  const CpuEngine engine(limits, CpuEngineOptions{GetParam()});
  const RandomLayer layer = RandomLayer::Generate(Spec(1, 65536, 64, 64, 31));
  CompressOptions options;
  options.chunk_size = 65536;
  options.sink_tokens = 0;
  options.recent_tokens = 0;
  for (const bool by_deadline : {false, true}) {
    SCOPED_TRACE(by_deadline ? "deadline" : "cancel flag");
    std::atomic<bool> cancelled{false};
    CompressControl control;
    control.cancelled = &cancelled;
    constexpr auto kRunFor = std::chrono::milliseconds(100);
    if (by_deadline) control.deadline = std::chrono::steady_clock::now() + kRunFor;
    absl::StatusOr<CompressResult> result;
    std::thread job([&] { result = engine.Compress(layer.view(), options, control); });
    std::this_thread::sleep_for(kRunFor);
    const double cpu_at_cancel = ProcessCpuSeconds();
    const auto wall_at_cancel = std::chrono::steady_clock::now();
    if (!by_deadline) cancelled.store(true);
    job.join();
    const double cpu_after = ProcessCpuSeconds() - cpu_at_cancel;
    const double wall_after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_at_cancel).count();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
    EXPECT_LT(cpu_after, 0.05) << "CPU seconds used after the cancel";
    EXPECT_LT(wall_after, 1.0) << "seconds to return after the cancel";
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuEngineTest, ::testing::ValuesIn(SupportedSimdLevels()),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           const std::string_view name = SimdLevelName(info.param);
                           return std::string(1, static_cast<char>(name[0] - 'a' + 'A')) +
                                  std::string(name.substr(1));
                         });

TEST(CpuEngineSetupTest, IsTheDefaultCpuBackend) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kAuto}) {
    absl::StatusOr<const ClusterEngine*> engine = engines->Select(kind);
    ASSERT_TRUE(engine.ok()) << engine.status();
    if (kind == BackendKind::kAuto && (*engine)->name().rfind("cuda", 0) == 0) continue;
    EXPECT_EQ((*engine)->name(), "cpu") << BackendKindName(kind);
  }
  absl::StatusOr<const ClusterEngine*> reference = engines->Select(BackendKind::kReference);
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ((*reference)->name(), "reference");
}

TEST(CpuEngineSetupTest, DefaultsToTheBestLevel) {
  EXPECT_EQ(CpuEngine().simd_level(), DetectSimdLevel());
}

// One engine, jobs of very different shapes in a row (its per-thread buffers grow and are
// reused): each result equals a fresh engine's.
TEST(CpuEngineSetupTest, ScratchIsReusedAcrossShapes) {
  const CpuEngine shared;
  const std::vector<Job> jobs = Jobs();
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& job = jobs[(i * 5 + round) % jobs.size()];
      SCOPED_TRACE(job.name);
      const RandomLayer layer = RandomLayer::Generate(job.spec);
      ExpectBitIdentical(CompressOrFail(CpuEngine(), layer.view(), job.options),
                         CompressOrFail(shared, layer.view(), job.options));
    }
  }
}

// Jobs running concurrently as tasks of one arena (as the server runs them).
TEST(CpuEngineSetupTest, ConcurrentJobsInOneArenaAgree) {
  const CpuEngine engine;
  const std::vector<Job> jobs = Jobs();
  std::vector<RandomLayer> layers;
  std::vector<CompressResult> serial;
  for (const Job& job : jobs) {
    layers.push_back(RandomLayer::Generate(job.spec));
    serial.push_back(CompressOrFail(engine, layers.back().view(), job.options));
  }
  std::vector<absl::StatusOr<CompressResult>> concurrent(2 * jobs.size());
  tbb::task_arena arena(2);
  arena.execute([&] {
    tbb::task_group group;
    for (size_t i = 0; i < concurrent.size(); ++i) {
      group.run([&, i] {
        const size_t j = i % jobs.size();
        concurrent[i] = engine.Compress(layers[j].view(), jobs[j].options);
      });
    }
    group.wait();
  });
  for (size_t i = 0; i < concurrent.size(); ++i) {
    SCOPED_TRACE(jobs[i % jobs.size()].name);
    ASSERT_TRUE(concurrent[i].ok()) << concurrent[i].status();
    ExpectBitIdentical(serial[i % jobs.size()], *concurrent[i]);
  }
}

TEST(CpuEngineSetupTest, CancelledJobStops) {
  const RandomLayer layer = RandomLayer::Generate(Spec(2, 500, 16, 16, 40));
  const CompressOptions options = Options(32, 4, 8, 0.25);
  absl::StatusOr<LayerPlan> plan = PlanLayer(layer.view(), options, EngineLimits{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::atomic<bool> cancelled{true};
  CompressControl control;
  control.cancelled = &cancelled;
  ScratchPool scratch;
  CompressResult out;
  LayerJob job(KernelsFor(DetectSimdLevel()), &scratch, *plan, layer.view(), control, &out);
  EXPECT_EQ(job.Run().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace centroidkv::cpu
