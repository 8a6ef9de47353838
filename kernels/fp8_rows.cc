// fp8 widening of a job's input and quantisation of its result (fp8_rows.h).
#include "kernels/fp8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "centroidkv/common/dtype.h"

namespace centroidkv {
namespace {

// `elements` codes from `in`, widened and multiplied by `scale`, into `out`.
void WidenRow(const uint8_t* in, int64_t elements, DType dtype, float scale, float* out) {
  for (int64_t j = 0; j < elements; ++j) out[j] = Fp8ToFloat(in[j], dtype) * scale;
}

// The head that row `row` of `result` belongs to.
class RowHeads {
 public:
  explicit RowHeads(const CompressResult& result) : result_(result) {}
  int32_t HeadOf(int64_t row) {
    if (result_.layout == TensorLayout::kTokenMajor) {
      return static_cast<int32_t>(row % result_.num_heads);
    }
    while (row >= result_.offsets[head_ + 1]) ++head_;  // rows are visited in order
    return head_;
  }

 private:
  const CompressResult& result_;
  int32_t head_ = 0;
};

void QuantiseRows(const CompressResult& result, const std::vector<float>& rows, int32_t dim,
                  const std::vector<float>& scales, DType dtype, uint8_t* out) {
  RowHeads heads(result);
  const int64_t total = dim == 0 ? 0 : static_cast<int64_t>(rows.size()) / dim;
  for (int64_t r = 0; r < total; ++r) {
    const float scale = scales[heads.HeadOf(r)];
    const float* in = rows.data() + r * dim;
    uint8_t* codes = out + r * dim;
    for (int32_t j = 0; j < dim; ++j) codes[j] = FloatToFp8(in[j] / scale, dtype);
  }
}

}  // namespace

LayerView WidenFp8Layer(const LayerView& layer, std::vector<float>* keys,
                        std::vector<float>* values) {
  const int64_t rows = layer.TotalRows();
  keys->resize(static_cast<size_t>(rows * layer.key_dim));
  values->resize(static_cast<size_t>(rows * layer.value_dim));
  const auto* key_codes = static_cast<const uint8_t*>(layer.keys);
  const auto* value_codes = static_cast<const uint8_t*>(layer.values);
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    const float key_scale = layer.KeyScale(h);
    const float value_scale = layer.ValueScale(h);
    for (int32_t t = 0; t < layer.HeadTokens(h); ++t) {
      const int64_t k = layer.KeyOffset(h, t);
      const int64_t v = layer.ValueOffset(h, t);
      WidenRow(key_codes + k, layer.key_dim, layer.dtype, key_scale, keys->data() + k);
      WidenRow(value_codes + v, layer.value_dim, layer.dtype, value_scale, values->data() + v);
    }
  }
  LayerView wide = layer;
  wide.dtype = DType::kFloat32;
  wide.keys = keys->data();
  wide.values = values->data();
  wide.key_scales = {};
  wide.value_scales = {};
  return wide;
}

std::vector<float> Fp8HeadScales(const CompressResult& result, const std::vector<float>& rows,
                                 int32_t dim, const std::vector<float>& given, DType dtype) {
  const auto heads = static_cast<size_t>(result.num_heads);
  if (given.size() == 1) return std::vector<float>(heads, given[0]);
  if (!given.empty()) return given;
  std::vector<float> amax(heads, 0.0f);
  RowHeads row_heads(result);
  const int64_t total = dim == 0 ? 0 : static_cast<int64_t>(rows.size()) / dim;
  for (int64_t r = 0; r < total; ++r) {
    float& head_max = amax[row_heads.HeadOf(r)];
    for (int32_t j = 0; j < dim; ++j) head_max = std::max(head_max, std::fabs(rows[r * dim + j]));
  }
  for (float& scale : amax) {
    scale = scale > 0.0f
                ? std::max(scale / Fp8MaxFinite(dtype), std::numeric_limits<float>::min())
                : 1.0f;
  }
  return amax;
}

void QuantiseResultToFp8(const CompressOptions& options, const ResultRowTarget* target,
                         CompressResult* result) {
  const DType dtype = options.result_dtype;
  result->key_scales =
      Fp8HeadScales(*result, result->keys, result->key_dim, options.result_key_scales, dtype);
  result->value_scales = Fp8HeadScales(*result, result->values, result->value_dim,
                                       options.result_value_scales, dtype);
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
  QuantiseRows(*result, result->keys, result->key_dim, result->key_scales, dtype, keys);
  QuantiseRows(*result, result->values, result->value_dim, result->value_scales, dtype, values);
  result->keys.clear();
  result->values.clear();
  result->dtype = dtype;
}

}  // namespace centroidkv
