// Synthetic KV data with the structure clustering exploits, for demos and benchmarks when no
// model is at hand (always labelled synthetic where shown): each head has `topics` random
// Gaussian directions, and tokens come in runs that stay near one direction (probability
// `stay` per step) plus Gaussian noise. One generator per (head, tensor) stream, seeded from
// `seed`, so the data are deterministic and heads/tensors unrelated. Used by
// `centroidkv generate` and the benchmarks' workloads (bench/workload.h).
#pragma once

#include <cstdint>

namespace centroidkv {

struct SyntheticKvSpec {
  int32_t tokens = 4096;
  uint64_t seed = 1;
  int32_t topics = 32;  // shared directions per head
  double noise = 0.35;  // per-element noise around the topic direction
  double stay = 0.9;    // probability that a token continues the previous token's topic
};

// Fills `out` ([tokens, dim] floats) with one head's rows from generator `stream`
// (by convention 2 * head for keys and 2 * head + 1 for values).
void SynthesizeHead(const SyntheticKvSpec& spec, int32_t dim, uint64_t stream, float* out);

}  // namespace centroidkv
