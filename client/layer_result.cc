// LayerResult helpers: widening the wire dtype to float, and packing an engine result.
#include <cstring>

#include "centroidkv/client/client.h"

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

LayerResult LayerResultFromEngine(uint32_t layer_index, const CompressResult& result,
                                  DType output_dtype) {
  LayerResult out;
  out.layer_index = layer_index;
  out.dtype = output_dtype;
  out.num_heads = result.num_heads;
  out.num_tokens = result.num_tokens;
  out.key_dim = result.key_dim;
  out.value_dim = result.value_dim;
  out.offsets = result.offsets;
  out.keys = Narrow(result.keys, output_dtype);
  out.values = Narrow(result.values, output_dtype);
  out.counts = result.counts;
  out.assignment = result.assignment;
  out.passes_run = result.passes_run;
  out.target_length = result.target_length;
  out.target_reached = result.target_reached;
  out.head_entries.assign(result.head_entries.begin(), result.head_entries.end());
  out.head_input_tokens = result.head_input_tokens;
  out.stop_reasons = result.stop_reasons;
  out.head_tokens.assign(result.head_tokens.begin(), result.head_tokens.end());
  out.padded_length = result.padded_length;
  out.layout = result.layout;
  return out;
}

}  // namespace centroidkv::client
