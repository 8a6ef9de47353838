// Steps 5, 6 and 8 of a pass: how many sources each head merges (kSelect: r per head,
// uniform heads, the stop, the sort segments) and which ones, the first r of the head's
// top-r order (kMarkKept).
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// Items J: step 5 (r per head, uniform_heads), step 8 (stop), and the sort segments.
CKV_HD void StageSelect(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                        int64_t job) {
  const int64_t first = job * p.heads;
  for (int64_t g = first; g < first + p.heads; ++g) {
    a.seg_begin[g] = static_cast<int32_t>(g * p.slot_capacity);
    a.seg_end[g] = a.seg_begin[g];
  }
  if (a.job_done[job] != 0) return;
  bool any_long = false;
  int64_t smallest = -1;  // min over compressed heads of r_h
  for (int64_t g = first; g < first + p.heads; ++g) {
    int64_t r = 0;
    if (a.head_active[g] != 0) {
      any_long = true;
      r = static_cast<int64_t>(a.head_length[g]) - p.target;
      if (a.head_candidates[g] < r) r = a.head_candidates[g];
    }
    a.head_merges[g] = static_cast<int32_t>(r);
    if (a.passthrough[g] == 0 && (smallest < 0 || r < smallest)) smallest = r;
  }
  if (!any_long) {
    a.job_done[job] = 1;
    return;
  }
  bool merged = false;
  for (int64_t g = first; g < first + p.heads; ++g) {
    if (p.uniform != 0) a.head_merges[g] = a.passthrough[g] != 0 ? 0 : static_cast<int32_t>(smallest);
    if (a.head_merges[g] > 0) {
      merged = true;
      // A head that keeps every source needs no order to choose them (StageMarkKept): its
      // segment stays empty and the sort skips it.
      if (a.head_merges[g] < a.head_slots[g]) a.seg_end[g] = a.seg_begin[g] + a.head_slots[g];
    }
  }
  if (!merged) {
    for (int64_t g = first; g < first + p.heads; ++g) a.seg_end[g] = a.seg_begin[g];
    a.job_done[job] = 1;
    return;
  }
  a.job_passes[job] = pass.pass + 1;
  if (pass.sink_output != 0) a.job_output_written[job] = 1;
}

// Items G * slot_capacity: step 6, the first r_h slots of the head's sorted order are kept.
CKV_HD void StageMarkKept(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.slot_capacity, q = item % p.slot_capacity;
  if (q >= a.head_merges[g]) return;
  // Every source kept (StageSelect left the head unsorted): slot q itself.
  const bool all = a.head_merges[g] == a.head_slots[g];
  a.edge_kept[g * p.slot_capacity + (all ? static_cast<int32_t>(q) : a.sort_values_out[item])] = 1;
}

}  // namespace centroidkv::cuda
