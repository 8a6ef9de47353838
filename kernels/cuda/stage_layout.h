// Where the stages find rows (the layout of layer_stages.h): each element and count of a
// head's current rows, in the input's layout or a float64 state buffer; where a row sits in
// this pass's chunking (RowPlace) and the row of a source slot; and the stages that set the
// heads up: kInit (identity assignment, per-head and per-job state) and kSetup (which heads
// take part in a pass, and their source slots).
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// Row access.

// Element (row, j) of head g's current keys (values when `values`), widened exactly.
CKV_HD double LoadElement(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t row, int32_t j, bool values) {
  const int32_t dim = values ? p.value_dim : p.key_dim;
  if (cur != 0) {
    const double* state = values ? a.state_values[cur - 1] : a.state_keys[cur - 1];
    return state[(g * p.num_tokens + row) * dim + j];
  }
  const int64_t job = g / p.heads, h = g % p.heads;
  const int64_t local = p.token_major != 0 ? row * p.heads + h : h * p.num_tokens + row;
  const int64_t index = (job * p.heads * p.num_tokens + local) * dim + j;
  const void* data = values ? a.values_in : a.keys_in;
  switch (p.input_type) {
    case kInputF16:
      return static_cast<double>(HalfBitsToFloat(static_cast<const uint16_t*>(data)[index]));
    case kInputBF16:
      return static_cast<double>(BFloat16BitsToFloat(static_cast<const uint16_t*>(data)[index]));
    default:
      return static_cast<double>(static_cast<const float*>(data)[index]);
  }
}

CKV_HD uint64_t LoadCount(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t row) {
  if (cur != 0) return a.state_counts[cur - 1][g * p.num_tokens + row];
  const int64_t job = g / p.heads, h = g % p.heads;
  const int64_t local = p.token_major != 0 ? row * p.heads + h : h * p.num_tokens + row;
  return a.counts_in[job * p.heads * p.num_tokens + local];
}

CKV_HD int32_t NextBuffer(int32_t cur) { return cur == 1 ? 2 : 1; }

// Where row `row` of head g sits in this pass's chunking.
struct RowPlace {
  bool in_range = false;
  bool source = false;  // even offset
  int32_t slot = -1;    // its source slot when `source`
  int64_t first = 0;    // the chunk's first row
  int32_t length = 0;   // the chunk's rows
  int32_t first_slot = 0;
};

CKV_HD RowPlace PlaceRow(const BatchParams& p, const BatchArrays& a, int64_t g, int64_t row) {
  RowPlace place;
  const int64_t begin = p.sink, end = static_cast<int64_t>(a.head_length[g]) - p.recent;
  if (row < begin || row >= end) return place;
  const int64_t chunk = (row - begin) / p.chunk;
  const int32_t offset = static_cast<int32_t>((row - begin) % p.chunk);
  const int32_t half = (p.chunk + 1) / 2;
  place.in_range = true;
  place.source = offset % 2 == 0;
  place.first = begin + chunk * p.chunk;
  place.length = static_cast<int32_t>(end - place.first < p.chunk ? end - place.first : p.chunk);
  place.first_slot = static_cast<int32_t>(chunk * half);
  if (place.source) place.slot = place.first_slot + offset / 2;
  return place;
}

// Chunks of a head at its longest (pass 0): the item count per head of chunk stages.
CKV_HD int64_t ChunksPerHead(const BatchParams& p) {
  const int64_t range = static_cast<int64_t>(p.num_tokens) - p.sink - p.recent;
  return range <= 0 ? 0 : (range + p.chunk - 1) / p.chunk;
}

// The row of source slot `slot` of head g.
CKV_HD int64_t SlotRow(const BatchParams& p, int64_t slot) {
  const int32_t half = (p.chunk + 1) / 2;
  return p.sink + (slot / half) * p.chunk + 2 * (slot % half);
}

// Items G * n: the identity assignment and the initial per-head / per-job state.
CKV_HD void StageInit(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, i = item % p.num_tokens;
  a.owner[item] = static_cast<int32_t>(i);
  if (i != 0) return;
  a.head_cur[g] = 0;
  a.head_length[g] = p.num_tokens;
  if (g % p.heads != 0) return;
  const int64_t job = g / p.heads;
  a.job_done[job] = 0;
  a.job_passes[job] = 0;
  a.job_output_written[job] = 0;
}

// Items G: step 1, which heads take part in this pass.
CKV_HD void StageSetup(const BatchParams& p, const BatchArrays& a, int64_t g) {
  const bool done = a.job_done[g / p.heads] != 0;
  const int32_t length = a.head_length[g];
  const bool active = !done && a.passthrough[g] == 0 && length > p.target;
  a.head_active[g] = active ? 1 : 0;
  a.head_slots[g] = active ? SlotsInRange(static_cast<int64_t>(length) - p.sink - p.recent,
                                          p.chunk)
                           : 0;
  a.head_candidates[g] = 0;
  a.head_merges[g] = 0;
}

}  // namespace centroidkv::cuda
