// Tests of worker/model.cc: the stories260K header and sizes, and clear errors for
// missing, truncated, inconsistent and non-finite checkpoints; a non-shared classifier.
#include "worker/model.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

// A checkpoint of `config` in memory, every weight `fill` (header vocab negative when the
// classifier is not shared).
std::string SyntheticCheckpoint(const ModelConfig& config, float fill) {
  const int32_t header[7] = {
      config.dim,        config.hidden_dim,
      config.n_layers,   config.n_heads,
      config.n_kv_heads, config.shared_classifier ? config.vocab_size : -config.vocab_size,
      config.seq_len};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  const std::vector<float> weights(static_cast<size_t>(CheckpointFloatCount(config)), fill);
  bytes.append(reinterpret_cast<const char*>(weights.data()), weights.size() * sizeof(float));
  return bytes;
}

ModelConfig TinyConfig() {
  ModelConfig c{.dim = 8, .hidden_dim = 12, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
      .vocab_size = 16, .seq_len = 10};
  return c;
}

TEST(ModelTest, LoadsStories260KShapesFromTheHeader) {
  const Model* model = testutil::Stories260K();
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(c.kv_group(), 2);
  EXPECT_EQ(model->ParameterCount(), 260032);
  EXPECT_EQ(model->classifier(), model->embedding());
  EXPECT_EQ(c.rope_theta, 10000.0f);  // read from the legacy RoPE table
}

// A legacy table as llama2.c's export writes it: cos then sin of pos * base^(-2j/hs).
std::vector<float> RopeTable(double base, int32_t seq_len, int32_t head_size) {
  const int32_t half = head_size / 2;
  std::vector<float> table(2 * static_cast<size_t>(seq_len) * half);
  for (int32_t pos = 0; pos < seq_len; ++pos) {
    for (int32_t j = 0; j < half; ++j) {
      const double angle = pos * std::pow(base, -2.0 * j / head_size);
      table[static_cast<size_t>(pos) * half + j] = static_cast<float>(std::cos(angle));
      table[static_cast<size_t>(seq_len + pos) * half + j] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

TEST(ModelTest, RopeBaseComesFromTheLegacyTable) {
  for (const double base : {10000.0, 500000.0, 1000000.0}) {
    const std::vector<float> table = RopeTable(base, 1024, 64);
    EXPECT_EQ(RopeThetaOfTable(table.data(), 1024, 64), static_cast<float>(base)) << base;
  }
  EXPECT_EQ(RopeThetaOfTable(RopeTable(10000.0, 512, 8).data(), 512, 8), 10000.0f);
  // A table that cannot tell (one position, or all zero) means llama2.c's 10000.
  EXPECT_EQ(RopeThetaOfTable(RopeTable(500000.0, 1, 64).data(), 1, 64), 10000.0f);
  const std::vector<float> zeros(2 * 16 * 4, 0.0f);
  EXPECT_EQ(RopeThetaOfTable(zeros.data(), 16, 8), 10000.0f);
}

TEST(ModelTest, MissingFileIsNotFound) {
  absl::StatusOr<Model> model = LoadModel("/nonexistent/stories.bin");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelTest, TruncatedCheckpointNamesBothSizes) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(testutil::ModelPath());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Model> model = ParseModel(bytes->substr(0, bytes->size() - 4), "cut.bin");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("1056536 bytes"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("need 1056540"), std::string::npos) << model.status();
  EXPECT_EQ(ParseModel("short", "x.bin").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, InconsistentHeadersAreInvalidArgument) {
  ModelConfig c = TinyConfig();
  c.n_heads = 3;  // 8 is not a multiple of 3
  EXPECT_EQ(ParseModel(SyntheticCheckpoint(TinyConfig(), 0.f).replace(12, 4, "\3\0\0\0", 4), "h")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ValidateConfig(c).ok());
  c = TinyConfig();
  c.n_kv_heads = 0;
  EXPECT_FALSE(ValidateConfig(c).ok());
  c = TinyConfig();
  c.n_heads = 8;  // head size 1 cannot be rotated in pairs
  c.n_kv_heads = 8;
  EXPECT_NE(ValidateConfig(c).message().find("even"), std::string::npos);
}

TEST(ModelTest, NonFiniteWeightIsInvalidArgument) {
  std::string bytes = SyntheticCheckpoint(TinyConfig(), 0.5f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 28 + 4 * 100, &nan, sizeof(nan));
  absl::StatusOr<Model> model = ParseModel(bytes, "nan.bin");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("float 100"), std::string::npos) << model.status();
}

TEST(ModelTest, NegativeVocabMeansASeparateClassifierAfterTheRopeTable) {
  ModelConfig c = TinyConfig();
  c.shared_classifier = false;
  std::string bytes = SyntheticCheckpoint(c, 0.25f);
  const float last = 7.0f;  // the classifier is the file's last tensor
  std::memcpy(bytes.data() + bytes.size() - sizeof(float), &last, sizeof(last));
  absl::StatusOr<Model> model = ParseModel(bytes, "unshared.bin");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE(model->config().shared_classifier);
  EXPECT_EQ(model->config().vocab_size, 16);
  EXPECT_NE(model->classifier(), model->embedding());
  EXPECT_EQ(model->classifier()[c.vocab_size * c.dim - 1], 7.0f);
  // The same bytes read as a shared-classifier model have one tensor too many.
  c.shared_classifier = true;
  bytes.replace(20, 4, reinterpret_cast<const char*>(&c.vocab_size), 4);
  EXPECT_EQ(ParseModel(bytes, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace centroidkv::worker
