// IdentityEngine: the first t rows of each head, widened, with the tail counted in the last.
#include "kernels/identity/identity_engine.h"

#include <algorithm>
#include <cstring>

#include "centroidkv/common/dtype.h"

namespace centroidkv {
namespace {

// Copies `rows` rows of `dim` elements starting at input row (h, t) of a tensor to `out`, in
// `out_dtype`: the bytes as they are when the dtypes agree, else widened to float and
// rounded once (what RoundResultRows does to float rows).
void CopyRows(const LayerView& layer, const void* data, int64_t element_offset, int32_t dim,
              int64_t rows, DType out_dtype, void* out) {
  const int64_t elements = rows * dim;
  if (layer.dtype == out_dtype) {
    const size_t size = DTypeSize(out_dtype);
    std::memcpy(out, static_cast<const char*>(data) + element_offset * size,
                static_cast<size_t>(elements) * size);
    return;
  }
  if (out_dtype == DType::kFloat32) {
    LoadAsFloats(data, layer.dtype, element_offset, elements, static_cast<float*>(out));
    return;
  }
  float row[512];
  for (int64_t done = 0; done < elements;) {
    const int64_t step = std::min<int64_t>(elements - done, 512);
    LoadAsFloats(data, layer.dtype, element_offset + done, step, row);
    StoreFromFloats(out, out_dtype, done, step, row);
    done += step;
  }
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
  const DType dtype = plan.options.result_dtype;
  const size_t element = DTypeSize(dtype);
  out->dtype = dtype;
  out->rows_in_target = plan.row_target != nullptr;
  void* keys = nullptr;
  void* values = nullptr;
  if (out->rows_in_target) {
    keys = plan.row_target->keys;
    values = plan.row_target->values;
  } else if (dtype == DType::kFloat32) {
    out->keys.resize(static_cast<size_t>(total) * layer.key_dim);
    out->values.resize(static_cast<size_t>(total) * layer.value_dim);
    keys = out->keys.data();
    values = out->values.data();
  } else {
    out->half_keys.resize(static_cast<size_t>(total) * layer.key_dim);
    out->half_values.resize(static_cast<size_t>(total) * layer.value_dim);
    keys = out->half_keys.data();
    values = out->half_values.data();
  }
  out->counts.resize(static_cast<size_t>(total));
  for (int32_t h = 0; h < heads; ++h) {
    const int64_t keep = kept(h);
    const int64_t first = out->offsets[h];
    // A head's first `keep` tokens, row by row unless the layout keeps them contiguous.
    const bool contiguous = layer.layout == TensorLayout::kHeadMajor;
    for (int64_t t = 0; t < keep; t += contiguous ? keep : 1) {
      const int64_t rows = contiguous ? keep : 1;
      const int32_t token = static_cast<int32_t>(t);
      CopyRows(layer, layer.keys, layer.KeyOffset(h, token), layer.key_dim, rows, dtype,
               static_cast<char*>(keys) + (first + t) * layer.key_dim * element);
      CopyRows(layer, layer.values, layer.ValueOffset(h, token), layer.value_dim, rows, dtype,
               static_cast<char*>(values) + (first + t) * layer.value_dim * element);
    }
    for (int32_t t = 0; t < keep; ++t) {
      out->counts[static_cast<size_t>(first + t)] = layer.CountAt(h, t);
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
