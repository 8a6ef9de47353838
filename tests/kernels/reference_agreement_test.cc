// Tests of tests/kernels/reference_agreement.cc, the near-tie check of the conformance suite:
// an engine whose decisions differ from the reference only where scores are within float
// rounding passes (and the divergence is reported); one that decides otherwise fails.
#include "tests/kernels/reference_agreement.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_engine.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::test {
namespace {

// The reference engine on keys each scaled by (1 +- relative_change) (a fixed pseudo-random
// sign per element): with a change of one float rounding, its decisions differ from the
// reference's exactly where two scores are within float rounding of each other.
class PerturbedEngine final : public ClusterEngine {
 public:
  explicit PerturbedEngine(double relative_change) : relative_change_(relative_change) {}
  std::string_view name() const override { return "perturbed"; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer, const CompressControl&,
                            CompressResult* out) const override {
    const int32_t h_count = layer.num_heads, n = layer.num_tokens;
    std::vector<float> keys(static_cast<size_t>(h_count) * n * layer.key_dim);
    std::vector<float> values(static_cast<size_t>(h_count) * n * layer.value_dim);
    std::vector<uint32_t> counts(static_cast<size_t>(h_count) * n);
    uint64_t hash = 0x9e3779b97f4a7c15u;
    for (int32_t h = 0; h < h_count; ++h) {
      for (int32_t t = 0; t < n; ++t) {
        const int64_t row = static_cast<int64_t>(h) * n + t;
        for (int32_t j = 0; j < layer.key_dim; ++j) {
          hash = hash * 6364136223846793005u + 1442695040888963407u;
          const double sign = (hash >> 63) ? 1.0 : -1.0;
          keys[row * layer.key_dim + j] =
              static_cast<float>(LoadAsFloat(layer.keys, layer.dtype, layer.KeyOffset(h, t) + j) *
                                 (1.0 + sign * relative_change_));
        }
        for (int32_t j = 0; j < layer.value_dim; ++j) {
          values[row * layer.value_dim + j] =
              LoadAsFloat(layer.values, layer.dtype, layer.ValueOffset(h, t) + j);
        }
        counts[row] = layer.CountAt(h, t);
      }
    }
    LayerView perturbed = layer;
    perturbed.dtype = DType::kFloat32;
    perturbed.layout = TensorLayout::kHeadMajor;
    perturbed.keys = keys.data();
    perturbed.values = values.data();
    perturbed.counts = counts.data();
    absl::StatusOr<CompressResult> result = reference_.Compress(perturbed, plan.options);
    if (!result.ok()) return result.status();
    *out = *std::move(result);
    return absl::OkStatus();
  }

 private:
  double relative_change_;
  ReferenceEngine reference_;
};

// Keys that are exact multiples of a few prototypes: cosines of 1 (up to float64 rounding)
// within a prototype, so argmax and top-r decisions are full of ties.
RandomLayer TiedLayer() {
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 300, .key_dim = 16, .value_dim = 4,
      .prototypes = 3, .noise = 0.0, .seed = 77};
  return RandomLayer::Generate(spec);
}

CompressOptions TiedOptions() {
  CompressOptions options{.target_ratio = 0.4, .chunk_size = 16, .sink_tokens = 2,
      .recent_tokens = 4};
  return options;
}

TEST(ReferenceAgreementTest, IdenticalEnginesAgreeWithoutNearTies) {
  const ReferenceEngine reference;
  const RandomLayer layer = TiedLayer();
  const Agreement agreement =
      ExpectAgreesWithReference(reference, reference, layer.view(), TiedOptions(), 1e-5);
  EXPECT_EQ(agreement.divergent_pass, -1);
  EXPECT_EQ(agreement.near_ties, 0);
}

TEST(ReferenceAgreementTest, NearTieDivergenceIsExplainedAndReported) {
  const ReferenceEngine reference;
  const PerturbedEngine perturbed(0x1p-24);
  const RandomLayer layer = TiedLayer();
  const Agreement agreement =
      ExpectAgreesWithReference(perturbed, reference, layer.view(), TiedOptions(), 1e-5);
  EXPECT_GE(agreement.divergent_pass, 0) << "the perturbation should flip some tie";
  EXPECT_GT(agreement.near_ties, 0);
  EXPECT_NE(agreement.explanation.find("tie"), std::string::npos) << agreement.explanation;
}

TEST(ReferenceAgreementTest, OtherDivergenceFails) {
  const ReferenceEngine reference;
  const PerturbedEngine wrong(0.05);
  RandomLayerSpec spec{.num_heads = 2, .num_tokens = 200, .key_dim = 8, .value_dim = 4, .seed = 78};
  const RandomLayer layer = RandomLayer::Generate(spec);
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    ExpectAgreesWithReference(wrong, reference, layer.view(), TiedOptions(), 1e-5);
  }
  ASSERT_GT(failures.size(), 0) << "a 5% change of the keys must not pass as a near tie";
  bool named = false;
  for (int i = 0; i < failures.size(); ++i) {
    const std::string message = failures.GetTestPartResult(i).message();
    named = named || message.find("not a near tie") != std::string::npos;
  }
  EXPECT_TRUE(named) << failures.GetTestPartResult(0).message();
}

}  // namespace
}  // namespace centroidkv::test
