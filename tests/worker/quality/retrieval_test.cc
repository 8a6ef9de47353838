// Tests of worker/quality/retrieval.cc on stories260K through a live server: the cases
// file's checks name the line, the full cache reproduces its own greedy answer, every
// method's kept fraction matches its budget, and the table and JSON carry the cells.
#include "worker/quality/retrieval.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker::quality {
namespace {

std::string WriteCases(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("ckv_retrieval_", name, "_", ::testing::UnitTest::GetInstance()->random_seed(),
                    "_", getpid(), ".txt"))
          .string();
  std::ofstream(path) << text;
  return path;
}

TEST(RetrievalCasesTest, ReadsCasesAndNamesTheBadLine) {
  const std::string good = WriteCases("good", "passkey 0.5 | 1 403 407 | 261 | 378 432\n\n");
  absl::StatusOr<std::vector<RetrievalCase>> cases = ReadRetrievalCases(good, 512, 512);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_EQ(cases->size(), 1u);
  EXPECT_EQ((*cases)[0].kind, "passkey");
  EXPECT_EQ((*cases)[0].depth, 0.5);
  EXPECT_EQ((*cases)[0].context, (std::vector<int32_t>{1, 403, 407}));
  EXPECT_EQ((*cases)[0].question, (std::vector<int32_t>{261}));
  EXPECT_EQ((*cases)[0].answer, (std::vector<int32_t>{378, 432}));

  const std::string bad_id = WriteCases("bad_id", "a 0 | 1 2 | 3 | 4\nb 0 | 1 | 999 | 4\n");
  absl::StatusOr<std::vector<RetrievalCase>> rejected = ReadRetrievalCases(bad_id, 512, 512);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("line 2"), std::string::npos) << rejected.status();
  EXPECT_NE(rejected.status().message().find("999"), std::string::npos);

  const std::string no_bos = WriteCases("no_bos", "a 0 | 5 6 | 3 | 4\n");
  EXPECT_NE(ReadRetrievalCases(no_bos, 512, 512).status().message().find("BOS"),
            std::string::npos);
  // 4 context + 1 question + 2 answer tokens fill 6 positions (the last answer token is not fed).
  const std::string too_long = WriteCases("too_long", "a 0 | 1 5 6 7 | 3 | 4 5\n");
  EXPECT_NE(ReadRetrievalCases(too_long, 512, 5).status().message().find("context of 5"),
            std::string::npos);
  const std::string fields = WriteCases("fields", "a 0 | 1 5 | 3\n");
  EXPECT_EQ(ReadRetrievalCases(fields, 512, 512).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const std::string& p : {good, bad_id, no_bos, too_long, fields}) std::filesystem::remove(p);
}

class RetrievalRunTest : public testutil::LiveServerTest {
 protected:
  Transformer transformer_{*testutil::Stories260K()};
};

TEST_F(RetrievalRunTest, FullCacheReproducesItsAnswerAndBudgetsAreKept) {
  absl::StatusOr<std::vector<int32_t>> text = SampleText(transformer_, 220, 0.8f, 901);
  ASSERT_TRUE(text.ok()) << text.status();
  RetrievalCase c;
  c.kind = "story";
  c.depth = 0.5;
  c.context.assign(text->begin(), text->begin() + 200);
  c.question.assign(text->begin() + 200, text->end());
  // The answer is what the full cache decodes, so the full cache must match it exactly.
  KvCache cache = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(c.context, &cache).ok());
  absl::StatusOr<std::vector<int32_t>> answer =
      AnswerGreedily(transformer_, c.question, 6, &cache);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->size(), 6u);
  c.answer = *answer;

  RetrievalSettings settings;
  settings.budgets = {0.5, 0.25};
  settings.methods = {kCentroidKv, kStreamingLlm, kH2o, kSnapKv};
  CompressOptions& options = settings.method_settings.centroidkv.compression;
  options.chunk_size = 32;
  options.sink_tokens = 4;
  options.recent_tokens = 32;
  std::vector<std::string> lines;
  absl::StatusOr<std::vector<RetrievalCell>> cells = RunRetrieval(
      transformer_, client_, {c, c}, settings,
      [&lines](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(cells.ok()) << cells.status();
  EXPECT_EQ(lines.size(), 2u);
  ASSERT_EQ(cells->size(), 9u);  // full + 2 budgets x 4 methods, one (kind, depth, length)
  for (const RetrievalCell& cell : *cells) {
    EXPECT_EQ(cell.cases, 2) << cell.method;
    EXPECT_EQ(cell.length, 256) << cell.method;  // 200 + 20 + 6 tokens
    const double kept = static_cast<double>(cell.entries_kept) / cell.entries_full;
    if (cell.method == kFullCache) {
      EXPECT_EQ(cell.hits, 2);
      EXPECT_EQ(kept, 1.0);
    } else {
      EXPECT_LE(kept, cell.budget + 0.01) << cell.method << " at " << cell.budget;
      EXPECT_GE(kept, cell.budget - 0.05) << cell.method << " at " << cell.budget;
    }
  }
  const std::string md = RetrievalMarkdown(*cells);
  EXPECT_NE(md.find("| 100% | full | 100.0% | 1.000 (2/2) | 1.000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 25% | h2o |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 25% | snapkv |"), std::string::npos) << md;
  EXPECT_NE(RetrievalJson(*cells).find("\"method\":\"centroidkv\",\"budget\":0.25"),
            std::string::npos);
}

TEST_F(RetrievalRunTest, CalibrationScoresEveryHeadAndRanksTheMostHarmfulFirst) {
  absl::StatusOr<std::vector<int32_t>> text = SampleText(transformer_, 140, 0.8f, 902);
  ASSERT_TRUE(text.ok()) << text.status();
  RetrievalCase c;
  c.kind = "story";
  c.context.assign(text->begin(), text->begin() + 128);
  c.question.assign(text->begin() + 128, text->begin() + 136);
  c.answer.assign(text->begin() + 136, text->end());
  MethodSettings settings;
  settings.centroidkv.compression.chunk_size = 32;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 16;
  absl::StatusOr<std::vector<HeadRetrievalScore>> scores =
      ScoreHeadsOnCases(transformer_, *client_, {c}, settings, 0.25);
  ASSERT_TRUE(scores.ok()) << scores.status();
  const ModelConfig& config = transformer_.model().config();
  ASSERT_EQ(scores->size(), static_cast<size_t>(config.n_layers * config.n_kv_heads));
  // The reference: the answer's NLL with the full cache, which no single compressed head
  // can beat by much, and which at least one head's compression makes worse.
  KvCache full = transformer_.NewCache();
  ASSERT_TRUE(transformer_.Prefill(c.context, &full).ok());
  absl::StatusOr<double> full_nll = AnswerNll(transformer_, c.question, c.answer, &full);
  ASSERT_TRUE(full_nll.ok());
  for (size_t i = 0; i < scores->size(); ++i) {
    EXPECT_EQ((*scores)[i].cases, 1);
    if (i > 0) {
      EXPECT_GE((*scores)[i - 1].answer_nll, (*scores)[i].answer_nll);
    }
  }
  EXPECT_GT(scores->front().answer_nll, *full_nll);
}

}  // namespace
}  // namespace centroidkv::worker::quality
