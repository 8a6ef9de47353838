// Tests of models/longctx (the long-context test model trained by models/longctx/train.py):
// the C++ worker loads its llama2.c file unchanged (head size 64, grouped-query attention,
// the tok512 vocabulary, a 1024-token context, RoPE base 500000 read from the file's legacy
// table) and, with the full cache, answers the held-out retrieval cases (pass key,
// multi-key, variable tracking) exactly as the PyTorch model that trained it does, decoding
// each answer greedily after a prompt that fills the context, and gets them right.
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/model.h"
#include "worker/quality/retrieval.h"
#include "worker/transformer.h"
#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

std::string ModelDir() { return std::string(CKV_SOURCE_DIR) + "/models/longctx"; }

struct HeldOutCase {
  std::string kind;
  double depth = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> answer;
  std::vector<int32_t> greedy;  // what the PyTorch model decodes (models/longctx/cases.py)
  std::vector<float> logits;    // PyTorch's logits after the prompt
};

std::vector<HeldOutCase> ReadCases(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  const nlohmann::json cases = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<HeldOutCase> out;
  if (!cases.is_array()) {
    ADD_FAILURE() << path << " is not a JSON array";
    return out;
  }
  for (const nlohmann::json& c : cases) {
    out.push_back({c.at("kind").get<std::string>(), c.at("depth").get<double>(),
                   c.at("prompt").get<std::vector<int32_t>>(),
                   c.at("answer").get<std::vector<int32_t>>(),
                   c.at("greedy").get<std::vector<int32_t>>(),
                   c.at("logits").get<std::vector<float>>()});
  }
  return out;
}

TEST(LongContextModelTest, LoadsWithHeadSize64AndGroupedQueries) {
  absl::StatusOr<Model> model = LoadModel(ModelDir() + "/model.bin");
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_GE(c.n_heads, 4);
  EXPECT_GT(c.kv_group(), 1);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_GE(c.seq_len, 1024);
  EXPECT_EQ(c.rope_theta, 500000.0f);
}

TEST(LongContextModelTest, FullCacheDecodesHeldOutCasesAsTheTrainingModelDoes) {
  absl::StatusOr<Model> model = LoadModel(ModelDir() + "/model.bin");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<HeldOutCase> cases = ReadCases(ModelDir() + "/test_cases.json");
  ASSERT_GE(cases.size(), 6u);
  Transformer transformer(*model);
  int correct = 0, expected_correct = 0;
  for (const HeldOutCase& c : cases) {
    // The prompt reaches to the last answer token's position: the context is (nearly) full.
    ASSERT_LE(c.prompt.size() + c.answer.size(), static_cast<size_t>(model->config().seq_len));
    KvCache cache = transformer.NewCache();
    ASSERT_TRUE(transformer.Prefill(c.prompt, &cache).ok());
    ASSERT_EQ(transformer.logits().size(), c.logits.size());
    for (size_t i = 0; i < c.logits.size(); ++i) {
      ASSERT_NEAR(transformer.logits()[i], c.logits[i], 2e-3f) << c.kind << " logit " << i;
    }
    // No question: the prompt already ends where the answer starts.
    absl::StatusOr<std::vector<int32_t>> answer =
        quality::AnswerGreedily(transformer, {}, c.answer.size(), &cache);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(*answer, c.greedy) << c.kind << " at depth " << c.depth;
    correct += *answer == c.answer;
    expected_correct += c.greedy == c.answer;
  }
  // The worker's accuracy on these cases is the reference's, and the model retrieves: the
  // card's bar is 0.9 of the held-out cases with the full cache.
  EXPECT_EQ(correct, expected_correct) << "of " << cases.size();
  EXPECT_GE(10 * correct, 9 * static_cast<int>(cases.size())) << correct << " of " << cases.size();
}

}  // namespace
}  // namespace centroidkv::worker
