// The conformance suite every ClusterEngine backend must pass (SPEC.md section 2), one
// TEST_P suite instantiated per backend kind: the golden cases, hand-made cases whose result
// follows directly from the SPEC, and properties on seeded random layers of many shapes,
// plus agreement with the reference engine. A new backend adds one INSTANTIATE line below.
// The gpu backend's cases skip, with a message saying so, where there is no CUDA device; the
// CUDA backend's algorithm also runs everywhere as its host twin (gpu::HostPipelineEngine).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "kernels/gpu/host_pipeline.h"
#include "tests/kernels/reference_agreement.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv {

namespace {

using test::RandomLayer;
using test::RandomLayerSpec;

// Output rows against the count-weighted means computed here in double from the inputs:
// |row - mean| <= kMeanRelTolerance * max(1, count-weighted mean of |inputs|).
constexpr double kMeanRelTolerance = 1e-5;
// Keys/values of an engine against the reference engine on the same job.
constexpr double kEngineRelTolerance = 1e-5;
// Hand-made cases: small exact sums, so only float32 rounding of the result.
constexpr double kHandRelTolerance = 1e-6;
// Mismatches of one kind reported one by one per result.
constexpr int kMaxReported = 5;

const EngineSet& Engines() {
  static const EngineSet* const engines = EngineSet::CreateAvailable().release();
  return *engines;
}

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

RandomLayerSpec Spec(int32_t heads, int32_t tokens, int32_t key_dim, int32_t value_dim,
                     uint64_t seed) {
  RandomLayerSpec spec;
  spec.num_heads = heads;
  spec.num_tokens = tokens;
  spec.key_dim = key_dim;
  spec.value_dim = value_dim;
  spec.seed = seed;
  return spec;
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

struct RandomCase {
  std::string name;
  RandomLayerSpec spec;
  CompressOptions options;
};

// Shapes and options for the property tests, sized so that the float64 reference engine runs
// the whole table in a few seconds.
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

// Uniform integer in [lo, hi] (modulo bias is irrelevant here).
int32_t Draw(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

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

void ExpectInvariants(const LayerView& layer, const CompressOptions& options,
                      const CompressResult& result) {
  if (!ExpectWellFormed(layer, options, result)) return;
  ExpectLengths(layer, options, result);
  ExpectProtectedUnchanged(layer, options, result);
  if (result.assignment.empty()) return;
  if (!ExpectAssignmentCovers(layer, result)) return;  // rows out of range: unsafe below
  ExpectCountWeightedMeans(layer, result);
}

// Every field, floats compared bit for bit.
void ExpectBitIdentical(const CompressResult& a, const CompressResult& b) {
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.assignment, b.assignment);
  EXPECT_EQ(a.passes_run, b.passes_run);
  ASSERT_EQ(a.keys.size(), b.keys.size());
  ASSERT_EQ(a.values.size(), b.values.size());
  EXPECT_EQ(std::memcmp(a.keys.data(), b.keys.data(), a.keys.size() * sizeof(float)), 0)
      << "keys differ";
  EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)), 0)
      << "values differ";
}

// ---------------------------------------------------------------------------------------

// A backend under test: one EngineSet kind, or the CUDA stages run on the host.
struct Backend {
  BackendKind kind;
  bool cuda_stages_on_host = false;
};

void PrintTo(const Backend& backend, std::ostream* os) {
  *os << (backend.cuda_stages_on_host ? "cuda-stages-on-host" : BackendKindName(backend.kind));
}

const ClusterEngine& CudaStagesOnHost() {
  static const ClusterEngine* const engine = new gpu::HostPipelineEngine();
  return *engine;
}

class EngineConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().cuda_stages_on_host) {
      engine_ = &CudaStagesOnHost();
    } else {
      absl::StatusOr<const ClusterEngine*> engine = Engines().Select(GetParam().kind);
      if (!engine.ok() && GetParam().kind == BackendKind::kGpu) {
        GTEST_SKIP() << "no CUDA device: " << engine.status();
      }
      if (!engine.ok()) GTEST_SKIP() << "no engine here: " << engine.status();
      engine_ = *engine;
    }
    absl::StatusOr<const ClusterEngine*> reference = Engines().Select(BackendKind::kReference);
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_ = *reference;
  }

  // Runs `engine` (default: the engine under test), ASSERTing success.
  void Run(const LayerView& layer, const CompressOptions& options, CompressResult* out,
           const ClusterEngine* engine = nullptr) const {
    absl::StatusOr<CompressResult> result =
        (engine != nullptr ? engine : engine_)->Compress(layer, options);
    ASSERT_TRUE(result.ok()) << result.status();
    *out = *std::move(result);
  }

  const ClusterEngine* engine_ = nullptr;
  const ClusterEngine* reference_ = nullptr;
};

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

TEST_P(EngineConformanceTest, RandomLayersMatchReference) {
  for (const RandomCase& c : RandomCases()) {
    SCOPED_TRACE(c.name + ": " + c.spec.ToString());
    const RandomLayer layer = RandomLayer::Generate(c.spec);
    // Identical decisions, or a divergence traced to genuine near ties (and reported).
    test::ExpectAgreesWithReference(*engine_, *reference_, layer.view(), c.options,
                                    kEngineRelTolerance);
  }
}

// Shapes and options drawn at random (a fixed seed, printed on failure): the invariants
// hold and the result agrees with the reference engine.
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
    test::ExpectAgreesWithReference(*engine_, *reference_, layer.view(), c.options,
                                    kEngineRelTolerance);
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

// ---------------------------------------------------------------------------------------
// Hand-made layers whose exact result follows from the SPEC by hand.

// A layer of the given shape whose rows the test sets one by one.
RandomLayer HandLayer(int32_t heads, int32_t tokens, int32_t key_dim, int32_t value_dim) {
  return RandomLayer::Generate(Spec(heads, tokens, key_dim, value_dim, 0));
}

void SetRow(RandomLayer* layer, int32_t h, int32_t t, const std::vector<float>& key,
            const std::vector<float>& value, uint32_t count = 1) {
  for (size_t j = 0; j < key.size(); ++j) layer->SetKey(h, t, static_cast<int32_t>(j), key[j]);
  for (size_t j = 0; j < value.size(); ++j) {
    layer->SetValue(h, t, static_cast<int32_t>(j), value[j]);
  }
  if (count != 1 || layer->view().counts != nullptr) layer->SetCount(h, t, count);
}

// Expected result of a one-head-at-a-time hand computation.
struct HandHead {
  std::vector<std::vector<float>> keys, values;
  std::vector<uint32_t> counts;
  std::vector<int32_t> assignment;
};

CompressResult HandResult(const LayerView& layer, const std::vector<HandHead>& heads) {
  CompressResult out;
  out.num_heads = layer.num_heads;
  out.num_tokens = layer.num_tokens;
  out.key_dim = layer.key_dim;
  out.value_dim = layer.value_dim;
  out.offsets = {0};
  for (const HandHead& head : heads) {
    out.offsets.push_back(out.offsets.back() + static_cast<int64_t>(head.counts.size()));
    for (const auto& key : head.keys) out.keys.insert(out.keys.end(), key.begin(), key.end());
    for (const auto& value : head.values) {
      out.values.insert(out.values.end(), value.begin(), value.end());
    }
    out.counts.insert(out.counts.end(), head.counts.begin(), head.counts.end());
    out.assignment.insert(out.assignment.end(), head.assignment.begin(), head.assignment.end());
  }
  return out;
}

// Chunk {0..4}: sources 0, 2, 4 and destinations 1, 3 with identical keys: every source's
// scores tie, so every source goes to the lowest destination, 1.
TEST_P(EngineConformanceTest, TiesGoToTheLowestDestination) {
  RandomLayer layer = HandLayer(1, 5, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {0});
  SetRow(&layer, 0, 1, {1, 1}, {1});
  SetRow(&layer, 0, 2, {0, 1}, {2});
  SetRow(&layer, 0, 3, {1, 1}, {3});
  SetRow(&layer, 0, 4, {2, 1}, {4});
  const CompressOptions options = Opts().Chunk(5).Protect(0, 0).Tokens(2).Passes(1);
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), options, &result));
  const HandHead head{{{1.0f, 0.75f}, {1, 1}}, {{1.75f}, {3}}, {4, 1}, {0, 0, 0, 1, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

// All-zero keys: every score is 0 (norms clamp at 1e-6), so the ties go to the lowest
// destination and, in the top-r order, to the lowest source.
TEST_P(EngineConformanceTest, ZeroKeysTieEverywhere) {
  RandomLayer layer = HandLayer(1, 8, 3, 1);
  for (int32_t t = 0; t < 8; ++t) SetRow(&layer, 0, t, {0, 0, 0}, {static_cast<float>(t)});
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(8).Protect(0, 0).Tokens(5).Passes(1), &result));
  // r = 3 of the 4 sources 0, 2, 4, 6 (all to 1): 0, 2 and 4 merge.
  const HandHead head{{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}},
                      {{7.0f / 4}, {3}, {5}, {6}, {7}},
                      {4, 1, 1, 1, 1},
                      {0, 0, 0, 1, 0, 2, 3, 4}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

// Three chunks of 2 with edge scores 0.6, 0.2 and 0.9: the best edges are kept across chunks.
RandomLayer ThreeChunkLayer() {
  RandomLayer layer = HandLayer(1, 6, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {10});
  SetRow(&layer, 0, 1, {0.6f, 0.8f}, {20});
  SetRow(&layer, 0, 2, {1, 0}, {30});
  SetRow(&layer, 0, 3, {0.2f, 0.9798f}, {40});
  SetRow(&layer, 0, 4, {1, 0}, {50});
  SetRow(&layer, 0, 5, {0.9f, 0.4359f}, {60});
  return layer;
}

TEST_P(EngineConformanceTest, KeepsTheBestEdgesAcrossChunks) {
  const RandomLayer layer = ThreeChunkLayer();
  const Opts base = Opts().Chunk(2).Protect(0, 0).Passes(1);
  CompressResult one, two;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Tokens(5), &one));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Tokens(4), &two));
  const HandHead keep_one{{{1, 0}, {0.6f, 0.8f}, {1, 0}, {0.2f, 0.9798f}, {0.95f, 0.21795f}},
                          {{10}, {20}, {30}, {40}, {55}},
                          {1, 1, 1, 1, 2},
                          {0, 1, 2, 3, 4, 4}};
  const HandHead keep_two{{{0.8f, 0.4f}, {1, 0}, {0.2f, 0.9798f}, {0.95f, 0.21795f}},
                          {{15}, {30}, {40}, {55}},
                          {2, 1, 1, 2},
                          {0, 0, 1, 2, 3, 3}};
  test::ExpectResultsNear(HandResult(layer.view(), {keep_one}), one, kHandRelTolerance);
  test::ExpectResultsNear(HandResult(layer.view(), {keep_two}), two, kHandRelTolerance);
}

// Equal scores in every chunk: the top-r order falls back to the source position.
TEST_P(EngineConformanceTest, EqualScoresKeepTheEarliestSources) {
  RandomLayer layer = HandLayer(1, 6, 2, 1);
  for (int32_t t = 0; t < 6; t += 2) {
    SetRow(&layer, 0, t, {1, 0}, {static_cast<float>(t)});
    SetRow(&layer, 0, t + 1, {0.6f, 0.8f}, {static_cast<float>(t + 1)});
  }
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(2).Protect(0, 0).Passes(1).Tokens(4), &result));
  const HandHead head{{{0.8f, 0.4f}, {0.8f, 0.4f}, {1, 0}, {0.6f, 0.8f}},
                      {{0.5f}, {2.5f}, {4}, {5}},
                      {2, 2, 1, 1},
                      {0, 0, 1, 1, 2, 3}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
}

TEST_P(EngineConformanceTest, CountsWeightTheMean) {
  RandomLayer layer = HandLayer(1, 2, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {4}, 3);
  SetRow(&layer, 0, 1, {2, 0}, {8}, 1);
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts().Chunk(2).Protect(0, 0).Tokens(1), &result));
  const HandHead head{{{1.25f, 0}}, {{5}}, {4}, {0, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
  EXPECT_EQ(result.passes_run, 1);
}

// Chunks {0, 1}, {2}: a chunk of one source has no edge. Pass 0 merges 0 into 1; pass 1 sees
// the chunk {01, 2} and merges the centroid into 2: the mean of all three.
TEST_P(EngineConformanceTest, LoneSourceWaitsForTheNextPass) {
  RandomLayer layer = HandLayer(1, 3, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {3});
  SetRow(&layer, 0, 1, {1, 1}, {6});
  SetRow(&layer, 0, 2, {1, 2}, {9});
  const Opts base = Opts().Chunk(2).Protect(0, 0).Tokens(1);
  CompressResult one_pass, two_passes;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Passes(1), &one_pass));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), base, &two_passes));
  const HandHead after_one{{{1, 0.5f}, {1, 2}}, {{4.5f}, {9}}, {2, 1}, {0, 0, 1}};
  const HandHead after_two{{{1, 1}}, {{6}}, {3}, {0, 0, 0}};
  test::ExpectResultsNear(HandResult(layer.view(), {after_one}), one_pass, kHandRelTolerance);
  test::ExpectResultsNear(HandResult(layer.view(), {after_two}), two_passes, kHandRelTolerance);
  EXPECT_EQ(one_pass.passes_run, 1);
  EXPECT_EQ(two_passes.passes_run, 2);
}

// Parallel keys score exactly 1 (x.y = |x||y| in any float arithmetic for these values),
// and a floor of 1 admits them: candidates are edges with score >= the floor.
TEST_P(EngineConformanceTest, FloorIsInclusive) {
  RandomLayer layer = HandLayer(1, 4, 2, 1);
  SetRow(&layer, 0, 0, {1, 0}, {1});
  SetRow(&layer, 0, 1, {2, 0}, {2});
  SetRow(&layer, 0, 2, {0, 1}, {3});
  SetRow(&layer, 0, 3, {0, 3}, {4});
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts().Chunk(4).Protect(0, 0).Tokens(1).Passes(1).Floor(1.0), &result));
  const HandHead head{{{1.5f, 0}, {0, 2}}, {{1.5f}, {3.5f}}, {2, 2}, {0, 0, 1, 1}};
  test::ExpectResultsNear(HandResult(layer.view(), {head}), result, kHandRelTolerance);
  EXPECT_EQ(result.passes_run, 1);
}

// Head 0 has the three-chunk scores (0.6, 0.2, 0.9), head 1 three perfect pairs. With a floor
// of 0.5, head 0 has 2 candidates and head 1 has 3.
RandomLayer TwoHeadLayer() {
  RandomLayer layer = HandLayer(2, 6, 2, 1);
  const RandomLayer first = ThreeChunkLayer();
  for (int32_t t = 0; t < 6; ++t) {
    SetRow(&layer, 0, t, {first.Key(0, t, 0), first.Key(0, t, 1)}, {first.Value(0, t, 0)});
    SetRow(&layer, 1, t, {1, 1}, {static_cast<float>(t)});
  }
  return layer;
}

TEST_P(EngineConformanceTest, UniformHeadsTakeTheSmallestMergeCount) {
  const RandomLayer layer = TwoHeadLayer();
  const Opts base = Opts().Chunk(2).Protect(0, 0).Passes(1).Tokens(2).Floor(0.5);
  CompressResult uniform, ragged, passthrough, blocked;
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(true), &uniform));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(false), &ragged));
  ASSERT_NO_FATAL_FAILURE(
      Run(layer.view(), Opts(base).Uniform(true).Passthrough({0}), &passthrough));
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Uniform(true).Floor(0.95), &blocked));
  EXPECT_EQ(uniform.offsets, (std::vector<int64_t>{0, 4, 8}));      // min(2, 3) = 2 each
  EXPECT_EQ(ragged.offsets, (std::vector<int64_t>{0, 4, 7}));       // 2 and 3
  EXPECT_EQ(passthrough.offsets, (std::vector<int64_t>{0, 6, 9}));  // head 0 does not count
  EXPECT_EQ(blocked.offsets, (std::vector<int64_t>{0, 6, 12}));     // head 0 has none: nobody
  EXPECT_EQ(blocked.passes_run, 0);
  const std::vector<int32_t> head0_two = {0, 0, 1, 2, 3, 3};
  const std::vector<int32_t> head1_two = {0, 0, 1, 1, 2, 3};  // equal scores: earliest first
  const std::vector<int32_t> head1_three = {0, 0, 1, 1, 2, 2};
  auto concat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(uniform.assignment, concat(head0_two, head1_two));
  EXPECT_EQ(ragged.assignment, concat(head0_two, head1_three));
  EXPECT_EQ(passthrough.assignment, concat({0, 1, 2, 3, 4, 5}, head1_three));
  ExpectInvariants(layer.view(), Opts(base).Uniform(true), uniform);
  ExpectInvariants(layer.view(), Opts(base).Uniform(false), ragged);
}

// The floor of pass p is tau + p * delta: with tau 0.55 and delta 0.4, pass 0 takes the 0.6
// and 0.9 edges of the three-chunk layer, and pass 1 (floor 0.95; its best edge scores 0.89)
// nothing more.
TEST_P(EngineConformanceTest, FloorRisesEachPass) {
  const RandomLayer layer = ThreeChunkLayer();
  CompressResult tight, loose;
  const Opts base = Opts().Chunk(2).Protect(0, 0).Tokens(1);
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Floor(0.55, 0.4), &tight));
  EXPECT_EQ(tight.offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(tight.assignment, (std::vector<int32_t>{0, 0, 1, 2, 3, 3}));
  EXPECT_EQ(tight.passes_run, 1);
  // Without the rise, pass 1 continues (its chunks are {01, 2} and {3, 45}).
  ASSERT_NO_FATAL_FAILURE(Run(layer.view(), Opts(base).Floor(-1.0), &loose));
  EXPECT_LT(loose.total_entries(), 4);
  EXPECT_GE(loose.passes_run, 2);
  ExpectInvariants(layer.view(), Opts(base).Floor(-1.0), loose);
}

INSTANTIATE_TEST_SUITE_P(Reference, EngineConformanceTest,
                         ::testing::Values(Backend{BackendKind::kReference}),
                         [](const ::testing::TestParamInfo<Backend>&) {
                           return std::string("Reference");
                         });
INSTANTIATE_TEST_SUITE_P(Cpu, EngineConformanceTest, ::testing::Values(Backend{BackendKind::kCpu}),
                         [](const ::testing::TestParamInfo<Backend>&) {
                           return std::string("Cpu");
                         });
// The CUDA device (skipped with "no CUDA device: ..." where there is none).
INSTANTIATE_TEST_SUITE_P(Gpu, EngineConformanceTest, ::testing::Values(Backend{BackendKind::kGpu}),
                         [](const ::testing::TestParamInfo<Backend>&) {
                           return std::string("Gpu");
                         });
// The CUDA backend's stages, run on the host: the GPU algorithm, checked on every machine.
INSTANTIATE_TEST_SUITE_P(CudaStagesOnHost, EngineConformanceTest,
                         ::testing::Values(Backend{BackendKind::kGpu, true}),
                         [](const ::testing::TestParamInfo<Backend>&) {
                           return std::string("CudaStagesOnHost");
                         });

}  // namespace
}  // namespace centroidkv
