// Tests of worker/online_generation.cc on stories260K through a live in-process server: a
// long generation keeps every method at its budget, CentroidKV's splices land (pipelined or
// waiting every step) and its next-token distributions stay close to the uncompressed run;
// a budget that covers the whole text changes nothing.
#include "worker/online_generation.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"
#include "worker/evaluation.h"
#include "worker/sampler.h"

namespace centroidkv::worker {
namespace {

class OnlineGenerationTest : public testutil::LiveServerTest {
 protected:
  OnlineSettings Settings(int64_t budget) const {
    OnlineSettings s;
    s.prompt_tokens = 16;
    s.budget_entries = budget;
    s.sink_tokens = 4;
    s.recent_tokens = 32;
    s.chunk_tokens = 32;
    s.compression.chunk_size = 32;
    s.backend = BackendKind::kCpu;
    return s;
  }

  Agreement Compare(const OnlineRun& full, const OnlineRun& run) const {
    Agreement a;
    EXPECT_EQ(run.logits.size(), full.logits.size());
    for (size_t i = 0; i < run.logits.size() && i < full.logits.size(); ++i) {
      a.Add(CompareStep(full.logits[i], run.logits[i]));
    }
    return a;
  }
};

TEST_F(OnlineGenerationTest, EveryMethodKeepsItsBudgetAndCentroidKvStaysClose) {
  const Model* model = testutil::Stories260K();
  ASSERT_NE(model, nullptr);
  Transformer transformer(*model);
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 320, 0.8f, 7);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const int64_t budget = 128;
  auto full = RunOnline(transformer, *tokens, OnlineMethod::kFull, Settings(budget), nullptr);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->logits.size(), 320u - 16u);
  EXPECT_EQ(full->final_rows, 320);
  for (bool pipelined : {false, true}) {
    OnlineSettings s = Settings(budget);
    s.pipelined = pipelined;
    auto run = RunOnline(transformer, *tokens, OnlineMethod::kCentroidKv, s, client_);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_LE(run->final_rows, budget);
    EXPECT_GT(run->splices_applied, 0);
    if (!pipelined) {  // every splice lands before the next step
      EXPECT_LE(run->max_rows, budget);
    }
    const Agreement a = Compare(*full, *run);
    EXPECT_GT(a.top1(), 0.9) << "pipelined " << pipelined;
    EXPECT_LT(a.mean_kl(), 0.05) << "pipelined " << pipelined;
  }
  for (OnlineMethod method : {OnlineMethod::kStreamingLlm, OnlineMethod::kH2o}) {
    auto run = RunOnline(transformer, *tokens, method, Settings(budget), nullptr);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->max_rows, budget) << OnlineMethodName(method);
  }
}

TEST_F(OnlineGenerationTest, ABudgetAboveTheTextChangesNothing) {
  const Model* model = testutil::Stories260K();
  ASSERT_NE(model, nullptr);
  Transformer transformer(*model);
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 160, 0.8f, 8);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const OnlineSettings s = Settings(400);
  auto full = RunOnline(transformer, *tokens, OnlineMethod::kFull, s, nullptr);
  auto online = RunOnline(transformer, *tokens, OnlineMethod::kCentroidKv, s, client_);
  ASSERT_TRUE(full.ok() && online.ok()) << online.status();
  EXPECT_EQ(online->splices_applied, 0);  // chunks wait as they are while there is room
  EXPECT_EQ(online->logits, full->logits);
}

}  // namespace
}  // namespace centroidkv::worker
