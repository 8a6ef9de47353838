// Step 7 of a pass: the kept sources merged into their destinations. The compaction (each
// row's index after the pass: kIndexCount, kIndexPrefix, kIndex), each destination's kept
// sources in the reference's order (kBucket), the merged or copied rows (kMerge), the
// assignment (kOwner) and the heads' new lengths and buffers (kFinish).
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_lanes.h"
#include "kernels/cuda/stage_layout.h"
#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// The reference's order of kept edges: score descending, then source ascending.
CKV_HD bool Precedes(const BatchArrays& a, int64_t base, int32_t x, int32_t y) {
  const double sx = a.edge_score[base + x], sy = a.edge_score[base + y];
  if (sx != sy) return sx > sy;
  return x < y;
}

CKV_HD bool IsKeptSource(const BatchParams& p, const BatchArrays& a, int64_t g, int64_t row,
                         int32_t* slot) {
  const RowPlace place = PlaceRow(p, a, g, row);
  if (!place.source || place.slot >= a.head_slots[g]) return false;  // a lone last row
  *slot = place.slot;
  return a.edge_kept[g * p.slot_capacity + place.slot] != 0;
}

// Whether this pass rewrites head g's rows: a merging head, or every head of a job whose
// float output this (last) pass writes.
CKV_HD bool RewritesHead(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                         int64_t g) {
  if (a.job_done[g / p.heads] != 0) return false;
  return a.head_merges[g] > 0 || pass.sink_output != 0;
}

// The compaction of step 7 (each row's index after the pass) in three stages over blocks of
// kIndexBlockRows rows, so that a head's rows are not one thread's sequential loop: kept
// sources per block (kIndexCount), their exclusive prefix per head (kIndexPrefix), then each
// block's rows (kIndex).
constexpr int32_t kIndexBlockRows = 256;
CKV_HD int64_t IndexBlocks(const BatchParams& p) {
  return (p.num_tokens + kIndexBlockRows - 1) / kIndexBlockRows;
}

// Block `item` of the compaction: head g's current rows first .. end - 1; false when the pass
// does not rewrite the head.
struct IndexBlock {
  int64_t g = 0, first = 0, end = 0;
};
CKV_HD bool FindIndexBlock(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                           int64_t item, IndexBlock* block) {
  block->g = item / IndexBlocks(p);
  block->first = item % IndexBlocks(p) * kIndexBlockRows;
  const int64_t length = a.head_length[block->g];
  block->end = block->first + kIndexBlockRows < length ? block->first + kIndexBlockRows : length;
  return RewritesHead(p, a, pass, block->g);
}

// Items G * IndexBlocks: the kept sources among the block's current rows.
CKV_HD void StageIndexCount(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                            int64_t item) {
  IndexBlock block;
  if (!FindIndexBlock(p, a, pass, item, &block)) return;
  const int64_t g = block.g;
  int32_t kept = 0;
  for (int64_t row = block.first; row < block.end; ++row) {
    int32_t slot = -1;
    kept += IsKeptSource(p, a, g, row, &slot) ? 1 : 0;
  }
  a.index_blocks[item] = kept;
}

// Items G: each block's count becomes the kept sources of the head before it.
CKV_HD void StageIndexPrefix(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                             int64_t g) {
  if (!RewritesHead(p, a, pass, g)) return;
  int32_t* blocks = a.index_blocks + g * IndexBlocks(p);
  int32_t before = 0;
  for (int64_t b = 0; b < IndexBlocks(p); ++b) {
    const int32_t kept = blocks[b];
    blocks[b] = before;
    before += kept;
  }
}

// Items G * IndexBlocks: each row of the block, its index after the pass (-1: merged away).
CKV_HD void StageIndex(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  IndexBlock block;
  if (!FindIndexBlock(p, a, pass, item, &block)) return;
  const int64_t g = block.g;
  int32_t* index = a.new_index + g * p.num_tokens;
  int32_t kept = a.index_blocks[item];
  for (int64_t row = block.first; row < block.end; ++row) {
    int32_t slot = -1;
    if (IsKeptSource(p, a, g, row, &slot)) {
      index[row] = -1;
      ++kept;
    } else {
      index[row] = static_cast<int32_t>(row) - kept;
    }
  }
}

// Items G * ChunksPerHead: for each destination row of the chunk, its kept sources in the
// reference's order (score descending, then source ascending) as a list: the first in
// bucket_head[row], each one's next in bucket_next[slot]. One thread per chunk inserts the
// chunk's kept sources one by one into their destination's sorted list (lists are short:
// O(C) per chunk for spread-out edges, O(C^2) at worst when all go to one destination).
CKV_HD void StageBucket(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / ChunksPerHead(p), chunk = item % ChunksPerHead(p);
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  const int64_t first = p.sink + chunk * p.chunk;
  if (first >= static_cast<int64_t>(a.head_length[g]) - p.recent) return;  // past the range
  const RowPlace place = PlaceRow(p, a, g, first);
  int32_t* heads = a.bucket_head + g * p.num_tokens;
  for (int32_t offset = 1; offset < place.length; offset += 2) heads[first + offset] = -1;
  const int64_t base = g * p.slot_capacity;
  const int32_t end_slot = place.first_slot + (place.length + 1) / 2 < a.head_slots[g]
                               ? place.first_slot + (place.length + 1) / 2
                               : a.head_slots[g];
  for (int32_t s = place.first_slot; s < end_slot; ++s) {
    if (a.edge_kept[base + s] == 0) continue;
    int32_t* link = &heads[a.edge_dest[base + s]];
    while (*link >= 0 && Precedes(a, base, *link, s)) link = &a.bucket_next[base + *link];
    a.bucket_next[base + s] = *link;
    *link = s;
  }
}

// Items G * n: step 7, each surviving row written to its new place: merged with its kept
// sources (float64, the reference's order) or copied exactly. On the last pass straight into
// the packed float output (out_offsets computed ahead, see StageOffsets), else into the
// head's other float64 buffer.
CKV_HD void StageMerge(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (!RewritesHead(p, a, pass, g) || row >= a.head_length[g]) return;
  const int32_t new_row = a.new_index[item];
  if (new_row < 0) return;
  const int32_t cur = a.head_cur[g];
  const int64_t base = g * p.slot_capacity;
  int32_t first = -1;
  if (a.head_merges[g] > 0) {
    const RowPlace place = PlaceRow(p, a, g, row);
    if (place.in_range && !place.source) first = a.bucket_head[item];
  }
  const uint64_t own = LoadCount(p, a, g, cur, row);
  uint64_t total = own;
  for (int32_t s = first; s >= 0; s = a.bucket_next[base + s]) {
    total += LoadCount(p, a, g, cur, SlotRow(p, s));
  }
  const int64_t out_row = g * p.num_tokens + new_row;
  const int64_t packed_row = a.out_offsets[g] + new_row;  // the last pass writes packed rows
  const int32_t next = NextBuffer(cur);
  for (int32_t part = 0; part < 2; ++part) {
    const bool values = part == 1;
    const int32_t dim = values ? p.value_dim : p.key_dim;
    for (int32_t j = LaneIndex(); j < dim; j += LaneCount()) {
      double v = LoadElement(p, a, g, cur, row, j, values);
      if (first >= 0) {
        double sum = MulRn(static_cast<double>(own), v);
        for (int32_t s = first; s >= 0; s = a.bucket_next[base + s]) {
          const int64_t source = SlotRow(p, s);
          sum = AddRn(sum, MulRn(static_cast<double>(LoadCount(p, a, g, cur, source)),
                                 LoadElement(p, a, g, cur, source, j, values)));
        }
        v = DivRn(sum, static_cast<double>(total));
      }
      if (pass.sink_output != 0) {
        StoreResult(values ? a.packed_values : a.packed_keys, p.result_type, packed_row * dim + j,
                    static_cast<float>(v));
      } else {
        (values ? a.state_values : a.state_keys)[next - 1][out_row * dim + j] = v;
      }
    }
  }
  if (!LeadLane()) return;
  if (pass.sink_output != 0) {
    a.packed_counts[packed_row] = static_cast<uint32_t>(total);
  } else {
    a.state_counts[next - 1][out_row] = total;
  }
}

// Items G * n: the assignment follows each input entry to its new row.
CKV_HD void StageOwner(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens;
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  int64_t row = a.owner[item];
  int32_t slot = -1;
  if (IsKeptSource(p, a, g, row, &slot)) row = a.edge_dest[g * p.slot_capacity + slot];
  a.owner[item] = a.new_index[g * p.num_tokens + row];
}

// Items G: the head's new length and row buffer.
CKV_HD void StageFinish(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                        int64_t g) {
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  a.head_length[g] -= a.head_merges[g];
  if (pass.sink_output == 0) a.head_cur[g] = NextBuffer(a.head_cur[g]);
}

}  // namespace centroidkv::cuda
