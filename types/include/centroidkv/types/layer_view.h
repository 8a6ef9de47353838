// A layer job's input as the engine, the wire codec and the client all see it: one layer of
// one sequence in host memory, borrowed. Header-only; a view, so thread-compatible.
#pragma once

#include <cstdint>
#include <span>

#include "centroidkv/types/kinds.h"

namespace centroidkv {

// One layer of one sequence in host memory, borrowed for the duration of Compress().
// Ragged layers (head_offsets set) give each head its own number of entries: the heads'
// rows one after another, head-major only, num_tokens = the longest head. Count-0 rows at
// the end of a head are padding (never merged, not returned, assignment -1). Backends never
// see either: ClusterEngine::Compress runs such a layer as regular jobs (kernels/ragged_layer.h).
struct LayerView {
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kHeadMajor;
  int32_t num_heads = 0;
  int32_t num_tokens = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  const void* keys = nullptr;        // H * n * key_dim elements of dtype
  const void* values = nullptr;      // H * n * value_dim elements of dtype
  const uint32_t* counts = nullptr;  // H * n entries, or null for "all 1"
  // [H + 1] when ragged: head h owns rows head_offsets[h] .. head_offsets[h + 1]; else null.
  const int64_t* head_offsets = nullptr;
  // fp8 input only (dtype kFp8E4M3 / kFp8E5M2): element e of a key row of head h stands for
  // e x key_scales[h] (vLLM's k_scale / v_scale). One entry (per layer: every head) or one
  // per head; each finite and > 0. Empty for other dtypes.
  std::span<const float> key_scales{};
  std::span<const float> value_scales{};
  // Scored jobs: each entry's importance, laid out as counts are (RowIndex), finite; or
  // null. The top-scored entries are kept exact (docs/scored-jobs.md).
  const float* scores = nullptr;
  // Fitted jobs: reference queries [num_query_heads, num_queries, key_dim] float32, after
  // RoPE; query head q belongs to KV head q / (num_query_heads / num_heads). Or null.
  const float* queries = nullptr;
  int32_t num_query_heads = 0;
  int32_t num_queries = 0;

  // Entries of head `head` (num_tokens unless ragged), and rows of the whole layer.
  int32_t HeadTokens(int32_t head) const {
    return head_offsets == nullptr
               ? num_tokens
               : static_cast<int32_t>(head_offsets[head + 1] - head_offsets[head]);
  }
  int64_t TotalRows() const {
    return head_offsets == nullptr ? static_cast<int64_t>(num_heads) * num_tokens
                                   : head_offsets[num_heads];
  }
  // Element index of (head, token, 0) in keys / values, and of (head, token) in counts.
  int64_t KeyOffset(int32_t head, int32_t token) const { return RowIndex(head, token) * key_dim; }
  int64_t ValueOffset(int32_t head, int32_t token) const {
    return RowIndex(head, token) * value_dim;
  }
  int64_t RowIndex(int32_t head, int32_t token) const {
    if (head_offsets != nullptr) return head_offsets[head] + token;
    return layout == TensorLayout::kHeadMajor
               ? static_cast<int64_t>(head) * num_tokens + token
               : static_cast<int64_t>(token) * num_heads + head;
  }
  // The scale of head `head`'s key / value elements (fp8 input).
  float KeyScale(int32_t head) const { return key_scales[key_scales.size() == 1 ? 0 : head]; }
  float ValueScale(int32_t head) const {
    return value_scales[value_scales.size() == 1 ? 0 : head];
  }
  uint32_t CountAt(int32_t head, int32_t token) const {
    return counts == nullptr ? 1u : counts[RowIndex(head, token)];
  }
  // Query heads per KV head (the GQA group), for a fitted job.
  int32_t QueryGroup() const { return num_heads == 0 ? 0 : num_query_heads / num_heads; }
};

}  // namespace centroidkv
