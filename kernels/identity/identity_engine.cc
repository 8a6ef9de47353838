// IdentityEngine: the first t rows of each head, widened, with the tail counted in the last.
#include "kernels/identity/identity_engine.h"

#include <algorithm>

#include "centroidkv/common/dtype.h"

namespace centroidkv {
namespace {

// Widens row (h, t) of a tensor of `dim` elements per row to float.
void WidenRow(const LayerView& layer, const void* data, int64_t element_offset, int32_t dim,
              float* out) {
  LoadAsFloats(data, layer.dtype, element_offset, dim, out);
}

}  // namespace

absl::Status IdentityEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                          const CompressControl& control,
                                          CompressResult* out) const {
  if (control.IsCancelled()) return absl::CancelledError("job cancelled");
  const int32_t heads = layer.num_heads;
  const int32_t n = layer.num_tokens;
  out->num_heads = heads;
  out->num_tokens = n;
  out->key_dim = layer.key_dim;
  out->value_dim = layer.value_dim;
  // Rows kept per head: the target, or all n for a passthrough head (what a real job keeps).
  auto kept = [&](int32_t h) -> int64_t {
    return plan.passthrough[static_cast<size_t>(h)] ? int64_t{n}
                                                     : std::min<int64_t>(plan.target_length, n);
  };
  out->offsets.assign(static_cast<size_t>(heads) + 1, 0);
  for (int32_t h = 0; h < heads; ++h) out->offsets[h + 1] = out->offsets[h] + kept(h);
  const int64_t total = out->offsets.back();
  out->keys.resize(static_cast<size_t>(total) * layer.key_dim);
  out->values.resize(static_cast<size_t>(total) * layer.value_dim);
  out->counts.resize(static_cast<size_t>(total));
  for (int32_t h = 0; h < heads; ++h) {
    const int64_t keep = kept(h);
    for (int32_t t = 0; t < keep; ++t) {
      const int64_t row = out->offsets[h] + t;
      WidenRow(layer, layer.keys, layer.KeyOffset(h, t), layer.key_dim,
               &out->keys[static_cast<size_t>(row) * layer.key_dim]);
      WidenRow(layer, layer.values, layer.ValueOffset(h, t), layer.value_dim,
               &out->values[static_cast<size_t>(row) * layer.value_dim]);
      out->counts[static_cast<size_t>(row)] = layer.CountAt(h, t);
    }
    // The dropped tail is counted in the last kept row, so the counts keep their sum.
    uint32_t& last = out->counts[static_cast<size_t>(out->offsets[h] + keep - 1)];
    for (int64_t t = keep; t < n; ++t) last += layer.CountAt(h, static_cast<int32_t>(t));
  }
  if (plan.options.compute_assignment) {
    // Head-local output row of each input entry: entry t is row t, the tail the last row.
    out->assignment.resize(static_cast<size_t>(heads) * n);
    for (int32_t h = 0; h < heads; ++h) {
      const int64_t keep = kept(h);
      for (int32_t t = 0; t < n; ++t) {
        out->assignment[static_cast<size_t>(h) * n + t] =
            static_cast<int32_t>(std::min<int64_t>(t, keep - 1));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace centroidkv
