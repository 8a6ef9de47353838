// Fp8Layer (fp8_layer.h).
#include "tests/testing/fp8_layer.h"

#include <algorithm>
#include <cmath>

namespace centroidkv::test {

Fp8Layer Fp8Layer::From(const RandomLayer& source, DType dtype) {
  Fp8Layer out;
  out.dtype_ = dtype;
  out.shape_ = source.view();
  const LayerView& in = out.shape_;
  if (in.counts != nullptr) {
    out.counts_.assign(in.counts, in.counts + in.TotalRows());
    out.shape_.counts = out.counts_.data();
  }
  out.key_scales.assign(static_cast<size_t>(in.num_heads), 0.0f);
  out.value_scales.assign(static_cast<size_t>(in.num_heads), 0.0f);
  for (int32_t h = 0; h < in.num_heads; ++h) {
    for (int32_t t = 0; t < in.num_tokens; ++t) {
      for (int32_t j = 0; j < in.key_dim; ++j) {
        out.key_scales[h] = std::max(out.key_scales[h], std::fabs(source.Key(h, t, j)));
      }
      for (int32_t j = 0; j < in.value_dim; ++j) {
        out.value_scales[h] = std::max(out.value_scales[h], std::fabs(source.Value(h, t, j)));
      }
    }
    out.key_scales[h] = std::max(out.key_scales[h], 1e-30f) / Fp8MaxFinite(dtype);
    out.value_scales[h] = std::max(out.value_scales[h], 1e-30f) / Fp8MaxFinite(dtype);
  }
  out.key_codes_.resize(static_cast<size_t>(in.TotalRows() * in.key_dim));
  out.value_codes_.resize(static_cast<size_t>(in.TotalRows() * in.value_dim));
  for (int32_t h = 0; h < in.num_heads; ++h) {
    for (int32_t t = 0; t < in.num_tokens; ++t) {
      for (int32_t j = 0; j < in.key_dim; ++j) {
        out.key_codes_[in.KeyOffset(h, t) + j] =
            FloatToFp8(source.Key(h, t, j) / out.key_scales[h], dtype);
      }
      for (int32_t j = 0; j < in.value_dim; ++j) {
        out.value_codes_[in.ValueOffset(h, t) + j] =
            FloatToFp8(source.Value(h, t, j) / out.value_scales[h], dtype);
      }
    }
  }
  return out;
}

void Fp8Layer::Widen() const {
  const LayerView& in = shape_;
  wide_keys_.resize(key_codes_.size());
  wide_values_.resize(value_codes_.size());
  for (int32_t h = 0; h < in.num_heads; ++h) {
    for (int32_t t = 0; t < in.num_tokens; ++t) {
      for (int32_t j = 0; j < in.key_dim; ++j) {
        const int64_t i = in.KeyOffset(h, t) + j;
        wide_keys_[i] = Fp8ToFloat(key_codes_[i], dtype_) * key_scales[h];
      }
      for (int32_t j = 0; j < in.value_dim; ++j) {
        const int64_t i = in.ValueOffset(h, t) + j;
        wide_values_[i] = Fp8ToFloat(value_codes_[i], dtype_) * value_scales[h];
      }
    }
  }
}

LayerView Fp8Layer::Fp8View() const {
  LayerView view = shape_;
  view.dtype = dtype_;
  view.keys = key_codes_.data();
  view.values = value_codes_.data();
  view.key_scales = key_scales;
  view.value_scales = value_scales;
  return view;
}

LayerView Fp8Layer::WideView() const {
  Widen();  // the scales or codes may have changed since the last view
  LayerView view = shape_;
  view.dtype = DType::kFloat32;
  view.keys = wide_keys_.data();
  view.values = wide_values_.data();
  return view;
}

void Fp8Layer::SetKeyCode(int32_t head, int32_t token, int32_t dim, uint8_t code) {
  key_codes_[shape_.KeyOffset(head, token) + dim] = code;
}

void Fp8Layer::SetValueCode(int32_t head, int32_t token, int32_t dim, uint8_t code) {
  value_codes_[shape_.ValueOffset(head, token) + dim] = code;
}

}  // namespace centroidkv::test
