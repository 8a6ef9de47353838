// LayerResult helpers: widening the wire dtype to float, and packing an engine result.
#include <cstring>

#include "centroidkv/client/client.h"
#include "client/result_account.h"

namespace centroidkv::client {
namespace {

std::vector<float> Widen(const std::vector<uint8_t>& bytes, DType dtype) {
  const int64_t count = static_cast<int64_t>(bytes.size()) / DTypeSize(dtype);
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = LoadAsFloat(bytes.data(), dtype, i);
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

std::vector<float> LayerResult::KeysAsFloat() const { return Widen(keys, dtype); }
std::vector<float> LayerResult::ValuesAsFloat() const { return Widen(values, dtype); }

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
}

LayerResult LayerResultFromEngine(uint32_t layer_index, const CompressResult& result,
                                  DType output_dtype) {
  LayerResult out;
  out.layer_index = layer_index;
  out.dtype = output_dtype;
  CopyShapeAndAccount(result, &out);
  out.keys = Narrow(result.keys, output_dtype);
  out.values = Narrow(result.values, output_dtype);
  out.counts = result.counts;
  out.assignment = result.assignment;
  return out;
}

}  // namespace centroidkv::client
