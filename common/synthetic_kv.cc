// Synthetic KV data: runs of tokens near shared directions (see synthetic_kv.h).
#include "centroidkv/common/synthetic_kv.h"

#include <random>
#include <vector>

namespace centroidkv {

void SynthesizeHead(const SyntheticKvSpec& spec, int32_t dim, uint64_t stream, float* out) {
  // splitmix-style spreading so that neighbouring streams get unrelated generators.
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::uniform_int_distribution<int32_t> pick(0, spec.topics - 1);
  std::vector<float> topics(static_cast<size_t>(spec.topics) * dim);
  for (float& x : topics) x = normal(rng);
  const float noise = static_cast<float>(spec.noise);
  int32_t topic = pick(rng);
  for (int32_t t = 0; t < spec.tokens; ++t) {
    if (uniform(rng) > spec.stay) topic = pick(rng);
    const float* direction = &topics[static_cast<size_t>(topic) * dim];
    float* row = out + static_cast<size_t>(t) * dim;
    for (int32_t j = 0; j < dim; ++j) row[j] = direction[j] + noise * normal(rng);
  }
}

}  // namespace centroidkv
