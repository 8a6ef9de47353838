// Token selection and text generation for the worker: a portable seeded RNG (the same
// stream on every platform, unlike std:: distributions), argmax, temperature sampling
// with suppressed tokens, and sampling whole texts from the model (SPEC section 4: the
// quality texts are sampled at temperature 0.8 with fixed seeds, BOS/EOS suppressed).
//
// Thread-safety: Rng is not thread-safe; the functions are, given distinct arguments.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/transformer.h"

namespace centroidkv::worker {

// SplitMix64: small, seedable, identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, 1), 53 bits.
  double Uniform();

 private:
  uint64_t state_;
};

// The index of the largest logit (the lowest index on ties).
int32_t Argmax(std::span<const float> logits);

// A token drawn from softmax(logits / temperature) with the `suppressed` ids removed;
// temperature <= 0 means argmax (of the tokens not suppressed).
int32_t SampleToken(std::span<const float> logits, float temperature,
                    std::span<const int32_t> suppressed, Rng* rng);

// Greedy decoding as llama2.c's `-n steps` counts it: `steps` forward passes over the
// prompt (BOS first) and then the argmax tokens, returning BOS plus `steps` tokens (the
// prompt included; the whole prompt when it is longer).
absl::StatusOr<std::vector<int32_t>> GenerateGreedy(Transformer& transformer,
                                                    std::span<const int32_t> prompt, int32_t steps);

// A text of `length` tokens sampled from the model: BOS, then tokens drawn at
// `temperature` with BOS and EOS suppressed, from Rng(seed).
absl::StatusOr<std::vector<int32_t>> SampleText(Transformer& transformer, int32_t length,
                                                float temperature, uint64_t seed);

}  // namespace centroidkv::worker
