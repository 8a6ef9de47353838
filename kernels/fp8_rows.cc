// fp8 widening of a job's input and quantisation of its result (fp8_rows.h).
#include "kernels/fp8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "centroidkv/common/dtype.h"

namespace centroidkv {
namespace {

// Calls fn(first element, elements) over the rows of head `head` of `rows` ([total, dim] in
// `result`'s layout): one span when heads are contiguous (head-major), else one per row
// (token-major: row r * H + h).
template <typename Fn>
void ForEachSpanOfHead(const CompressResult& result, const std::vector<float>& rows,
                       int32_t dim, int32_t head, Fn fn) {
  if (dim == 0) return;
  if (result.layout == TensorLayout::kTokenMajor) {
    const int64_t total = static_cast<int64_t>(rows.size()) / dim;
    for (int64_t r = head; r < total; r += result.num_heads) fn(r * dim, int64_t{dim});
    return;
  }
  const int64_t first = result.offsets[head] * dim;
  fn(first, result.offsets[head + 1] * dim - first);
}

// `rows` quantised into `out` with `given` scales (one, or one per head) or per-head dynamic
// ones, a head per task of `engine`; returns each head's scale. A head's amax and its
// narrowing read the same rows back to back, while they are still in cache.
std::vector<float> QuantiseTensor(const ClusterEngine& engine, const CompressResult& result,
                                  const std::vector<float>& rows, int32_t dim,
                                  const std::vector<float>& given, DType dtype, uint8_t* out) {
  const auto heads = static_cast<size_t>(result.num_heads);
  std::vector<float> scales = given.size() == 1 ? std::vector<float>(heads, given[0]) : given;
  const bool dynamic = scales.empty();
  if (dynamic) scales.assign(heads, 1.0f);
  engine.ForEachIndependent(result.num_heads, [&](int32_t h) {
    if (dynamic) {
      float amax = 0.0f;
      ForEachSpanOfHead(result, rows, dim, h, [&](int64_t first, int64_t elements) {
        amax = std::max(amax, MaxMagnitude(rows.data() + first, elements));
      });
      scales[h] = Fp8ScaleFor(amax, dtype);
    }
    ForEachSpanOfHead(result, rows, dim, h, [&](int64_t first, int64_t elements) {
      NarrowToFp8(rows.data() + first, elements, dtype, scales[h], out + first);
    });
  });
  return scales;
}

}  // namespace

LayerView WidenFp8Layer(const ClusterEngine& engine, const LayerView& layer,
                        std::vector<float>* scratch) {
  const int64_t rows = layer.TotalRows();
  const auto key_elements = static_cast<size_t>(rows * layer.key_dim);
  const size_t needed = key_elements + static_cast<size_t>(rows * layer.value_dim);
  if (scratch->size() < needed) scratch->resize(needed);
  float* keys = scratch->data();
  float* values = scratch->data() + key_elements;
  const auto* key_codes = static_cast<const uint8_t*>(layer.keys);
  const auto* value_codes = static_cast<const uint8_t*>(layer.values);
  // A head per task; head-major (and ragged) heads are contiguous: one sweep per tensor.
  engine.ForEachIndependent(layer.num_heads, [&](int32_t h) {
    const float key_scale = layer.KeyScale(h);
    const float value_scale = layer.ValueScale(h);
    if (layer.layout == TensorLayout::kHeadMajor) {
      const int64_t k = layer.KeyOffset(h, 0);
      const int64_t v = layer.ValueOffset(h, 0);
      const int64_t tokens = layer.HeadTokens(h);
      WidenFp8(key_codes + k, tokens * layer.key_dim, layer.dtype, key_scale, keys + k);
      WidenFp8(value_codes + v, tokens * layer.value_dim, layer.dtype, value_scale, values + v);
      return;
    }
    for (int32_t t = 0; t < layer.HeadTokens(h); ++t) {
      const int64_t k = layer.KeyOffset(h, t);
      const int64_t v = layer.ValueOffset(h, t);
      WidenFp8(key_codes + k, layer.key_dim, layer.dtype, key_scale, keys + k);
      WidenFp8(value_codes + v, layer.value_dim, layer.dtype, value_scale, values + v);
    }
  });
  LayerView wide = layer;
  wide.dtype = DType::kFloat32;
  wide.keys = keys;
  wide.values = values;
  wide.key_scales = {};
  wide.value_scales = {};
  return wide;
}

void QuantiseResultToFp8(const ClusterEngine& engine, const CompressOptions& options,
                         const ResultRowTarget* target, CompressResult* result) {
  const DType dtype = options.result_dtype;
  const size_t key_bytes = result->keys.size();  // one byte per fp8 element
  const size_t value_bytes = result->values.size();
  uint8_t* keys = nullptr;
  uint8_t* values = nullptr;
  result->rows_in_target = target != nullptr && target->keys != nullptr &&
                           target->values != nullptr && key_bytes <= target->key_bytes &&
                           value_bytes <= target->value_bytes;
  if (result->rows_in_target) {
    keys = static_cast<uint8_t*>(target->keys);
    values = static_cast<uint8_t*>(target->values);
  } else {
    result->fp8_keys.resize(key_bytes);
    result->fp8_values.resize(value_bytes);
    keys = result->fp8_keys.data();
    values = result->fp8_values.data();
  }
  result->key_scales = QuantiseTensor(engine, *result, result->keys, result->key_dim,
                                      options.result_key_scales, dtype, keys);
  result->value_scales = QuantiseTensor(engine, *result, result->values, result->value_dim,
                                        options.result_value_scales, dtype, values);
  result->keys.clear();
  result->values.clear();
  result->dtype = dtype;
}

}  // namespace centroidkv
