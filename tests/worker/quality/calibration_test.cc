// Tests of worker/quality/calibration.cc: the text form of passthrough heads per
// layer, picking outlier heads from scores, and calibration through a live server.
#include "worker/quality/calibration.h"

#include <vector>

#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker::quality {
namespace {

using PerLayer = std::vector<std::vector<int32_t>>;

TEST(CalibrationTest, HeadsPerLayerRoundTripThroughText) {
  absl::StatusOr<PerLayer> heads = ParseHeads("3:2,0;0:1;3:2", 5, 4);
  ASSERT_TRUE(heads.ok()) << heads.status();
  EXPECT_EQ(*heads, (PerLayer{{1}, {}, {}, {0, 2}, {}}));
  EXPECT_EQ(FormatHeads(*heads), "0:1;3:0,2");
  EXPECT_EQ(*ParseHeads("1,3", 2, 4), (PerLayer{{1, 3}, {1, 3}}));
  EXPECT_EQ(FormatHeads(PerLayer(5)), "");
  EXPECT_EQ(*ParseHeads("", 2, 4), PerLayer(2));
}

TEST(CalibrationTest, BadHeadsAreInvalidArgument) {
  EXPECT_EQ(ParseHeads("5:1", 5, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHeads("0:4", 5, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHeads("x:1", 5, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHeads("1,-1", 5, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CalibrationTest, PicksTheMostHarmfulHeads) {
  std::vector<HeadScore> scores = {{2, 1, {}}, {0, 3, {}}, {2, 0, {}}, {4, 2, {}}};
  EXPECT_EQ(PickOutlierHeads(scores, 3, 5), (PerLayer{{3}, {}, {0, 1}, {}, {}}));
  EXPECT_EQ(PickOutlierHeads(scores, 0, 2), PerLayer(2));
}

class CalibrationServerTest : public testutil::LiveServerTest {};

TEST_F(CalibrationServerTest, ScoresEveryHeadMostHarmfulFirst) {
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 140, 0.8f, 77);
  ASSERT_TRUE(tokens.ok());
  absl::StatusOr<PrefilledText> text = PrefillText(transformer, *tokens, 128, {});
  ASSERT_TRUE(text.ok());
  MethodSettings settings;
  settings.centroidkv.compression.chunk_size = 64;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 32;
  absl::StatusOr<std::vector<HeadScore>> scores =
      ScoreHeads(transformer, *client_, {*text}, settings, 0.25);
  ASSERT_TRUE(scores.ok()) << scores.status();
  ASSERT_EQ(scores->size(), 20u);
  for (size_t i = 1; i < scores->size(); ++i) {
    EXPECT_GE((*scores)[i - 1].agreement.mean_kl(), (*scores)[i].agreement.mean_kl());
    EXPECT_EQ((*scores)[i].agreement.steps, 12);
  }
  EXPECT_GT(scores->front().agreement.mean_kl(), 0.0);
}

}  // namespace
}  // namespace centroidkv::worker::quality
