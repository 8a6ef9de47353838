// The packed output: where each head's rows start once heads are concatenated (kOffsets)
// and the rows of jobs no last pass wrote (kEmit), in the requested dtype.
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_lanes.h"
#include "kernels/cuda/stage_layout.h"
#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// One item: where each head's rows start once heads are concatenated. Run twice: in the last
// pass after kSelect (pass.sink_output), from the lengths that pass will leave (a head loses
// head_merges rows; heads of finished jobs keep theirs), so that kMerge writes packed rows
// directly; and at the end, from the final lengths (the same offsets), for kEmit.
CKV_HD void StageOffsets(const BatchParams& p, const BatchArrays& a, const PassArgs& pass) {
  int64_t total = 0;
  for (int64_t g = 0; g < p.global_heads(); ++g) {
    a.out_offsets[g] = total;
    total += a.head_length[g] - (pass.sink_output != 0 ? a.head_merges[g] : 0);
  }
  a.out_offsets[p.global_heads()] = total;
}

// Items G * n: the packed output rows of the jobs no last pass wrote (they stopped early, or
// had nothing to merge), from their current rows.
CKV_HD void StageEmit(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (a.job_output_written[g / p.heads] != 0 || row >= a.head_length[g]) return;
  const int32_t cur = a.head_cur[g];
  const int64_t to = a.out_offsets[g] + row;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    StoreResult(a.packed_keys, p.result_type, to * p.key_dim + j,
                static_cast<float>(LoadElement(p, a, g, cur, row, j, false)));
  }
  for (int32_t j = LaneIndex(); j < p.value_dim; j += LaneCount()) {
    StoreResult(a.packed_values, p.result_type, to * p.value_dim + j,
                static_cast<float>(LoadElement(p, a, g, cur, row, j, true)));
  }
  if (LeadLane()) a.packed_counts[to] = static_cast<uint32_t>(LoadCount(p, a, g, cur, row));
}

}  // namespace centroidkv::cuda
