// The llama2.c forward pass with count-aware attention (ln(count) added to each logit).
#include "worker/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace centroidkv::worker {
namespace {

constexpr float kRmsEpsilon = 1e-5f;

// out = weight * x / sqrt(mean(x^2) + eps), n elements.
void RmsNorm(float* out, const float* x, const float* weight, int32_t n) {
  float sum_squares = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum_squares += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum_squares / static_cast<float>(n) + kRmsEpsilon);
  for (int32_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

// out[rows] = w[rows, cols] @ x[cols], w row-major.
void MatVec(float* out, const float* w, const float* x, int32_t rows, int32_t cols) {
  for (int32_t r = 0; r < rows; ++r) {
    const float* row = w + static_cast<ptrdiff_t>(r) * cols;
    float sum = 0.0f;
    for (int32_t c = 0; c < cols; ++c) sum += row[c] * x[c];
    out[r] = sum;
  }
}

// Rotates the interleaved pairs (2j, 2j+1) of `n` elements by pos * base^(-(i mod hs)/hs).
void Rope(float* vec, int32_t n, int32_t head_size, int64_t pos, float base) {
  for (int32_t i = 0; i < n; i += 2) {
    const float frequency = 1.0f / std::pow(base, static_cast<float>(i % head_size) /
                                                           static_cast<float>(head_size));
    const float angle = static_cast<float>(pos) * frequency;
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = vec[i], b = vec[i + 1];
    vec[i] = a * c - b * s;
    vec[i + 1] = a * s + b * c;
  }
}

// In-place softmax of n logits over the entries whose count is not 0; count-0 rows
// (padding) get probability exactly 0 and change nothing else: the sums run over the
// other entries in the same order as without them, so a padded cache attends bit for
// bit as the unpadded one. At least one count must be positive.
void MaskedSoftmax(float* x, const uint32_t* counts, int64_t n) {
  float max = -std::numeric_limits<float>::max();
  for (int64_t i = 0; i < n; ++i) {
    if (counts[i] != 0) max = std::max(max, x[i]);
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = counts[i] == 0 ? 0.0f : std::exp(x[i] - max);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

}  // namespace

Transformer::Transformer(const Model& model) : model_(model) {
  const ModelConfig& c = model.config();
  x_.resize(static_cast<size_t>(c.dim));
  xb_.resize(static_cast<size_t>(c.dim));
  xb2_.resize(static_cast<size_t>(c.dim));
  q_.resize(static_cast<size_t>(c.dim));
  k_.resize(static_cast<size_t>(c.kv_dim()));
  v_.resize(static_cast<size_t>(c.kv_dim()));
  hb_.resize(static_cast<size_t>(c.hidden_dim));
  hb2_.resize(static_cast<size_t>(c.hidden_dim));
  logits_.resize(static_cast<size_t>(c.vocab_size));
}

KvCache Transformer::NewCache() const {
  const ModelConfig& c = model_.config();
  return KvCache(c.n_layers, c.n_kv_heads, c.head_size());
}

absl::Status Transformer::CheckInput(int32_t token, const KvCache& cache) const {
  const ModelConfig& c = model_.config();
  if (token < 0 || token >= c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " is outside the vocabulary [0, ", c.vocab_size, ")"));
  }
  if (cache.num_layers() != c.n_layers || cache.num_kv_heads() != c.n_kv_heads ||
      cache.head_size() != c.head_size()) {
    return absl::InvalidArgumentError("the KV cache was made for a model of another shape");
  }
  if (cache.position() >= c.seq_len) {
    return absl::OutOfRangeError(
        absl::StrCat("position ", cache.position(), " is past the model's context of ", c.seq_len));
  }
  return absl::OkStatus();
}

absl::Status Transformer::Forward(int32_t token, KvCache* cache) {
  if (absl::Status status = CheckInput(token, *cache); !status.ok()) return status;
  const ModelConfig& c = model_.config();
  const float* row = model_.embedding() + static_cast<ptrdiff_t>(token) * c.dim;
  std::copy(row, row + c.dim, x_.begin());
  for (int32_t layer = 0; layer < c.n_layers; ++layer) {
    RmsNorm(xb_.data(), x_.data(), model_.rms_att(layer), c.dim);
    MatVec(q_.data(), model_.wq(layer), xb_.data(), c.dim, c.dim);
    MatVec(k_.data(), model_.wk(layer), xb_.data(), c.kv_dim(), c.dim);
    MatVec(v_.data(), model_.wv(layer), xb_.data(), c.kv_dim(), c.dim);
    Rope(q_.data(), c.dim, c.head_size(), cache->position(), c.rope_theta);
    Rope(k_.data(), c.kv_dim(), c.head_size(), cache->position(), c.rope_theta);
    cache->Append(layer, k_.data(), v_.data());
    Attention(layer, cache);
    MatVec(xb2_.data(), model_.wo(layer), xb_.data(), c.dim, c.dim);
    for (int32_t i = 0; i < c.dim; ++i) x_[i] += xb2_[i];
    FeedForward(layer);
  }
  cache->AdvancePosition();
  RmsNorm(xb_.data(), x_.data(), model_.rms_final(), c.dim);
  MatVec(logits_.data(), model_.classifier(), xb_.data(), c.vocab_size, c.dim);
  return absl::OkStatus();
}

// Every query head attends over its KV head's entries; the result lands in xb_.
void Transformer::Attention(int32_t layer, KvCache* cache) {
  const ModelConfig& c = model_.config();
  const int32_t hs = c.head_size();
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int32_t h = 0; h < c.n_heads; ++h) {
    HeadCache& entries = cache->head(layer, h / c.kv_group());
    const int64_t n = entries.size();
    const float* q = q_.data() + static_cast<ptrdiff_t>(h) * hs;
    scores_.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const uint32_t count = entries.counts[static_cast<size_t>(t)];
      if (count == 0) continue;  // padding: masked by MaskedSoftmax
      const float* k = entries.keys.data() + t * hs;
      float dot = 0.0f;
      for (int32_t j = 0; j < hs; ++j) dot += q[j] * k[j];
      scores_[static_cast<size_t>(t)] =
          dot * inv_sqrt + (count == 1 ? 0.0f : std::log(static_cast<float>(count)));
    }
    MaskedSoftmax(scores_.data(), entries.counts.data(), n);
    float* out = xb_.data() + static_cast<ptrdiff_t>(h) * hs;
    std::fill(out, out + hs, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      if (entries.counts[static_cast<size_t>(t)] == 0) continue;  // padding
      const float a = scores_[static_cast<size_t>(t)];
      const float* v = entries.values.data() + t * hs;
      for (int32_t j = 0; j < hs; ++j) out[j] += a * v[j];
    }
    if (cache->tracks_attention()) {
      entries.attention.resize(static_cast<size_t>(n), 0.0);  // entries a baseline rebuilt
      for (int64_t t = 0; t < n; ++t) entries.attention[static_cast<size_t>(t)] += scores_[t];
    }
  }
}

// x += W2 (silu(W1 xb) * (W3 xb)), xb = rmsnorm(x) * w_ffn.
void Transformer::FeedForward(int32_t layer) {
  const ModelConfig& c = model_.config();
  RmsNorm(xb_.data(), x_.data(), model_.rms_ffn(layer), c.dim);
  MatVec(hb_.data(), model_.w1(layer), xb_.data(), c.hidden_dim, c.dim);
  MatVec(hb2_.data(), model_.w3(layer), xb_.data(), c.hidden_dim, c.dim);
  for (int32_t i = 0; i < c.hidden_dim; ++i) {
    const float gate = hb_[i];
    hb_[i] = gate / (1.0f + std::exp(-gate)) * hb2_[i];
  }
  MatVec(xb_.data(), model_.w2(layer), hb_.data(), c.dim, c.hidden_dim);
  for (int32_t i = 0; i < c.dim; ++i) x_[i] += xb_[i];
}

absl::Status Transformer::Prefill(std::span<const int32_t> tokens, KvCache* cache) {
  for (int32_t token : tokens) {
    if (absl::Status status = Forward(token, cache); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::worker
