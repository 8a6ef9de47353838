// The CUDA backend's stages run on the host (kernels/cuda/host_pipeline.h) take exactly the
// reference engine's decisions and its float64 operation order, so their results are
// bit-identical to the reference's; and a batch of several jobs gives each job the result it
// gets alone. (The conformance suite runs the same engine against its looser standard.)
#include "kernels/cuda/host_pipeline.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/reference_engine.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::cuda {
namespace {

using test::ExpectBitIdentical;
using test::RandomLayer;
using test::RandomLayerSpec;

int32_t Draw(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

struct DrawnJob {
  RandomLayerSpec spec;
  CompressOptions options;
};

DrawnJob DrawJob(std::mt19937_64& rng) {
  DrawnJob job;
  job.spec.num_heads = Draw(rng, 1, 4);
  job.spec.num_tokens = Draw(rng, 1, 500);
  job.spec.key_dim = 4 << Draw(rng, 0, 4);
  job.spec.value_dim = Draw(rng, 1, 24);
  job.spec.dtype = static_cast<DType>(Draw(rng, 0, 2));
  job.spec.layout = static_cast<TensorLayout>(Draw(rng, 0, 1));
  job.spec.with_counts = Draw(rng, 0, 1) == 1;
  job.spec.prototypes = Draw(rng, 0, 2) == 0 ? 0 : Draw(rng, 1, 6);
  job.spec.noise = 0.01 * Draw(rng, 1, 20);
  job.spec.seed = rng();
  CompressOptions& o = job.options;
  o.target_ratio = Draw(rng, 5, 100) / 100.0;
  o.chunk_size = Draw(rng, 0, 1) == 1 ? Draw(rng, 2, 9) : Draw(rng, 2, 200);
  o.sink_tokens = Draw(rng, 0, 12);
  o.recent_tokens = Draw(rng, 0, 30);
  o.max_passes = Draw(rng, 1, 6);
  o.uniform_heads = Draw(rng, 0, 1) == 1;
  if (Draw(rng, 0, 1) == 1) {
    o.min_similarity = 0.01 * Draw(rng, 40, 99);
    o.tighten_per_pass = 0.005 * Draw(rng, 0, 3);
  }
  for (int32_t h = 0; h < job.spec.num_heads; ++h) {
    if (Draw(rng, 0, 4) == 0) o.passthrough_heads.push_back(h);
  }
  return job;
}

// Runs `engine` and the reference on the job; EXPECTs identical results. Returns whether the
// job merged anything.
bool ExpectSameAsReference(const ClusterEngine& engine, const DrawnJob& job) {
  const RandomLayer layer = RandomLayer::Generate(job.spec);
  absl::StatusOr<CompressResult> expected = ReferenceEngine().Compress(layer.view(), job.options);
  absl::StatusOr<CompressResult> actual = engine.Compress(layer.view(), job.options);
  EXPECT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(actual.ok()) << actual.status();
  if (!expected.ok() || !actual.ok()) return false;
  ExpectBitIdentical(*expected, *actual);
  return expected->passes_run > 0;
}

// Both match kernels: the tensor-core tiles (kMatchTiles, which resolves edges in the same block; every drawn key_dim is
// within TileMatchSupports) and the warp match (kNormalize + kMatch).
class HostPipelineMatchTest : public ::testing::TestWithParam<MatchKernel> {};

TEST_P(HostPipelineMatchTest, BitIdenticalToTheReference) {
  const HostPipelineEngine stages({}, 1, GetParam());
  std::mt19937_64 rng(20261130);
  int merged = 0;
  for (int i = 0; i < 120; ++i) {
    const DrawnJob job = DrawJob(rng);
    SCOPED_TRACE("job " + std::to_string(i) + ": " + job.spec.ToString());
    merged += ExpectSameAsReference(stages, job) ? 1 : 0;
  }
  EXPECT_GE(merged, 40);
}

// Keys that are a few prototypes plus tiny noise: many destinations within the tiles' margin
// of a source's best, so near-tie lists fill and overflow (then every destination is
// rescored exactly), in long chunks that span several destination tiles.
TEST_P(HostPipelineMatchTest, NearDuplicateKeysGiveTheReferenceResult) {
  const HostPipelineEngine stages({}, 1, GetParam());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 6; ++i) {
    DrawnJob job = DrawJob(rng);
    job.spec.num_tokens = 300 + 40 * i;
    job.spec.key_dim = i % 2 == 0 ? 64 : 36;
    job.spec.prototypes = 1 + i % 3;
    job.spec.noise = i < 3 ? 0.0 : 1e-4;
    job.options.chunk_size = 130 + 60 * i;
    SCOPED_TRACE("job " + std::to_string(i) + ": " + job.spec.ToString());
    ExpectSameAsReference(stages, job);
  }
}

// Equal keys: in every chunk of 8 all four sources tie and merge into the first destination,
// whose float64 sum then depends on the order of its list. Values chosen so that the
// reference's order (score descending, then source ascending: 2^60 + 1 + 1 - 2^60 + 0 = 0)
// and the reverse (2^60 + 0 - 2^60 + 1 + 1 = 2) differ even after rounding to float.
TEST_P(HostPipelineMatchTest, MergeListsSumInTheReferenceOrder) {
  const HostPipelineEngine stages({}, 1, GetParam());
  RandomLayerSpec spec = test::Spec(2, 64, 8, 2, 41, DType::kFloat32);
  RandomLayer layer = RandomLayer::Generate(spec);
  const float big = 1152921504606846976.0f;  // 2^60
  const float by_offset[8] = {1.0f, big, 1.0f, 3.0f, -big, 5.0f, 0.0f, 7.0f};
  for (int32_t h = 0; h < 2; ++h) {
    for (int32_t t = 0; t < 64; ++t) {
      for (int32_t j = 0; j < 8; ++j) layer.SetKey(h, t, j, 0.25f * static_cast<float>(j + 1));
      for (int32_t j = 0; j < 2; ++j) layer.SetValue(h, t, j, by_offset[t % 8]);
    }
  }
  CompressOptions options{.target_ratio = 0.5, .chunk_size = 8, .sink_tokens = 0,
      .recent_tokens = 0, .max_passes = 1};
  const absl::StatusOr<CompressResult> expected = ReferenceEngine().Compress(layer.view(), options);
  const absl::StatusOr<CompressResult> actual = stages.Compress(layer.view(), options);
  ASSERT_TRUE(expected.ok() && actual.ok());
  ASSERT_EQ(expected->counts[0], 5u);  // the first destination took all four sources
  EXPECT_EQ(expected->values[0], 0.0f);
  ExpectBitIdentical(*expected, *actual);
}

INSTANTIATE_TEST_SUITE_P(Match, HostPipelineMatchTest,
                         ::testing::Values(MatchKernel::kTiles, MatchKernel::kWarp),
                         [](const ::testing::TestParamInfo<MatchKernel>& info) {
                           return std::string(info.param == MatchKernel::kTiles ? "Tiles" : "Warp");
                         });

// The warp stages as the device runs them (32 lanes splitting loops, butterfly sums, only
// the lead lane writing), emulated by 32 threads: still the reference's result, bit for bit.
TEST(HostPipelineTest, ThirtyTwoLaneWarpsGiveTheReferenceResult) {
  std::mt19937_64 rng(32);
  for (int i = 0; i < 12; ++i) {
    const HostPipelineEngine warps({}, 32, i % 2 == 0 ? MatchKernel::kTiles : MatchKernel::kWarp);
    DrawnJob job = DrawJob(rng);
    job.spec.num_tokens = std::min(job.spec.num_tokens, 90);
    job.spec.key_dim = std::max(job.spec.key_dim, 40);  // more elements than lanes
    job.options.chunk_size = std::min(job.options.chunk_size, 12);
    job.options.max_passes = std::min(job.options.max_passes, 3);
    SCOPED_TRACE("job " + std::to_string(i) + ": " + job.spec.ToString());
    ExpectSameAsReference(warps, job);
  }
}

// The tile match's blocks as the device runs them, on 4 warps x 32 lanes of threads (lane
// and warp splits of every loop, WarpSync / BlockSync as barriers), on chunks long enough for
// several source and destination tiles per chunk and several 16-source tiles per warp.
TEST(HostPipelineTest, ThirtyTwoLaneTileBlocksOnLongChunks) {
  const HostPipelineEngine blocks({}, 32, MatchKernel::kTiles);
  for (const int32_t chunk : {300, 520}) {
    DrawnJob job;
    job.spec = test::Spec(2, 1100, 48, 8, static_cast<uint64_t>(chunk), DType::kFloat16);
    job.spec.prototypes = 5;
    job.spec.noise = 0.2;
    job.options.chunk_size = chunk;
    job.options.target_ratio = 0.3;
    job.options.max_passes = 2;
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    ExpectSameAsReference(blocks, job);
  }
}

TEST(HostPipelineTest, ABatchGivesEachJobItsOwnResult) {
  const ReferenceEngine reference;
  for (const bool floor : {false, true}) {
    SCOPED_TRACE(floor ? "with a floor" : "without a floor");
    CompressOptions options{.target_ratio = 0.3, .chunk_size = 16, .sink_tokens = 2,
        .recent_tokens = 5, .max_passes = 4, .passthrough_heads = {1}};
    if (floor) options.min_similarity = 0.6;
    std::vector<RandomLayer> layers;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      RandomLayerSpec spec{.num_heads = 3, .num_tokens = 150, .key_dim = 8, .value_dim = 6,
          .dtype = DType::kFloat16, .with_counts = seed % 2 == 0};
      spec.prototypes = static_cast<int32_t>(seed);  // jobs stop after different passes
      spec.noise = 0.2;
      spec.seed = seed;
      layers.push_back(RandomLayer::Generate(spec));
    }
    std::vector<LayerView> views;
    std::vector<LayerPlan> plans;
    for (const RandomLayer& layer : layers) {
      views.push_back(layer.view());
      absl::StatusOr<LayerPlan> plan = PlanLayer(views.back(), options, EngineLimits{});
      ASSERT_TRUE(plan.ok()) << plan.status();
      plans.push_back(*plan);
    }
    std::vector<CompressResult> results(layers.size());
    std::vector<BatchJob> jobs;
    for (size_t i = 0; i < layers.size(); ++i) jobs.push_back({&plans[i], &views[i], &results[i]});
    ASSERT_TRUE(RunBatchOnHost(jobs).ok());
    for (size_t i = 0; i < layers.size(); ++i) {
      SCOPED_TRACE("job " + std::to_string(i));
      absl::StatusOr<CompressResult> expected = reference.Compress(views[i], options);
      ASSERT_TRUE(expected.ok()) << expected.status();
      ExpectBitIdentical(*expected, results[i]);
    }
  }
}

}  // namespace
}  // namespace centroidkv::cuda
