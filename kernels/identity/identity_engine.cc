#include "kernels/identity/identity_engine.h"

#include <cstring>

namespace centroidkv {
namespace {

// Widens row (h, t) of a tensor of `dim` elements per row to float.
void WidenRow(const LayerView& layer, const void* data, int64_t element_offset, int32_t dim,
              float* out) {
  switch (layer.dtype) {
    case DType::kFloat32:
      std::memcpy(out, static_cast<const float*>(data) + element_offset,
                  sizeof(float) * static_cast<size_t>(dim));
      return;
    case DType::kFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(data) + element_offset;
      for (int32_t j = 0; j < dim; ++j) out[j] = HalfToFloat(in[j]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(data) + element_offset;
      for (int32_t j = 0; j < dim; ++j) out[j] = BFloat16ToFloat(in[j]);
      return;
    }
  }
}

}  // namespace

absl::Status IdentityEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                          const CompressControl& control,
                                          CompressResult* out) const {
  if (control.IsCancelled()) return absl::CancelledError("job cancelled");
  const int32_t heads = layer.num_heads;
  const int32_t n = layer.num_tokens;
  const int64_t total = int64_t{heads} * n;
  out->num_heads = heads;
  out->num_tokens = n;
  out->key_dim = layer.key_dim;
  out->value_dim = layer.value_dim;
  out->offsets.resize(static_cast<size_t>(heads) + 1);
  for (int32_t h = 0; h <= heads; ++h) out->offsets[h] = int64_t{h} * n;
  out->keys.resize(static_cast<size_t>(total) * layer.key_dim);
  out->values.resize(static_cast<size_t>(total) * layer.value_dim);
  out->counts.resize(static_cast<size_t>(total));
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t t = 0; t < n; ++t) {
      const int64_t row = int64_t{h} * n + t;
      WidenRow(layer, layer.keys, layer.KeyOffset(h, t), layer.key_dim,
               &out->keys[static_cast<size_t>(row) * layer.key_dim]);
      WidenRow(layer, layer.values, layer.ValueOffset(h, t), layer.value_dim,
               &out->values[static_cast<size_t>(row) * layer.value_dim]);
      out->counts[static_cast<size_t>(row)] = layer.CountAt(h, t);
    }
  }
  if (plan.options.compute_assignment) {
    // Head-local output row of each input entry: entry t is row t of its head.
    out->assignment.resize(static_cast<size_t>(total));
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t t = 0; t < n; ++t) out->assignment[static_cast<size_t>(h) * n + t] = t;
    }
  }
  return absl::OkStatus();
}

}  // namespace centroidkv
