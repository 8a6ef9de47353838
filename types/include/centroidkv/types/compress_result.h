// The output of one layer job with its honest account (targets, entries, stop reasons per
// head), as the engine writes it and the wire carries it. Header-only; a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "centroidkv/types/kinds.h"

namespace centroidkv {

// The output of one layer job: heads concatenated along the entry axis, in
// CompressOptions::result_dtype: float32 rows in `keys` / `values`, or fp16 / bf16 rows (each
// the float32 result rounded once) in `half_keys` / `half_values`; the other pair is empty.
struct CompressResult {
  int32_t num_heads = 0;
  int32_t num_tokens = 0;  // input entries per head
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  DType dtype = DType::kFloat32;     // of the rows
  std::vector<int64_t> offsets;      // [H + 1]: head h owns rows offsets[h] .. offsets[h+1]
  std::vector<float> keys;           // [total, key_dim] when dtype is float32
  std::vector<float> values;         // [total, value_dim]
  std::vector<uint16_t> half_keys;   // [total, key_dim] fp16 / bf16 bits otherwise
  std::vector<uint16_t> half_values; // [total, value_dim]
  std::vector<uint32_t> counts;      // [total]
  std::vector<int32_t> assignment;   // [H, n] head-local output row of each input entry,
                                     // empty unless CompressOptions::compute_assignment
  int32_t passes_run = 0;            // passes that merged something (both stages of
                                     // exact_target)
  // The honest account, filled by ClusterEngine for every backend:
  TensorLayout layout = TensorLayout::kHeadMajor;  // of the rows (output_layout)
  int32_t padded_length = 0;         // rows per head when padded, else 0
  int64_t target_length = 0;         // t
  bool target_reached = false;       // every compressed head has at most t entries
  std::vector<int32_t> head_tokens;  // [H] input entries per head (padding included)
  std::vector<int32_t> head_entries; // [H] real (count > 0) output entries per head
  std::vector<uint64_t> head_input_tokens;  // [H] sum of the input counts per head
  std::vector<StopReason> stop_reasons;     // [H]

  int64_t total_entries() const { return offsets.empty() ? 0 : offsets.back(); }
  // Elements of the key / value rows, whichever array holds them.
  size_t key_elements() const { return dtype == DType::kFloat32 ? keys.size() : half_keys.size(); }
  size_t value_elements() const {
    return dtype == DType::kFloat32 ? values.size() : half_values.size();
  }
};

}  // namespace centroidkv
