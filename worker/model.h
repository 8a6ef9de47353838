// A llama2.c-format checkpoint ("version 0" legacy layout, float32) held in memory: the
// header's shapes and the weights, read once and then only read. Any model of this format
// loads; stories260K (../shared/models) is the one the tests and the quality report use.
//
// Layout of the file (../shared/models/README.md): 7 little-endian int32 (dim, hidden_dim,
// n_layers, n_heads, n_kv_heads, vocab_size, seq_len), then float32 tensors, row-major
// [out, in]: embedding [V, D], rms_att [L, D], wq [L, D, D], wk [L, KV, D], wv [L, KV, D],
// wo [L, D, D], rms_ffn [L, D], w1 [L, F, D], w2 [L, D, F], w3 [L, F, D], rms_final [D],
// a legacy RoPE table [S, hs/2] x 2 (read only for its base, RopeThetaOfTable), and the
// classifier [V, D] only when the header's vocab_size is negative (otherwise the embedding
// is shared).
//
// Thread-safety: immutable after LoadModel(); share one Model between threads freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace centroidkv::worker {

struct ModelConfig {
  int32_t dim = 0;                // D, the residual width
  int32_t hidden_dim = 0;         // F, the FFN width
  int32_t n_layers = 0;           // L
  int32_t n_heads = 0;            // query heads
  int32_t n_kv_heads = 0;         // key/value heads (grouped-query attention)
  int32_t vocab_size = 0;         // V (always positive here)
  int32_t seq_len = 0;            // the context the model was trained for
  bool shared_classifier = true;  // logits = embedding @ x (header vocab_size > 0)
  float rope_theta = 10000.0f;    // RoPE base, from the legacy table (10000 in llama2.c's files)

  int32_t head_size() const { return dim / n_heads; }
  int32_t kv_dim() const { return head_size() * n_kv_heads; }
  // Query heads per KV head: query head h reads KV head h / kv_group().
  int32_t kv_group() const { return n_heads / n_kv_heads; }
};

// Checks the header's shapes: positive, divisible, an even head size (RoPE rotates pairs).
absl::Status ValidateConfig(const ModelConfig& config);

// The RoPE base that wrote a legacy table (cos [S, hs/2] then sin [S, hs/2]): from the
// slowest pair's angle at the last position, rounded to 4 significant digits, so that
// llama2.c's own files give exactly 10000 and models/longctx (RoPE base 500000) its own.
// 10000 where the table cannot tell (seq_len < 2, or a zero angle).
float RopeThetaOfTable(const float* table, int32_t seq_len, int32_t head_size);

// Float32 values the weights of `config` occupy after the header, the legacy RoPE table
// and the optional classifier included.
int64_t CheckpointFloatCount(const ModelConfig& config);

class Model {
 public:
  const ModelConfig& config() const { return config_; }

  // Row-major [out, in] matrices and per-layer vectors; `layer` in [0, n_layers).
  const float* embedding() const { return at(embedding_); }  // [V, D]
  const float* rms_att(int32_t layer) const { return at(rms_att_, layer, dim()); }
  const float* wq(int32_t layer) const { return at(wq_, layer, dim() * dim()); }
  const float* wk(int32_t layer) const { return at(wk_, layer, kv() * dim()); }
  const float* wv(int32_t layer) const { return at(wv_, layer, kv() * dim()); }
  const float* wo(int32_t layer) const { return at(wo_, layer, dim() * dim()); }
  const float* rms_ffn(int32_t layer) const { return at(rms_ffn_, layer, dim()); }
  const float* w1(int32_t layer) const { return at(w1_, layer, hidden() * dim()); }
  const float* w2(int32_t layer) const { return at(w2_, layer, dim() * hidden()); }
  const float* w3(int32_t layer) const { return at(w3_, layer, hidden() * dim()); }
  const float* rms_final() const { return at(rms_final_); }
  const float* classifier() const { return at(classifier_); }  // [V, D]

  // Parameters counted once (the shared classifier and the legacy RoPE table excluded).
  int64_t ParameterCount() const;

 private:
  friend absl::StatusOr<Model> ParseModel(const std::string& bytes, const std::string& name);

  int64_t dim() const { return config_.dim; }
  int64_t kv() const { return config_.kv_dim(); }
  int64_t hidden() const { return config_.hidden_dim; }
  const float* at(int64_t offset, int64_t layer = 0, int64_t stride = 0) const {
    return weights_.data() + offset + layer * stride;
  }

  ModelConfig config_;
  std::vector<float> weights_;  // everything after the header, as in the file
  // Element offsets of each tensor in weights_.
  int64_t embedding_ = 0, rms_att_ = 0, wq_ = 0, wk_ = 0, wv_ = 0, wo_ = 0, rms_ffn_ = 0;
  int64_t w1_ = 0, w2_ = 0, w3_ = 0, rms_final_ = 0, classifier_ = 0;
};

// Parses a checkpoint held in `bytes`; `name` labels errors (InvalidArgument for a bad
// header, a size that does not match the header's shapes, or non-finite weights).
absl::StatusOr<Model> ParseModel(const std::string& bytes, const std::string& name);

// Reads and parses the checkpoint at `path` (NotFound when it cannot be opened).
absl::StatusOr<Model> LoadModel(const std::string& path);

// Reads a whole file into memory (NotFound / DataLoss on failure). Shared by the loaders.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);

}  // namespace centroidkv::worker
