// Seeded sampling and greedy generation.
#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/tokenizer.h"

namespace centroidkv::worker {

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t SampleToken(std::span<const float> logits, float temperature,
                    std::span<const int32_t> suppressed, Rng* rng) {
  std::vector<double> weights(logits.begin(), logits.end());
  for (int32_t id : suppressed) {
    if (id >= 0 && static_cast<size_t>(id) < weights.size()) {
      weights[static_cast<size_t>(id)] = -std::numeric_limits<double>::infinity();
    }
  }
  const auto best = std::max_element(weights.begin(), weights.end());
  if (temperature <= 0.0f) return static_cast<int32_t>(best - weights.begin());
  const double max = *best;
  double sum = 0.0;
  for (double& w : weights) {
    w = std::exp((w - max) / temperature);
    sum += w;
  }
  double target = rng->Uniform() * sum;
  for (size_t i = 0; i < weights.size(); ++i) {
    target -= weights[i];
    if (target < 0.0 && weights[i] > 0.0) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(best - weights.begin());  // rounding left a sliver: the mode
}

absl::StatusOr<std::vector<int32_t>> GenerateGreedy(Transformer& transformer,
                                                    std::span<const int32_t> prompt,
                                                    int32_t steps) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt must hold at least BOS");
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  KvCache cache = transformer.NewCache();
  for (int32_t pos = 0; pos < steps; ++pos) {
    if (absl::Status status = transformer.Forward(tokens[static_cast<size_t>(pos)], &cache);
        !status.ok()) {
      return status;
    }
    if (static_cast<size_t>(pos) + 1 < tokens.size()) continue;  // still inside the prompt
    tokens.push_back(Argmax(transformer.logits()));
  }
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> SampleText(Transformer& transformer, int32_t length,
                                                float temperature, uint64_t seed) {
  if (length < 1) return absl::InvalidArgumentError(absl::StrCat("text length ", length));
  static constexpr int32_t kSuppressed[] = {kBosToken, kEosToken};
  Rng rng(seed);
  KvCache cache = transformer.NewCache();
  std::vector<int32_t> tokens = {kBosToken};
  while (static_cast<int32_t>(tokens.size()) < length) {
    if (absl::Status status = transformer.Forward(tokens.back(), &cache); !status.ok()) {
      return status;
    }
    tokens.push_back(SampleToken(transformer.logits(), temperature, kSuppressed, &rng));
  }
  return tokens;
}

}  // namespace centroidkv::worker
