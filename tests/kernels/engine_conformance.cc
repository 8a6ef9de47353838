// Definitions of the conformance suite's shared machinery (engine_conformance.h): the case
// tables, the SPEC-derived property checks and the fixture's engine selection.
#include "tests/kernels/engine_conformance.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_engine.h"
#include "kernels/cuda/host_pipeline.h"

namespace centroidkv::conformance {

using test::RandomLayerSpec;

const EngineSet& Engines() {
  static const EngineSet* const engines = EngineSet::CreateAvailable().release();
  return *engines;
}

RandomLayerSpec WithCounts(RandomLayerSpec spec) {
  spec.with_counts = true;
  return spec;
}

RandomLayerSpec Clustered(RandomLayerSpec spec, int32_t prototypes, double noise) {
  spec.prototypes = prototypes;
  spec.noise = noise;
  return spec;
}

RandomLayerSpec Stored(RandomLayerSpec spec, DType dtype, TensorLayout layout) {
  spec.dtype = dtype;
  spec.layout = layout;
  return spec;
}

std::vector<RandomCase> RandomCases() {
  constexpr DType kF16 = DType::kFloat16, kBF16 = DType::kBFloat16, kF32 = DType::kFloat32;
  constexpr TensorLayout kTokenMajor = TensorLayout::kTokenMajor;
  return {
      {"OneToken", Spec(2, 1, 8, 8, 1), Opts()},
      {"OneTokenNoProtection", Spec(1, 1, 8, 8, 2), Opts().Protect(0, 0).Chunk(2).Tokens(1)},
      {"TwoTokens", WithCounts(Spec(2, 2, 8, 8, 3)), Opts().Protect(0, 0).Chunk(2)},
      {"AllProtected", Spec(3, 50, 16, 16, 4), Opts().Protect(20, 30)},
      {"ProtectionExceedsTokens", Spec(2, 30, 8, 8, 5), Opts().Protect(25, 25)},
      {"OneCompressibleEntry", Spec(2, 41, 8, 8, 6), Opts().Protect(20, 20)},
      {"TwoCompressibleEntries", Spec(2, 42, 8, 8, 7), Opts().Protect(20, 20)},
      {"Defaults", Spec(4, 1000, 8, 8, 8), Opts()},
      {"ChunkSizeTwo", WithCounts(Spec(2, 257, 16, 16, 9)),
       Opts().Chunk(2).Protect(3, 5).Ratio(0.3)},
      {"ChunkSizeThree", Spec(2, 300, 12, 20, 10), Opts().Chunk(3).Protect(1, 2).Ratio(0.4)},
      {"ChunkSizeSevenNoProtection", Spec(3, 500, 16, 12, 11),
       Opts().Chunk(7).Protect(0, 0).Tokens(100)},
      {"ChunkSize33Clustered", Clustered(Spec(2, 700, 16, 16, 12), 8, 0.1),
       Opts().Chunk(33).Protect(4, 8).Ratio(0.2)},
      {"ChunkLargerThanRange", Spec(1, 3000, 8, 8, 13), Opts().Chunk(4096)},
      {"ChunkSize4096", Spec(1, 4400, 8, 4, 14), Opts().Chunk(4096).Ratio(0.5).Passes(2)},
      {"KeyDim256", Spec(2, 512, 256, 64, 15), Opts().Chunk(64)},
      {"KeyDim128Fp16", Stored(Spec(2, 1024, 128, 128, 16), kF16, TensorLayout::kHeadMajor),
       Opts()},
      {"Bf16TokenMajorCounts", WithCounts(Stored(Spec(3, 600, 32, 16, 17), kBF16, kTokenMajor)),
       Opts().Chunk(64).Protect(4, 32)},
      {"Fp32TokenMajor", Stored(Spec(2, 333, 24, 8, 18), kF32, kTokenMajor),
       Opts().Chunk(16).Protect(2, 7).Ratio(0.35)},
      {"ValueDimLargerThanKeyDim", Spec(2, 400, 8, 40, 19), Opts().Chunk(32).Protect(4, 8)},
      {"PassthroughHeads", Clustered(Spec(4, 256, 16, 16, 20), 6, 0.1),
       Opts().Passthrough({0, 2}).Chunk(32).Protect(4, 8).Ratio(0.2)},
      {"AllHeadsPassthrough", Spec(2, 100, 8, 8, 21),
       Opts().Passthrough({1, 0}).Chunk(8).Protect(0, 0)},
      {"FloorUniform", Clustered(WithCounts(Spec(4, 400, 16, 16, 22)), 6, 0.15),
       Opts().Floor(0.95, 0.005).Chunk(32).Protect(4, 8).Ratio(0.2)},
      {"FloorRagged", Clustered(WithCounts(Spec(4, 400, 16, 16, 22)), 6, 0.15),
       Opts().Floor(0.95, 0.005).Chunk(32).Protect(4, 8).Ratio(0.2).Uniform(false)},
      {"FloorTightensPastOne", Spec(3, 300, 4, 4, 23),
       Opts().Floor(0.5, 0.2).Chunk(16).Protect(2, 2).Ratio(0.1)},
      {"FloorPassthroughUniform", Clustered(Spec(4, 300, 8, 8, 24), 4, 0.2),
       Opts().Floor(0.9, 0.01).Passthrough({3}).Chunk(32).Protect(4, 8).Ratio(0.25)},
      {"FloorMinusOne", Spec(2, 200, 8, 8, 25), Opts().Floor(-1.0).Chunk(16).Protect(2, 4)},
      {"UniformOffNoFloor", WithCounts(Spec(3, 350, 8, 8, 26)),
       Opts().Uniform(false).Chunk(20).Protect(5, 5)},
      {"SinglePass", Spec(2, 600, 16, 16, 27), Opts().Passes(1).Ratio(0.1).Chunk(64)},
      {"TargetAboveTokens", Spec(2, 80, 8, 8, 28), Opts().Tokens(10000).Protect(0, 0)},
      {"RatioOne", Spec(2, 80, 8, 8, 29), Opts().Ratio(1.0).Protect(0, 0)},
      {"ClusteredCountsManyPasses", Clustered(WithCounts(Spec(2, 800, 16, 8, 30)), 5, 0.05),
       Opts().Chunk(16).Protect(2, 4).Tokens(20)},
      {"ManyHeads", Spec(16, 128, 8, 8, 31), Opts().Chunk(16).Protect(2, 4)},
      {"LongerLayer", Spec(2, 4000, 16, 16, 32), Opts().Chunk(64).Protect(16, 64)},
      {"PaperShapeFp16", Stored(Spec(4, 4096, 128, 128, 33), kF16, TensorLayout::kHeadMajor),
       Opts()},
      {"PaperShapeClusteredChunk1024",
       Clustered(WithCounts(Stored(Spec(2, 3000, 64, 64, 34), kBF16, kTokenMajor)), 16, 0.2),
       Opts().Chunk(1024).Ratio(0.5)},
  };
}

std::string Describe(const CompressOptions& o) {
  std::string out;
  if (o.target_ratio.has_value()) out += "rho=" + std::to_string(*o.target_ratio);
  if (o.target_tokens.has_value()) out += "t=" + std::to_string(*o.target_tokens);
  out += " C=" + std::to_string(o.chunk_size) + " S=" + std::to_string(o.sink_tokens) +
         " W=" + std::to_string(o.recent_tokens) + " P=" + std::to_string(o.max_passes) +
         " uniform=" + std::to_string(o.uniform_heads);
  if (o.min_similarity.has_value()) {
    out += " tau=" + std::to_string(*o.min_similarity) +
           " delta=" + std::to_string(o.tighten_per_pass);
  }
  out += " passthrough=[";
  for (int32_t head : o.passthrough_heads) out += std::to_string(head) + ",";
  return out + "]";
}

namespace {

// Uniform integer in [lo, hi] (modulo bias is irrelevant here).
int32_t Draw(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

}  // namespace

// A random job: every shape and option drawn from `rng`, small enough for the reference.
RandomCase DrawCase(std::mt19937_64& rng, int index) {
  const int32_t max_tokens = Draw(rng, 0, 3) == 0 ? 24 : 700;
  RandomLayerSpec spec = Spec(Draw(rng, 1, 4), Draw(rng, 1, max_tokens), 4 << Draw(rng, 0, 4),
                              Draw(rng, 1, 48), rng());
  spec.dtype = static_cast<DType>(Draw(rng, 0, 2));
  spec.layout = static_cast<TensorLayout>(Draw(rng, 0, 1));
  spec.with_counts = Draw(rng, 0, 1) == 1;
  spec.prototypes = Draw(rng, 0, 2) == 0 ? 0 : Draw(rng, 1, 8);
  spec.noise = 0.02 * Draw(rng, 1, 15);
  Opts options;
  if (Draw(rng, 0, 1) == 1) {
    options.Ratio(Draw(rng, 1, 100) / 100.0);
  } else {
    options.Tokens(Draw(rng, 1, spec.num_tokens + 5));
  }
  options.Chunk(Draw(rng, 0, 1) == 1 ? Draw(rng, 2, 9) : Draw(rng, 2, 300))
      .Protect(Draw(rng, 0, 20), Draw(rng, 0, 40))
      .Passes(Draw(rng, 1, 8))
      .Uniform(Draw(rng, 0, 1) == 1);
  if (Draw(rng, 0, 1) == 1) options.Floor(0.01 * Draw(rng, 50, 99), 0.005 * Draw(rng, 0, 3));
  std::vector<int32_t> passthrough;
  for (int32_t h = 0; h < spec.num_heads; ++h) {
    if (Draw(rng, 0, 4) == 0) passthrough.push_back(h);
  }
  options.Passthrough(passthrough);
  return {"Drawn" + std::to_string(index), spec, options};
}

// ---------------------------------------------------------------------------------------
// Property checks, derived from SPEC.md section 2 and the inputs alone.

namespace {

int64_t ResolveTarget(int32_t n, const CompressOptions& options) {
  if (options.target_tokens.has_value()) return std::min<int64_t>(*options.target_tokens, n);
  return static_cast<int64_t>(
      std::ceil(options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio) * n));
}

// Edges of a compressible range of `length` entries cut into chunks of `chunk`: every source
// (even local offset) of a chunk that has a destination (a chunk of 2 or more entries).
int64_t EdgesInRange(int64_t length, int64_t chunk) {
  int64_t edges = 0;
  for (int64_t start = 0; start < length; start += chunk) {
    const int64_t size = std::min(chunk, length - start);
    if (size >= 2) edges += (size + 1) / 2;
  }
  return edges;
}

struct Predicted {
  int64_t length = 0;
  int32_t passes = 0;
};

// Without a similarity floor every edge is a candidate, so the length of every compressed
// head after each pass follows from n, t, S, W, C and P alone (and is the same for every
// head, so uniform_heads changes nothing). With a floor there are fewer merges, and since
// m - edges(m) never decreases as m grows, this is a lower bound on every head's length.
Predicted PredictWithoutFloor(int32_t n, int64_t t, const CompressOptions& options) {
  Predicted out{n, 0};
  for (int32_t pass = 0; pass < options.max_passes && out.length > t; ++pass) {
    const int64_t range = out.length - options.sink_tokens - options.recent_tokens;
    const int64_t merges =
        range >= 2 ? std::min(out.length - t, EdgesInRange(range, options.chunk_size)) : 0;
    if (merges == 0) break;
    out.length -= merges;
    ++out.passes;
  }
  return out;
}

std::vector<bool> PassthroughMask(const LayerView& layer, const CompressOptions& options) {
  std::vector<bool> mask(layer.num_heads, false);
  for (int32_t head : options.passthrough_heads) mask[head] = true;
  return mask;
}

float InputKey(const LayerView& layer, int32_t h, int32_t t, int32_t j) {
  return LoadAsFloat(layer.keys, layer.dtype, layer.KeyOffset(h, t) + j);
}
float InputValue(const LayerView& layer, int32_t h, int32_t t, int32_t j) {
  return LoadAsFloat(layer.values, layer.dtype, layer.ValueOffset(h, t) + j);
}

}  // namespace

// Array sizes consistent with the layer; false (after reporting) when they are not, since
// the other checks would index out of range.
bool ExpectWellFormed(const LayerView& layer, const CompressOptions& options,
                      const CompressResult& result) {
  EXPECT_EQ(result.num_heads, layer.num_heads);
  EXPECT_EQ(result.num_tokens, layer.num_tokens);
  EXPECT_EQ(result.key_dim, layer.key_dim);
  EXPECT_EQ(result.value_dim, layer.value_dim);
  if (result.offsets.size() != static_cast<size_t>(layer.num_heads) + 1 || result.offsets[0] != 0) {
    ADD_FAILURE() << "offsets must have H+1 entries starting at 0";
    return false;
  }
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t length = result.offsets[h + 1] - result.offsets[h];
    if (length < 1 || length > layer.num_tokens) {
      ADD_FAILURE() << "head " << h << " has " << length << " rows; n = " << layer.num_tokens;
      return false;
    }
  }
  const auto total = static_cast<size_t>(result.total_entries());
  const size_t inputs = static_cast<size_t>(layer.num_heads) * layer.num_tokens;
  const bool sizes_ok = result.keys.size() == total * layer.key_dim &&
                        result.values.size() == total * layer.value_dim &&
                        result.counts.size() == total &&
                        result.assignment.size() == (options.compute_assignment ? inputs : 0);
  EXPECT_TRUE(sizes_ok) << "keys " << result.keys.size() << ", values " << result.values.size()
                        << ", counts " << result.counts.size() << ", assignment "
                        << result.assignment.size() << " for " << total << " rows";
  return sizes_ok;
}

namespace {

// Every assignment is a row of its head, and every row represents at least one input.
// Returns whether every assignment was in range.
bool ExpectAssignmentCovers(const LayerView& layer, const CompressResult& result) {
  bool in_range = true;
  const int32_t n = layer.num_tokens;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t length = result.offsets[h + 1] - result.offsets[h];
    std::vector<bool> covered(static_cast<size_t>(length), false);
    int reported = 0;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t row = result.assignment[static_cast<size_t>(h) * n + i];
      if (row < 0 || row >= length) {
        in_range = false;
        if (++reported <= kMaxReported) {
          ADD_FAILURE() << "head " << h << ", input " << i << " assigned to row " << row << " of "
                        << length;
        }
        continue;
      }
      covered[row] = true;
    }
    const auto uncovered = std::count(covered.begin(), covered.end(), false);
    EXPECT_EQ(uncovered, 0) << "head " << h << ": rows with no input assigned";
  }
  return in_range;
}

// Each row's count is the sum of its inputs' counts and its key/value their count-weighted
// mean (so the counts of a head sum to its input counts).
void ExpectCountWeightedMeans(const LayerView& layer, const CompressResult& result) {
  const int32_t n = layer.num_tokens, dk = layer.key_dim, dv = layer.value_dim;
  int reported = 0;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t first = result.offsets[h];
    const auto length = static_cast<size_t>(result.offsets[h + 1] - first);
    std::vector<uint64_t> count(length, 0);
    std::vector<double> key_sum(length * dk, 0.0), key_abs(length * dk, 0.0);
    std::vector<double> value_sum(length * dv, 0.0), value_abs(length * dv, 0.0);
    uint64_t input_total = 0, output_total = 0;
    for (int32_t i = 0; i < n; ++i) {
      const auto row = static_cast<size_t>(result.assignment[static_cast<size_t>(h) * n + i]);
      const uint32_t c = layer.CountAt(h, i);
      input_total += c;
      count[row] += c;
      for (int32_t j = 0; j < dk; ++j) {
        key_sum[row * dk + j] += static_cast<double>(c) * InputKey(layer, h, i, j);
        key_abs[row * dk + j] += static_cast<double>(c) * std::fabs(InputKey(layer, h, i, j));
      }
      for (int32_t j = 0; j < dv; ++j) {
        value_sum[row * dv + j] += static_cast<double>(c) * InputValue(layer, h, i, j);
        value_abs[row * dv + j] += static_cast<double>(c) * std::fabs(InputValue(layer, h, i, j));
      }
    }
    for (size_t row = 0; row < length; ++row) {
      output_total += result.counts[first + row];
      if (result.counts[first + row] != count[row] && ++reported <= kMaxReported) {
        ADD_FAILURE() << "head " << h << ", row " << row << ": count " << result.counts[first + row]
                      << ", but its inputs' counts sum to " << count[row];
      }
      auto check = [&](const char* field, const std::vector<float>& out, int32_t dim,
                       const std::vector<double>& sum, const std::vector<double>& abs_sum) {
        for (int32_t j = 0; j < dim; ++j) {
          const double mean = sum[row * dim + j] / static_cast<double>(count[row]);
          const double scale = std::max(1.0, abs_sum[row * dim + j] / count[row]);
          const double got = out[(first + row) * dim + j];
          if (!(std::fabs(got - mean) <= kMeanRelTolerance * scale) && ++reported <= kMaxReported) {
            ADD_FAILURE() << field << " of head " << h << ", row " << row << ", dim " << j << ": "
                          << got << ", but the count-weighted mean of its inputs is " << mean;
          }
        }
      };
      if (count[row] == 0) continue;  // reported by ExpectAssignmentCovers
      check("key", result.keys, dk, key_sum, key_abs);
      check("value", result.values, dv, value_sum, value_abs);
    }
    EXPECT_EQ(output_total, input_total) << "head " << h << ": counts do not add up";
  }
}

}  // namespace

// Input entry `input` of head `h` must come back as output row `row`, untouched.
void ExpectUntouched(const LayerView& layer, const CompressResult& result, int32_t h, int32_t input,
                     int64_t row, int* reported) {
  const int64_t global = result.offsets[h] + row;
  bool same = result.counts[global] == layer.CountAt(h, input);
  if (!result.assignment.empty()) {
    same = same && result.assignment[static_cast<size_t>(h) * layer.num_tokens + input] == row;
  }
  for (int32_t j = 0; j < layer.key_dim; ++j) {
    same = same && std::bit_cast<uint32_t>(result.keys[global * layer.key_dim + j]) ==
                       std::bit_cast<uint32_t>(InputKey(layer, h, input, j));
  }
  for (int32_t j = 0; j < layer.value_dim; ++j) {
    same = same && std::bit_cast<uint32_t>(result.values[global * layer.value_dim + j]) ==
                       std::bit_cast<uint32_t>(InputValue(layer, h, input, j));
  }
  if (!same && ++*reported <= kMaxReported) {
    ADD_FAILURE() << "head " << h << ", protected input " << input
                  << " does not come back bit-identical (count, assignment, key and value) "
                  << "as row " << row;
  }
}

namespace {

// The first S and last W entries of every compressed head, and all of a passthrough head,
// come back bit-identical (widened to float) at their places.
void ExpectProtectedUnchanged(const LayerView& layer, const CompressOptions& options,
                              const CompressResult& result) {
  const std::vector<bool> passthrough = PassthroughMask(layer, options);
  const int32_t n = layer.num_tokens;
  int reported = 0;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t length = result.offsets[h + 1] - result.offsets[h];
    if (passthrough[h]) {
      EXPECT_EQ(length, n) << "passthrough head " << h << " changed length";
      if (length != n) continue;
      for (int32_t i = 0; i < n; ++i) ExpectUntouched(layer, result, h, i, i, &reported);
      continue;
    }
    for (int32_t i = 0; i < std::min(options.sink_tokens, n); ++i) {
      ExpectUntouched(layer, result, h, i, i, &reported);
    }
    for (int32_t i = std::max(n - options.recent_tokens, options.sink_tokens); i < n; ++i) {
      ExpectUntouched(layer, result, h, i, length - (n - i), &reported);
    }
  }
}

// Head lengths: passthrough heads keep n; compressed heads stay >= t, share one length with
// uniform_heads, and follow PredictWithoutFloor exactly without a floor (a bound with one).
void ExpectLengths(const LayerView& layer, const CompressOptions& options,
                   const CompressResult& result) {
  const std::vector<bool> passthrough = PassthroughMask(layer, options);
  const int64_t t = ResolveTarget(layer.num_tokens, options);
  const Predicted predicted = PredictWithoutFloor(layer.num_tokens, t, options);
  const bool floor = options.min_similarity.has_value();
  std::vector<int64_t> compressed_lengths;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const int64_t length = result.offsets[h + 1] - result.offsets[h];
    if (passthrough[h]) continue;
    compressed_lengths.push_back(length);
    EXPECT_GE(length, t) << "head " << h << " went below the target";
    if (floor) {
      EXPECT_GE(length, predicted.length) << "head " << h << " merged more than it can";
    } else {
      EXPECT_EQ(length, predicted.length) << "head " << h << " (t = " << t << ")";
    }
  }
  if (options.uniform_heads && !compressed_lengths.empty()) {
    EXPECT_EQ(*std::min_element(compressed_lengths.begin(), compressed_lengths.end()),
              *std::max_element(compressed_lengths.begin(), compressed_lengths.end()))
        << "uniform_heads: compressed heads differ in length";
  }
  const bool merged = std::any_of(compressed_lengths.begin(), compressed_lengths.end(),
                                  [&](int64_t length) { return length < layer.num_tokens; });
  EXPECT_EQ(result.passes_run > 0, merged) << "passes_run " << result.passes_run;
  EXPECT_LE(result.passes_run, options.max_passes);
  if (!floor && !compressed_lengths.empty()) {
    EXPECT_EQ(result.passes_run, predicted.passes);
  }
}

}  // namespace

void ExpectInvariants(const LayerView& layer, const CompressOptions& options,
                      const CompressResult& result) {
  if (!ExpectWellFormed(layer, options, result)) return;
  ExpectLengths(layer, options, result);
  ExpectProtectedUnchanged(layer, options, result);
  if (result.assignment.empty()) return;
  if (!ExpectAssignmentCovers(layer, result)) return;  // rows out of range: unsafe below
  ExpectCountWeightedMeans(layer, result);
}

// ---------------------------------------------------------------------------------------
// The fixture.

void PrintTo(const Backend& backend, std::ostream* os) {
  *os << (backend.cuda_stages_on_host ? "cuda-stages-on-host" : BackendKindName(backend.kind));
  if (backend.cpu_level.has_value()) *os << "-" << cpu::SimdLevelName(*backend.cpu_level);
  if (backend.cpu_int16_every_chunk) *os << "-int16";
}

namespace {

// The cpu backend forced to `level` (and to int16 matching at every chunk length), created
// once per pair.
const ClusterEngine& CpuEngineAt(cpu::SimdLevel level, bool int16_every_chunk) {
  static std::map<std::pair<cpu::SimdLevel, bool>, const ClusterEngine*>* const engines =
      new std::map<std::pair<cpu::SimdLevel, bool>, const ClusterEngine*>();
  const ClusterEngine*& engine = (*engines)[{level, int16_every_chunk}];
  if (engine == nullptr) {
    engine = new cpu::CpuEngine(EngineLimits{}, cpu::CpuEngineOptions{level, int16_every_chunk});
  }
  return *engine;
}

}  // namespace

const ClusterEngine& CudaStagesOnHost() {
  static const ClusterEngine* const engine = new cuda::HostPipelineEngine();
  return *engine;
}

void EngineConformanceTest::SetUp() {
  if (GetParam().cuda_stages_on_host) {
    engine_ = &CudaStagesOnHost();
  } else if (const std::optional<cpu::SimdLevel> level = GetParam().cpu_level; level.has_value()) {
    if (!cpu::SimdLevelSupported(*level)) {
      GTEST_SKIP() << "this CPU lacks the " << cpu::SimdLevelName(*level) << " level";
    }
    if (GetParam().cpu_int16_every_chunk && cpu::KernelsFor(*level).match_int16 == nullptr) {
      GTEST_SKIP() << "the " << cpu::SimdLevelName(*level)
                   << " level has no int16 matching on this CPU (AVX-512 needs VNNI)";
    }
    engine_ = &CpuEngineAt(*level, GetParam().cpu_int16_every_chunk);
  } else {
    absl::StatusOr<const ClusterEngine*> engine = Engines().Select(GetParam().kind);
    if (!engine.ok() && GetParam().kind == BackendKind::kCuda) {
      GTEST_SKIP() << "no CUDA device: " << engine.status();
    }
    if (!engine.ok()) GTEST_SKIP() << "no engine here: " << engine.status();
    engine_ = *engine;
  }
  absl::StatusOr<const ClusterEngine*> reference = Engines().Select(BackendKind::kReference);
  ASSERT_TRUE(reference.ok()) << reference.status();
  reference_ = *reference;
}

void EngineConformanceTest::Run(const LayerView& layer, const CompressOptions& options,
                                CompressResult* out, const ClusterEngine* engine) const {
  absl::StatusOr<CompressResult> result =
      (engine != nullptr ? engine : engine_)->Compress(layer, options);
  ASSERT_TRUE(result.ok()) << result.status();
  *out = *std::move(result);
}

}  // namespace centroidkv::conformance
