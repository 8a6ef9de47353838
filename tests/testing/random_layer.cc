// Seeded random layer generation (see random_layer.h).
#include "tests/testing/random_layer.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"

namespace centroidkv::test {
namespace {

// Uniform in (0, 1) from the top 53 bits of one draw.
double Uniform(std::mt19937_64& rng) { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; }

// Standard normal by Box-Muller (one of the pair; simple and portable).
double Normal(std::mt19937_64& rng) {
  const double u1 = Uniform(rng);
  const double u2 = Uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Logical element (head, token, dim) generated in head-major order, written at its place in
// `layer` (the LayerView supplies the layout arithmetic).
struct Sink {
  const LayerView& layer;
  void* keys;
  void* values;
  void Key(int32_t h, int32_t t, int32_t j, double x) const {
    StoreFromFloat(keys, layer.dtype, layer.KeyOffset(h, t) + j, static_cast<float>(x));
  }
  void Value(int32_t h, int32_t t, int32_t j, double x) const {
    StoreFromFloat(values, layer.dtype, layer.ValueOffset(h, t) + j, static_cast<float>(x));
  }
};

void FillIndependent(const RandomLayerSpec& spec, const Sink& sink, std::mt19937_64& rng) {
  for (int32_t h = 0; h < spec.num_heads; ++h) {
    for (int32_t t = 0; t < spec.num_tokens; ++t) {
      for (int32_t j = 0; j < spec.key_dim; ++j) sink.Key(h, t, j, Normal(rng));
      for (int32_t j = 0; j < spec.value_dim; ++j) sink.Value(h, t, j, Normal(rng));
    }
  }
}

// Every token is a random prototype of its head, scaled by a factor in [0.5, 2) for the key
// (cosine ignores it; the means do not), plus noise.
void FillClustered(const RandomLayerSpec& spec, const Sink& sink, std::mt19937_64& rng) {
  const int32_t k = spec.prototypes;
  for (int32_t h = 0; h < spec.num_heads; ++h) {
    std::vector<double> proto_keys(static_cast<size_t>(k) * spec.key_dim);
    std::vector<double> proto_values(static_cast<size_t>(k) * spec.value_dim);
    for (double& x : proto_keys) x = Normal(rng);
    for (double& x : proto_values) x = Normal(rng);
    for (int32_t t = 0; t < spec.num_tokens; ++t) {
      const size_t p = static_cast<size_t>(rng() % static_cast<uint64_t>(k));
      const double scale = 0.5 + 1.5 * Uniform(rng);
      for (int32_t j = 0; j < spec.key_dim; ++j) {
        sink.Key(h, t, j, scale * proto_keys[p * spec.key_dim + j] + spec.noise * Normal(rng));
      }
      for (int32_t j = 0; j < spec.value_dim; ++j) {
        sink.Value(h, t, j, proto_values[p * spec.value_dim + j] + spec.noise * Normal(rng));
      }
    }
  }
}

}  // namespace

RandomLayerSpec Spec(int32_t heads, int32_t tokens, int32_t key_dim, int32_t value_dim,
                     uint64_t seed, DType dtype, TensorLayout layout) {
  RandomLayerSpec spec{.num_heads = heads, .num_tokens = tokens, .key_dim = key_dim,
      .value_dim = value_dim, .dtype = dtype, .layout = layout, .seed = seed};
  return spec;
}

std::string RandomLayerSpec::ToString() const {
  return absl::StrCat("H=", num_heads, " n=", num_tokens, " dk=", key_dim, " dv=", value_dim, " ",
                      std::string(DTypeName(dtype)), " ", std::string(TensorLayoutName(layout)),
                      " counts=", with_counts ? "1..5" : "none", " prototypes=", prototypes,
                      " noise=", noise, " seed=", seed);
}

RandomLayer::RandomLayer(const RandomLayerSpec& spec) : spec_(spec) {
  const size_t rows = static_cast<size_t>(spec.num_heads) * spec.num_tokens;
  keys_.assign(rows * spec.key_dim * DTypeSize(spec.dtype), 0);
  values_.assign(rows * spec.value_dim * DTypeSize(spec.dtype), 0);
  if (spec.with_counts) counts_.assign(rows, 1);
}

RandomLayer RandomLayer::Generate(const RandomLayerSpec& spec) {
  RandomLayer layer(spec);
  std::mt19937_64 rng(spec.seed);
  const LayerView view = layer.view();
  const Sink sink{view, layer.keys_.data(), layer.values_.data()};
  if (spec.prototypes > 0) {
    FillClustered(spec, sink, rng);
  } else {
    FillIndependent(spec, sink, rng);
  }
  if (spec.with_counts) {
    for (int32_t h = 0; h < spec.num_heads; ++h) {
      for (int32_t t = 0; t < spec.num_tokens; ++t) {
        layer.counts_[view.RowIndex(h, t)] = static_cast<uint32_t>(1 + rng() % 5);
      }
    }
  }
  return layer;
}

LayerView RandomLayer::view() const {
  LayerView view{.dtype = spec_.dtype, .layout = spec_.layout, .num_heads = spec_.num_heads,
      .num_tokens = spec_.num_tokens, .key_dim = spec_.key_dim, .value_dim = spec_.value_dim,
      .keys = keys_.data(), .values = values_.data(),
      .counts = counts_.empty() ? nullptr : counts_.data()};
  return view;
}

float RandomLayer::Key(int32_t head, int32_t token, int32_t dim) const {
  return LoadAsFloat(keys_.data(), spec_.dtype, view().KeyOffset(head, token) + dim);
}

float RandomLayer::Value(int32_t head, int32_t token, int32_t dim) const {
  return LoadAsFloat(values_.data(), spec_.dtype, view().ValueOffset(head, token) + dim);
}

uint32_t RandomLayer::Count(int32_t head, int32_t token) const {
  return view().CountAt(head, token);
}

RandomLayer RandomLayer::WithLayout(TensorLayout layout) const {
  RandomLayerSpec spec = spec_;
  spec.layout = layout;
  RandomLayer out(spec);
  if (!counts_.empty()) out.counts_.assign(counts_.size(), 0);
  const LayerView from = view();
  const LayerView to = out.view();
  const size_t size = static_cast<size_t>(DTypeSize(spec.dtype));
  for (int32_t h = 0; h < spec.num_heads; ++h) {
    for (int32_t t = 0; t < spec.num_tokens; ++t) {
      std::memcpy(&out.keys_[to.KeyOffset(h, t) * size], &keys_[from.KeyOffset(h, t) * size],
                  size * spec.key_dim);
      std::memcpy(&out.values_[to.ValueOffset(h, t) * size],
                  &values_[from.ValueOffset(h, t) * size], size * spec.value_dim);
      if (!counts_.empty()) out.counts_[to.RowIndex(h, t)] = counts_[from.RowIndex(h, t)];
    }
  }
  return out;
}

RandomLayer RandomLayer::WithDType(DType dtype) const {
  RandomLayerSpec spec = spec_;
  spec.dtype = dtype;
  RandomLayer out(spec);
  out.counts_ = counts_;
  const int64_t key_elements = static_cast<int64_t>(keys_.size()) / DTypeSize(spec_.dtype);
  const int64_t value_elements = static_cast<int64_t>(values_.size()) / DTypeSize(spec_.dtype);
  for (int64_t i = 0; i < key_elements; ++i) {
    StoreFromFloat(out.keys_.data(), dtype, i, LoadAsFloat(keys_.data(), spec_.dtype, i));
  }
  for (int64_t i = 0; i < value_elements; ++i) {
    StoreFromFloat(out.values_.data(), dtype, i, LoadAsFloat(values_.data(), spec_.dtype, i));
  }
  return out;
}

void RandomLayer::SetKey(int32_t head, int32_t token, int32_t dim, float value) {
  StoreFromFloat(keys_.data(), spec_.dtype, view().KeyOffset(head, token) + dim, value);
}

void RandomLayer::SetValue(int32_t head, int32_t token, int32_t dim, float value) {
  StoreFromFloat(values_.data(), spec_.dtype, view().ValueOffset(head, token) + dim, value);
}

void RandomLayer::SetCount(int32_t head, int32_t token, uint32_t count) {
  if (counts_.empty()) {
    counts_.assign(static_cast<size_t>(spec_.num_heads) * spec_.num_tokens, 1);
    spec_.with_counts = true;
  }
  counts_[view().RowIndex(head, token)] = count;
}

}  // namespace centroidkv::test
