// The CUDA backend's algorithm (SPEC.md section 2) as a fixed sequence of *stages*, each a
// function of one independent item (a row, a source, a head, a job) over plain arrays. The
// device runs each stage as one kernel launch over all items of a batch of layer jobs
// (layer_kernels.cu); the host runs the very same functions in plain loops
// (host_pipeline.h), so the whole algorithm is tested by the conformance suite on any
// machine, with or without a GPU. Only the per-head top-r sort differs (CUB on the device,
// std::stable_sort on the host), and both are stable sorts of the same keys.
//
// Exactness (same results as the reference engine, bit for bit):
// - The similarity search (the O(n * C * d) part) runs in float32 on rows normalised in
//   float64. A float score is within kBound(d) = (2 d + 16) 2^-24 of the reference's float64
//   cosine (float rounding of each normalised element, u = 2^-24 relative, and a dot product
//   chain, at most d u relative to sum |x^_j y^_j| <= 1). The float best destination of a
//   source is taken only when the float runner-up is more than 2 bound below it; otherwise
//   every destination within 2 bound of the float best is rescored exactly and the exact
//   best wins (lowest destination on ties).
// - The chosen edge of every source is then rescored with the reference's float64 cosine
//   (same operation order; __dmul_rn / __dadd_rn on the device so that nothing is fused), so
//   the floor test, the top-r order (score descending, then source ascending) and the order
//   of each destination's sums are the reference's own decisions.
// - Merges are float64 in the reference's operation order; rows between passes stay float64.
//
// Layout (all arrays head-major over the batch's G = jobs * heads "global heads" g; job j
// owns heads j * H .. j * H + H - 1): rows of head g at g * n + row; source slots of head g at
// g * slot_capacity + slot, where slot = chunk * ceil(C / 2) + offset / 2.
//
// Thread-safety: the item functions write only their own item's outputs, except the
// documented atomic counter (head_candidates); stages are separated by kernel boundaries.
//
// The stages live in a header each by what they do, in pass order: stage_layout.h (rows,
// chunks and slots; kInit, kSetup), stage_match.h (kNormalize, kMatch, and the end of
// kMatchTiles, whose block is tile_match.h), stage_select.h (kSelect, kMarkKept),
// stage_merge.h (kIndexCount, kIndexPrefix, kIndex, kBucket, kMerge, kOwner, kFinish) and
// stage_emit.h (kOffsets, kEmit), on what they share: stage_types.h (parameters, stage ids,
// arrays), stage_scalars.h (exact arithmetic, conversions, bounds) and stage_lanes.h (warp
// lanes and their host emulation). This header adds RunStageItem, the switch over them.
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_emit.h"
#include "kernels/cuda/stage_lanes.h"
#include "kernels/cuda/stage_layout.h"
#include "kernels/cuda/stage_match.h"
#include "kernels/cuda/stage_merge.h"
#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_select.h"
#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// Runs item `item` of stage `id` (a switch the device kernels resolve at compile time).
CKV_HD void RunStageItem(StageId id, const BatchParams& p, const BatchArrays& a,
                         const PassArgs& pass, int64_t item) {
  switch (id) {
    case StageId::kInit: StageInit(p, a, item); return;
    case StageId::kSetup: StageSetup(p, a, item); return;
    case StageId::kNormalize: StageNormalize(p, a, item); return;
    case StageId::kMatch: StageMatch(p, a, pass, item); return;
    case StageId::kSelect: StageSelect(p, a, pass, item); return;
    case StageId::kMarkKept: StageMarkKept(p, a, item); return;
    case StageId::kIndexCount: StageIndexCount(p, a, pass, item); return;
    case StageId::kIndexPrefix: StageIndexPrefix(p, a, pass, item); return;
    case StageId::kIndex: StageIndex(p, a, pass, item); return;
    case StageId::kBucket: StageBucket(p, a, item); return;
    case StageId::kMerge: StageMerge(p, a, pass, item); return;
    case StageId::kOwner: StageOwner(p, a, item); return;
    case StageId::kFinish: StageFinish(p, a, pass, item); return;
    case StageId::kEmit: StageEmit(p, a, item); return;
    case StageId::kOffsets: StageOffsets(p, a, pass); return;
    case StageId::kMatchTiles: return;  // a block stage: TileMatchBlock (tile_match.h)
  }
}

}  // namespace centroidkv::cuda
