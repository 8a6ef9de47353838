// Tests of worker/quality/online_report.cc: a short report through a live in-process server
// has the uncompressed run first and every method at every budget, sane agreements, and a
// page and JSON line that name them all; Quantile is the nearest rank.
#include "worker/quality/online_report.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"
#include "worker/sampler.h"

namespace centroidkv::worker::quality {
namespace {

class OnlineReportTest : public testutil::LiveServerTest {};

TEST_F(OnlineReportTest, ReportsEveryMethodAtEveryBudget) {
  const Model* model = testutil::Stories260K();
  ASSERT_NE(model, nullptr);
  Transformer transformer(*model);
  absl::StatusOr<std::vector<int32_t>> text = SampleText(transformer, 200, 0.8f, 3);
  ASSERT_TRUE(text.ok()) << text.status();
  OnlineReportSettings settings;
  settings.budgets = {0.5};
  settings.online.compression.chunk_size = 32;
  settings.online.backend = BackendKind::kCpu;
  auto results = RunOnlineReport(transformer, client_, {*text}, settings);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 5u);
  EXPECT_EQ((*results)[0].method, "full");
  EXPECT_EQ((*results)[0].step_seconds.size(), 200u - 16u);
  for (size_t i = 1; i < results->size(); ++i) {
    const OnlineMethodResult& r = (*results)[i];
    EXPECT_EQ(r.budget_entries, 100);
    EXPECT_EQ(r.agreement.steps, 200 - 16) << r.method;
    EXPECT_GT(r.agreement.top1(), 0.8) << r.method;
    EXPECT_LE(r.final_rows, 100) << r.method;
  }
  const std::string page = OnlineMarkdownReport(*results, "context line");
  const std::string json = OnlineJsonLine(*results);
  for (const char* method :
       {"full", "centroidkv (pipelined)", "centroidkv (waits every step)", "streamingllm", "h2o"}) {
    EXPECT_NE(page.find(method), std::string::npos) << method;
    EXPECT_NE(json.find(method), std::string::npos) << method;
  }
  EXPECT_NE(page.find("context line"), std::string::npos);
}

TEST(QuantileTest, IsTheNearestRank) {
  EXPECT_EQ(Quantile({}, 0.5), 0.0);
  EXPECT_EQ(Quantile({3, 1, 2}, 0.5), 2.0);
  EXPECT_EQ(Quantile({1, 2, 3, 4}, 0.5), 2.0);
  EXPECT_EQ(Quantile({1, 2, 3, 4}, 0.99), 4.0);
}

}  // namespace
}  // namespace centroidkv::worker::quality
