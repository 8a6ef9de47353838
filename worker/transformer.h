// The forward pass of a llama2.c model over a KvCache whose entries carry counts:
// attention is softmax(q.k / sqrt(head_size) + ln(count)) over the cached entries of the
// query head's KV head (SPEC section 2), so a centroid of c tokens weighs as c identical
// keys would; count-0 rows (padding of an equal-length result) are masked out. RoPE
// (interleaved pairs, the model's base: ModelConfig::rope_theta) uses the cache's true position.
//
// Thread-safety: a Transformer holds scratch buffers; use one per thread. It borrows the
// Model, which must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/kv_cache.h"
#include "worker/model.h"

namespace centroidkv::worker {

class Transformer {
 public:
  explicit Transformer(const Model& model);

  const Model& model() const { return model_; }
  // An empty cache shaped for this model.
  KvCache NewCache() const;

  // Feeds `token` at position cache->position(): appends its keys and values (count 1) to
  // every layer, advances the position and leaves the next-token logits in logits().
  // InvalidArgument for a token outside the vocabulary or a cache of another shape;
  // OutOfRange past the model's seq_len.
  absl::Status Forward(int32_t token, KvCache* cache);
  // Feeds every token of `tokens` in order.
  absl::Status Prefill(std::span<const int32_t> tokens, KvCache* cache);

  // Logits [vocab_size] of the last Forward().
  const std::vector<float>& logits() const { return logits_; }

 private:
  absl::Status CheckInput(int32_t token, const KvCache& cache) const;
  void Attention(int32_t layer, KvCache* cache);
  void FeedForward(int32_t layer);

  const Model& model_;
  // Scratch, sized once.
  std::vector<float> x_, xb_, xb2_, q_, k_, v_, hb_, hb2_, scores_, logits_;
};

}  // namespace centroidkv::worker
