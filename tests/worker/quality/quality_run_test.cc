// Tests of worker/quality/quality_run.cc through a live server on stories260K:
// the quality numbers (KL, top-1) of CentroidKV with padded results (pad_heads, pad_to)
// equal the unpadded ones exactly, and the service's target account reaches the results.
#include "worker/quality/quality_run.h"

#include <string>
#include <vector>

#include "worker/quality/report.h"
#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker::quality {
namespace {

class QualityRunTest : public testutil::LiveServerTest {
 protected:
  // CentroidKV at a 25% budget with heads of different lengths: outlier heads, and a
  // similarity floor applied to each head on its own.
  static RunSettings UnevenSettings() {
    RunSettings settings;
    settings.prefill = 160;
    settings.continuation = 40;
    settings.budgets = {0.25};
    settings.methods = {kCentroidKv, kCentroidKvOutliers};
    CompressOptions& c = settings.method_settings.centroidkv.compression;
    c.chunk_size = 32;
    c.sink_tokens = 4;
    c.recent_tokens = 32;
    c.uniform_heads = false;
    c.min_similarity = 0.6;
    settings.method_settings.outlier_heads = {{1}, {}, {0, 3}};
    return settings;
  }

  std::vector<std::vector<int32_t>> Texts() {
    std::vector<std::vector<int32_t>> texts;
    for (uint64_t seed : {801, 802, 803}) {
      absl::StatusOr<std::vector<int32_t>> text = SampleText(transformer_, 200, 0.8f, seed);
      EXPECT_TRUE(text.ok()) << text.status();
      if (text.ok()) texts.push_back(*text);
    }
    return texts;
  }

  Transformer transformer_{*testutil::Stories260K()};
};

TEST_F(QualityRunTest, PaddedResultsGiveExactlyTheUnpaddedQuality) {
  const std::vector<std::vector<int32_t>> texts = Texts();
  ASSERT_EQ(texts.size(), 3u);
  const RunSettings plain = UnevenSettings();
  RunSettings by_layer = plain;
  by_layer.method_settings.centroidkv.compression.pad_heads = true;
  RunSettings to_fixed = plain;
  to_fixed.method_settings.centroidkv.compression.pad_to = 160;
  absl::StatusOr<std::vector<MethodResult>> expected =
      RunQuality(transformer_, client_, texts, plain);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const RunSettings& padded : {by_layer, to_fixed}) {
    absl::StatusOr<std::vector<MethodResult>> got =
        RunQuality(transformer_, client_, texts, padded);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), expected->size());
    for (size_t m = 0; m < got->size(); ++m) {
      const MethodResult& a = (*got)[m];
      const MethodResult& b = (*expected)[m];
      SCOPED_TRACE(a.method);
      EXPECT_EQ(a.agreement.kl_sum, b.agreement.kl_sum);
      EXPECT_EQ(a.agreement.top1_matches, b.agreement.top1_matches);
      EXPECT_EQ(a.agreement.steps, 3 * 40);
      EXPECT_EQ(a.entries_kept, b.entries_kept);  // padding rows are not entries
      EXPECT_EQ(a.targets.layers, 3 * 5);
      EXPECT_EQ(a.targets.layers_missed, b.targets.layers_missed);
      // Outlier heads keep every prefill entry: the others are padded up to them (pad_to:
      // every head up to 160).
      const bool fixed = padded.method_settings.centroidkv.compression.pad_to > 0;
      if (a.method == kCentroidKvOutliers || fixed) {
        EXPECT_GT(a.targets.padding_rows, 0);
      }
      EXPECT_EQ(b.targets.padding_rows, 0);
      RecordProperty(a.method + "_mean_kl", std::to_string(a.agreement.mean_kl()));
      RecordProperty(a.method + "_top1", std::to_string(a.agreement.top1()));
    }
  }
}

TEST_F(QualityRunTest, MissedTargetsReachTheOutput) {
  RunSettings settings = UnevenSettings();
  settings.methods = {kCentroidKv, kStreamingLlm};
  settings.method_settings.centroidkv.compression.min_similarity = 0.95;
  const std::vector<std::vector<int32_t>> texts = Texts();
  absl::StatusOr<std::vector<MethodResult>> floored =
      RunQuality(transformer_, client_, texts, settings);
  ASSERT_TRUE(floored.ok()) << floored.status();
  const MethodResult& centroidkv = (*floored)[0];
  EXPECT_GT(centroidkv.targets.layers_missed, 0);
  EXPECT_EQ((*floored)[1].targets.layers, 0);  // in-process: no account
  std::string json = JsonLine(*floored);
  EXPECT_NE(json.find("\"target_reached\": false"), std::string::npos) << json;
  // exact_target: every layer reaches its target, and the output says so.
  settings.method_settings.centroidkv.compression.exact_target = true;
  absl::StatusOr<std::vector<MethodResult>> exact =
      RunQuality(transformer_, client_, texts, settings);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ((*exact)[0].targets.layers_missed, 0);
  EXPECT_EQ((*exact)[0].targets.layers, 3 * 5);
  json = JsonLine(*exact);
  EXPECT_NE(json.find("\"target_reached\": true, \"layers_target_missed\": 0"), std::string::npos)
      << json;
}

}  // namespace
}  // namespace centroidkv::worker::quality
