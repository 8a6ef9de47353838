// Shared machinery of the ClusterEngine conformance suite (SPEC.md section 2): tolerances,
// the engines under test, the fluent CompressOptions builder, the random case tables, the
// property checks derived from the SPEC and the inputs alone, and the value-parameterised
// fixture EngineConformanceTest. The TEST_Ps live in engine_conformance_test.cc (which also
// holds the one set of INSTANTIATE lines, one per backend) and
// engine_conformance_handmade_test.cc.
// Thread-compatible: plain functions that EXPECT, and a gtest fixture.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "kernels/cpu/simd_dispatch.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::conformance {

// Output rows against the count-weighted means computed here in double from the inputs:
// |row - mean| <= kMeanRelTolerance * max(1, count-weighted mean of |inputs|).
inline constexpr double kMeanRelTolerance = 1e-5;
// Keys/values of an engine against the reference engine on the same job.
inline constexpr double kEngineRelTolerance = 1e-5;
// Hand-made cases: small exact sums, so only float32 rounding of the result.
inline constexpr double kHandRelTolerance = 1e-6;
// Mismatches of one kind reported one by one per result.
inline constexpr int kMaxReported = 5;

// Every engine available here, created once.
const EngineSet& Engines();

// Fluent CompressOptions for compact case tables.
class Opts {
 public:
  Opts& Ratio(double rho) {
    o_.target_ratio = rho;
    o_.target_tokens.reset();
    return *this;
  }
  Opts& Tokens(int64_t t) {
    o_.target_tokens = t;
    o_.target_ratio.reset();
    return *this;
  }
  Opts& Chunk(int32_t c) {
    o_.chunk_size = c;
    return *this;
  }
  Opts& Protect(int32_t sink, int32_t recent) {
    o_.sink_tokens = sink;
    o_.recent_tokens = recent;
    return *this;
  }
  Opts& Floor(double tau, double delta = 0.0) {
    o_.min_similarity = tau;
    o_.tighten_per_pass = delta;
    return *this;
  }
  Opts& Passes(int32_t p) {
    o_.max_passes = p;
    return *this;
  }
  Opts& Uniform(bool uniform) {
    o_.uniform_heads = uniform;
    return *this;
  }
  Opts& Passthrough(std::vector<int32_t> heads) {
    o_.passthrough_heads = std::move(heads);
    return *this;
  }
  operator CompressOptions() const { return o_; }  // NOLINT: implicit by design

 private:
  CompressOptions o_;
};

// ---------------------------------------------------------------------------------------
// Random layer specs and case tables.

using test::Spec;  // a layer spec of the given shape and seed (float32, head-major)
// `spec` with per-entry counts.
test::RandomLayerSpec WithCounts(test::RandomLayerSpec spec);
// `spec` drawn around `prototypes` prototype rows with the given noise.
test::RandomLayerSpec Clustered(test::RandomLayerSpec spec, int32_t prototypes, double noise);
// `spec` stored as `dtype` in `layout`.
test::RandomLayerSpec Stored(test::RandomLayerSpec spec, DType dtype, TensorLayout layout);

struct RandomCase {
  std::string name;
  test::RandomLayerSpec spec;
  CompressOptions options;
};

// Shapes and options for the property tests, sized so that the float64 reference engine runs
// the whole table in a few seconds.
std::vector<RandomCase> RandomCases();

// The options in one line, for traces.
std::string Describe(const CompressOptions& o);

// A random job: every shape and option drawn from `rng`, small enough for the reference.
RandomCase DrawCase(std::mt19937_64& rng, int index);

// ---------------------------------------------------------------------------------------
// Property checks, derived from SPEC.md section 2 and the inputs alone.

// Array sizes consistent with the layer; false (after reporting) when they are not, since
// the other checks would index out of range.
bool ExpectWellFormed(const LayerView& layer, const CompressOptions& options,
                      const CompressResult& result);

// Input entry `input` of head `h` must come back as output row `row`, untouched (count,
// assignment when present, and key and value bit for bit). Counts reports in `*reported`.
void ExpectUntouched(const LayerView& layer, const CompressResult& result, int32_t h, int32_t input,
                     int64_t row, int* reported);

// Everything the SPEC says about any result: well-formed, head lengths (exact without a
// floor), protected and passthrough entries untouched, and, with an assignment, every row
// the count-weighted mean of the inputs assigned to it.
void ExpectInvariants(const LayerView& layer, const CompressOptions& options,
                      const CompressResult& result);

using test::ExpectBitIdentical;  // every field, floats compared bit for bit

// ---------------------------------------------------------------------------------------
// The fixture.

// A backend under test: one EngineSet kind, or the CUDA stages run on the host, or the cpu
// backend with its kernels forced to one SIMD level (skipped where the CPU lacks it), and
// optionally to its 16-bit integer matching at every chunk length (skipped where the level
// has none here: CpuEngineOptions::int16_every_chunk).
struct Backend {
  BackendKind kind;
  bool cuda_stages_on_host = false;
  std::optional<cpu::SimdLevel> cpu_level = std::nullopt;
  bool cpu_int16_every_chunk = false;
};

void PrintTo(const Backend& backend, std::ostream* os);

// The CUDA backend's algorithm run on the host (cuda::HostPipelineEngine), created once.
const ClusterEngine& CudaStagesOnHost();

// Selects the engine under test from the Backend parameter (skipping, with the reason, where
// it is not available here) and the reference engine.
class EngineConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override;

  // Runs `engine` (default: the engine under test), ASSERTing success.
  void Run(const LayerView& layer, const CompressOptions& options, CompressResult* out,
           const ClusterEngine* engine = nullptr) const;

  const ClusterEngine* engine_ = nullptr;
  const ClusterEngine* reference_ = nullptr;
};

}  // namespace centroidkv::conformance
