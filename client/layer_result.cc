// LayerResult helpers: widening the wire dtype to float, and packing an engine result.
#include <cstring>

#include "centroidkv/client/client.h"
#include "client/result_account.h"

namespace centroidkv::client {
namespace {

// The rows `bytes` ([total, dim] of `result`'s dtype) as float; fp8 codes times their
// head's scale (`scales`, [H]), rows in the result's layout.
std::vector<float> Widen(const LayerResult& result, const std::vector<uint8_t>& bytes,
                         int32_t dim, const std::vector<float>& scales) {
  const DType dtype = result.dtype;
  const int64_t count = static_cast<int64_t>(bytes.size()) / DTypeSize(dtype);
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = LoadAsFloat(bytes.data(), dtype, i);
  if (!IsFp8(dtype) || dim == 0 || scales.size() != static_cast<size_t>(result.num_heads)) {
    return out;
  }
  int32_t head = 0;
  for (int64_t row = 0; row < count / dim; ++row) {
    if (result.layout == TensorLayout::kTokenMajor) {
      head = static_cast<int32_t>(row % result.num_heads);
    } else {
      while (row >= result.offsets[head + 1]) ++head;
    }
    for (int32_t j = 0; j < dim; ++j) out[row * dim + j] *= scales[head];
  }
  return out;
}

std::vector<uint8_t> Narrow(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  if (dtype == DType::kFloat32) {
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(out.data(), dtype, static_cast<int64_t>(i), values[i]);
  }
  return out;
}

}  // namespace

std::vector<float> LayerResult::KeysAsFloat() const {
  return Widen(*this, keys, key_dim, key_scales);
}
std::vector<float> LayerResult::ValuesAsFloat() const {
  return Widen(*this, values, value_dim, value_scales);
}

void CopyShapeAndAccount(const CompressResult& from, LayerResult* to) {
  to->num_heads = from.num_heads;
  to->num_tokens = from.num_tokens;
  to->key_dim = from.key_dim;
  to->value_dim = from.value_dim;
  to->offsets = from.offsets;
  to->passes_run = from.passes_run;
  to->target_length = from.target_length;
  to->target_reached = from.target_reached;
  to->head_entries.assign(from.head_entries.begin(), from.head_entries.end());
  to->head_input_tokens = from.head_input_tokens;
  to->stop_reasons = from.stop_reasons;
  to->head_tokens.assign(from.head_tokens.begin(), from.head_tokens.end());
  to->padded_length = from.padded_length;
  to->layout = from.layout;
  to->key_scales = from.key_scales;
  to->value_scales = from.value_scales;
  to->head_budgets = from.head_budgets;
  to->head_exact_entries = from.head_exact_entries;
}

LayerResult LayerResultFromEngine(uint32_t layer_index, const CompressResult& result,
                                  DType output_dtype) {
  LayerResult out;
  out.layer_index = layer_index;
  out.dtype = output_dtype;
  CopyShapeAndAccount(result, &out);
  if (IsFp8(result.dtype)) {  // quantised by the engine (CompressOptions::result_dtype)
    out.dtype = result.dtype;
    out.keys = result.fp8_keys;
    out.values = result.fp8_values;
  } else {
    out.keys = Narrow(result.keys, output_dtype);
    out.values = Narrow(result.values, output_dtype);
  }
  out.counts = result.counts;
  out.assignment = result.assignment;
  out.log_weights = result.log_weights;
  return out;
}

}  // namespace centroidkv::client
