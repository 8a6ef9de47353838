// The SPEC section 5 kernel workload: one layer job of H heads x n tokens, head dim d, fp16
// keys and values (or those as fp8 codes with per-head scales), head-major, built from a seed. Shared by the engine benchmark and the
// FAISS peer; the PyTorch peer reads the same bytes from the .npy files WriteWorkloadNpy
// leaves behind, so every contender works on identical data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::bench {

struct WorkloadSpec {
  int32_t heads = 8;
  int32_t tokens = 32768;
  int32_t dim = 128;      // key_dim = value_dim
  uint64_t seed = 1;
  int32_t topics = 32;    // shared directions per head
  double noise = 0.35;    // per-element Gaussian noise around the topic direction
  double stay = 0.9;      // probability that a token continues the previous token's topic
};

struct Workload {
  WorkloadSpec spec;
  std::vector<uint16_t> keys;    // fp16 bits, [H, n, d]
  std::vector<uint16_t> values;  // fp16 bits, [H, n, d]
  // With fp8 (AsFp8): the same rows as fp8 codes, each head scaled by its largest magnitude
  // / the format's maximum; View() then gives these.
  DType fp8 = DType::kFloat16;  // kFloat16: none
  std::vector<uint8_t> fp8_keys, fp8_values;
  std::vector<float> key_scales, value_scales;

  LayerView View() const;
  // Input bytes of keys plus values, as View() gives them.
  int64_t KvBytes() const {
    return static_cast<int64_t>(keys.size() + values.size()) * (IsFp8(fp8) ? 1 : 2);
  }
};

// Synthetic clustered data from SynthesizeHead (centroidkv/common/synthetic_kv.h, the same
// generator as `centroidkv generate`), rounded to fp16: stream 2h for head h's keys, 2h + 1
// for its values.
Workload MakeWorkload(const WorkloadSpec& spec);

// Adds the fp8 form of the workload's rows in `dtype` (per-head dynamic scales).
void AddFp8Rows(DType dtype, Workload* workload);

// One chunk of the compressible range: entries [begin, begin + length) of a head.
struct ChunkSpan {
  int32_t begin = 0;
  int32_t length = 0;
  int32_t sources() const { return (length + 1) / 2; }      // |A|: offsets 0, 2, 4, ...
  int32_t destinations() const { return length / 2; }       // |B|: offsets 1, 3, 5, ...
};

// The chunks of the first pass (SPEC section 2 steps 1-2) over a head of `tokens` entries.
std::vector<ChunkSpan> FirstPassChunks(int32_t tokens, int32_t chunk_size, int32_t sink,
                                       int32_t recent);

// A-B pairs whose similarity one head's first pass evaluates: sum over chunks of |A| x |B|.
int64_t SimilarityPairs(const std::vector<ChunkSpan>& chunks);

// Writes keys.npy and values.npy (float16, [H, n, d]) into `dir` (created if missing).
absl::Status WriteWorkloadNpy(const Workload& workload, const std::string& dir);

}  // namespace centroidkv::bench
