// Seeded random layers for property tests of the clustering engines. A RandomLayer owns its
// keys, values and counts and hands out a LayerView over them. Generation is reproducible
// across platforms: std::mt19937_64 with an explicit seed and our own integer-to-double and
// Box-Muller transforms (the std distributions are implementation-defined). Callers print the
// spec, seed included, with SCOPED_TRACE(spec.ToString()).
// Thread-compatible: a RandomLayer is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

struct RandomLayerSpec {
  int32_t num_heads = 2;
  int32_t num_tokens = 64;
  int32_t key_dim = 16;
  int32_t value_dim = 16;
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kHeadMajor;
  bool with_counts = false;  // random counts in 1..5; otherwise LayerView::counts is null
  // 0: every key and value element is an independent standard normal. k > 0: each head has k
  // prototype keys (and values); every token is a prototype plus `noise` times a standard
  // normal, so cosine similarities are high within a prototype and merges have structure.
  int32_t prototypes = 0;
  double noise = 0.05;
  uint64_t seed = 1;

  // "H=2 n=64 dk=16 dv=16 float32 head_major counts=no prototypes=0 seed=1".
  std::string ToString() const;
};

// A spec of the given shape, seed and storage, every other field at its default.
RandomLayerSpec Spec(int32_t heads, int32_t tokens, int32_t key_dim, int32_t value_dim,
                     uint64_t seed, DType dtype = DType::kFloat32,
                     TensorLayout layout = TensorLayout::kHeadMajor);

class RandomLayer {
 public:
  // Generates a layer. Values are drawn in float and stored rounded to spec.dtype.
  static RandomLayer Generate(const RandomLayerSpec& spec);

  const RandomLayerSpec& spec() const { return spec_; }
  LayerView view() const;

  // Element (head, token, dim) widened to float, and the count of (head, token).
  float Key(int32_t head, int32_t token, int32_t dim) const;
  float Value(int32_t head, int32_t token, int32_t dim) const;
  uint32_t Count(int32_t head, int32_t token) const;

  // The same layer stored in another layout (a transpose; elements bit-identical).
  RandomLayer WithLayout(TensorLayout layout) const;
  // The same layer converted to another dtype: widening is exact, narrowing rounds.
  RandomLayer WithDType(DType dtype) const;

  // Overwrites one element with `value` (stored rounded to the dtype); for invalid-data tests.
  void SetKey(int32_t head, int32_t token, int32_t dim, float value);
  void SetValue(int32_t head, int32_t token, int32_t dim, float value);
  // Sets a count; gives the layer explicit counts (all 1) first when it had none.
  void SetCount(int32_t head, int32_t token, uint32_t count);

 private:
  explicit RandomLayer(const RandomLayerSpec& spec);

  RandomLayerSpec spec_;
  std::vector<uint8_t> keys_;     // H * n * key_dim elements of spec_.dtype in spec_.layout
  std::vector<uint8_t> values_;   // H * n * value_dim elements
  std::vector<uint32_t> counts_;  // H * n in spec_.layout, or empty for "all 1"
};

}  // namespace centroidkv::test
