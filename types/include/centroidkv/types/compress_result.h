// The output of one layer job with its honest account (targets, entries, stop reasons per
// head), as the engine writes it and the wire carries it. Header-only; a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "centroidkv/types/kinds.h"

namespace centroidkv {

// Caller-owned memory for a result's key and value rows (a client's shared memory region, as
// the service maps it): an engine that writes rows in place (EngineCaps::writes_rows_in_place)
// puts them here instead of into the result's own arrays, laid out exactly as those arrays
// would hold them ([total, dim] in the result's dtype, heads concatenated). Borrowed.
struct ResultRowTarget {
  void* keys = nullptr;
  uint64_t key_bytes = 0;  // capacity
  void* values = nullptr;
  uint64_t value_bytes = 0;
};

// The output of one layer job: heads concatenated along the entry axis, in
// CompressOptions::result_dtype: float32 rows in `keys` / `values`, fp16 / bf16 rows (each
// the float32 result rounded once) in `half_keys` / `half_values`, or fp8 rows (each the
// float32 result divided by its head's scale, rounded once, saturating) in `fp8_keys` /
// `fp8_values` with the scales in `key_scales` / `value_scales`; the other pairs are empty.
// When `rows_in_target` is set, both pairs are empty and the rows are in the caller's
// ResultRowTarget (CompressControl::row_target) instead.
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
  std::vector<uint8_t> fp8_keys;     // [total, key_dim] fp8 codes when dtype is fp8
  std::vector<uint8_t> fp8_values;   // [total, value_dim]
  std::vector<float> key_scales;     // [H] fp8: head h's rows stand for code x key_scales[h]
  std::vector<float> value_scales;   // [H]
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
  // Budgeted jobs (CompressOptions::head_budgets, or scores): each head's budget; else empty.
  std::vector<int32_t> head_budgets;
  // Scored jobs: the entries of each head kept exact (sinks, recent and top-scored, or a
  // whole passthrough head); the rest of head_entries are tail centroids. Else empty.
  std::vector<int32_t> head_exact_entries;
  // Fitted jobs: each row's log-weight, added to its key's logit instead of ln(count)
  // ([total], in the rows' layout, -infinity for padding rows); else empty.
  std::vector<float> log_weights;
  bool rows_in_target = false;       // the rows went to CompressControl::row_target
  // Whether rounding the rows once to an fp16 / bf16 dtype made a finite value Inf, per
  // tensor, as the backend that rounded them saw it while writing them (the cpu backend);
  // kNotChecked where it did not look (the service then reads the rows again,
  // service/result_range.h).
  enum class RoundingCheck : uint8_t { kNotChecked, kFits, kOverflows };
  RoundingCheck key_rounding = RoundingCheck::kNotChecked;
  RoundingCheck value_rounding = RoundingCheck::kNotChecked;
  // Not part of the result: the widened input of an fp8 job (kernels/fp8_rows.h), kept with
  // the result's other buffers so that a CompressInto caller that reuses its result (and
  // counts its capacity, as the service's ResultPool does) pays for the pages once.
  std::vector<float> fp8_input_scratch;

  int64_t total_entries() const { return offsets.empty() ? 0 : offsets.back(); }
  // Elements of the key / value rows, whichever array holds them.
  size_t key_elements() const {
    if (rows_in_target) return static_cast<size_t>(total_entries()) * key_dim;
    if (IsFp8(dtype)) return fp8_keys.size();
    return dtype == DType::kFloat32 ? keys.size() : half_keys.size();
  }
  size_t value_elements() const {
    if (rows_in_target) return static_cast<size_t>(total_entries()) * value_dim;
    if (IsFp8(dtype)) return fp8_values.size();
    return dtype == DType::kFloat32 ? values.size() : half_values.size();
  }
};

}  // namespace centroidkv
