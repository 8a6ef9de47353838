// Tests of models/longctx (the long-context test model trained by models/longctx/train.py):
// the C++ worker loads its llama2.c file unchanged (head size 64, grouped-query attention,
// the tok512 vocabulary, a 1024-token context) and, with the full cache, answers the
// held-out retrieval cases the model card reports (pass key, multi-key, variable tracking),
// decoding each answer greedily after a prompt that fills the context.
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/model.h"
#include "worker/sampler.h"
#include "worker/transformer.h"
#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

std::string ModelDir() { return std::string(CKV_SOURCE_DIR) + "/models/longctx"; }

struct RetrievalCase {
  std::string kind;
  double depth = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> answer;
};

std::vector<RetrievalCase> ReadCases(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  const nlohmann::json cases = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<RetrievalCase> out;
  if (!cases.is_array()) {
    ADD_FAILURE() << path << " is not a JSON array";
    return out;
  }
  for (const nlohmann::json& c : cases) {
    out.push_back({c.at("kind").get<std::string>(), c.at("depth").get<double>(),
                   c.at("prompt").get<std::vector<int32_t>>(),
                   c.at("answer").get<std::vector<int32_t>>()});
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
}

TEST(LongContextModelTest, FullCacheAnswersHeldOutRetrievalCases) {
  absl::StatusOr<Model> model = LoadModel(ModelDir() + "/model.bin");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<RetrievalCase> cases = ReadCases(ModelDir() + "/test_cases.json");
  ASSERT_GE(cases.size(), 6u);
  Transformer transformer(*model);
  int correct = 0;
  for (const RetrievalCase& c : cases) {
    // The prompt reaches to the last answer token's position: the context is (nearly) full.
    ASSERT_LE(c.prompt.size() + c.answer.size(), static_cast<size_t>(model->config().seq_len));
    // GenerateGreedy counts forward passes: the prompt's, then one per answer token but the last.
    const int32_t steps = static_cast<int32_t>(c.prompt.size() + c.answer.size()) - 1;
    absl::StatusOr<std::vector<int32_t>> tokens = GenerateGreedy(transformer, c.prompt, steps);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    const std::vector<int32_t> answer(tokens->begin() + static_cast<long>(c.prompt.size()),
                                      tokens->end());
    const bool hit = answer == c.answer;
    correct += hit;
    if (!hit) ADD_FAILURE() << "missed: " << c.kind << " at depth " << c.depth;
  }
  EXPECT_EQ(correct, static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace centroidkv::worker
