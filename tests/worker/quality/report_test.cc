// Tests of worker/quality/report.cc and texts.cc: the JSON line, the target check,
// the markdown report, and reading a tokens file.
#include "worker/quality/report.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "worker/quality/texts.h"
#include "gtest/gtest.h"

namespace centroidkv::worker::quality {
namespace {

MethodResult Result(const std::string& method, double budget, double kl, int64_t matches) {
  MethodResult r;
  r.method = method;
  r.budget = budget;
  r.agreement.kl_sum = kl * 100;
  r.agreement.top1_matches = matches;
  r.agreement.steps = 100;
  r.texts = {r.agreement};
  r.entries_kept = 25;
  r.entries_full = 100;
  return r;
}

TEST(ReportTest, JsonLineHasEveryMethodAndBudget) {
  const std::string json =
      JsonLine({Result("centroidkv", 0.25, 0.01, 99), Result("kmeans", 0.5, 0.5, 90)});
  EXPECT_EQ(json,
            "[{\"method\": \"centroidkv\", \"budget\": 0.25, \"mean_kl\": 0.01, \"top1\": 0.99, "
            "\"kv_fraction\": 0.25}, {\"method\": \"kmeans\", \"budget\": 0.5, \"mean_kl\": 0.5, "
            "\"top1\": 0.9, \"kv_fraction\": 0.25}]");
}

TEST(ReportTest, TargetsCompareWithTheBestBaselineAtThatBudget) {
  const std::vector<MethodResult> results = {
      Result("centroidkv", 0.25, 0.02, 99), Result("streamingllm", 0.25, 0.01, 97),
      Result("h2o", 0.25, 0.05, 95), Result("kmeans", 0.5, 0.001, 99)};
  const std::vector<TargetCheck> checks = CheckTargets(results, 0.25);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_TRUE(checks[0].top1_met);
  EXPECT_FALSE(checks[0].kl_met);
  EXPECT_EQ(checks[0].best_baseline, "streamingllm");
  ReportContext context;
  context.command = "centroidkv-quality --texts 8";
  context.settings.budgets = {0.5, 0.25};
  const std::string md = MarkdownReport(results, context);
  EXPECT_NE(md.find("centroidkv-quality --texts 8"), std::string::npos);
  EXPECT_NE(md.find("| 25.0% | centroidkv | 25.0% | 0.02000 | 0.9900 |"), std::string::npos) << md;
  EXPECT_NE(md.find("**missed**"), std::string::npos);
}

TEST(TextsTest, ReadsTokensFileAndNamesBadLines) {
  const std::string path = ::testing::TempDir() + "/ckv_tokens.txt";
  {
    std::ofstream out(path);
    out << "1 403 407 261\n\n1 5 6 7 8\n";
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> texts = ReadTokensFile(path, 512, 4);
  ASSERT_TRUE(texts.ok()) << texts.status();
  EXPECT_EQ(*texts, (std::vector<std::vector<int32_t>>{{1, 403, 407, 261}, {1, 5, 6, 7, 8}}));
  EXPECT_EQ(ReadTokensFile(path, 512, 5).status().code(), absl::StatusCode::kInvalidArgument);
  {
    std::ofstream out(path);
    out << "1 2 3\n1 600 2\n";
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> bad = ReadTokensFile(path, 512, 1);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos) << bad.status();
  {
    std::ofstream out(path);
    out << "403 407\n";
  }
  EXPECT_NE(ReadTokensFile(path, 512, 1).status().message().find("BOS"), std::string::npos);
  std::remove(path.c_str());
  EXPECT_EQ(ReadTokensFile(path, 512, 1).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace centroidkv::worker::quality
