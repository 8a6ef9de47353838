// Steps 3-4 of a pass (SPEC.md section 2): each source's best destination in its chunk. The
// reference's exact float64 cosine (ExactCosine), the rows normalised as float (kNormalize),
// the warp match with exact rescoring of near ties (kMatch), and the shared start and end of
// a source's edge, which the tensor-core match (tile_match.h) ends with ResolveSourceEdge.
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_lanes.h"
#include "kernels/cuda/stage_layout.h"
#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// The reference engine's cosine of rows ra and rb of head g, bit for bit.
CKV_HD double ExactCosine(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t ra, int64_t rb) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (int32_t j = 0; j < p.key_dim; ++j) {
    const double x = LoadElement(p, a, g, cur, ra, j, false);
    const double y = LoadElement(p, a, g, cur, rb, j, false);
    dot = AddRn(dot, MulRn(x, y));
    norm_a = AddRn(norm_a, MulRn(x, x));
    norm_b = AddRn(norm_b, MulRn(y, y));
  }
  double sa = SqrtRn(norm_a), sb = SqrtRn(norm_b);
  sa = sa < 1e-6 ? 1e-6 : sa;
  sb = sb < 1e-6 ? 1e-6 : sb;
  return DivRn(dot, MulRn(sa, sb));
}

// 1 / max(|key row|, 1e-6) in float64, the lanes of a warp splitting the sum (any order
// stays within MatchBound / TileMatchBound).
CKV_HD double InverseKeyNorm(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                             int64_t row) {
  double sum = 0.0;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    const double x = LoadElement(p, a, g, cur, row, j, false);
    sum += x * x;
  }
  sum = LaneSum(sum);
  double norm = SqrtRn(sum);
  norm = norm < 1e-6 ? 1e-6 : norm;
  return 1.0 / norm;
}

// Items G * n: each current row of an active head, normalised in float64, as float.
CKV_HD void StageNormalize(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (a.head_slots[g] == 0 || row >= a.head_length[g]) return;
  const int32_t cur = a.head_cur[g];
  const double inverse = InverseKeyNorm(p, a, g, cur, row);
  float* out = a.norm_keys + item * p.key_dim;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    out[j] = static_cast<float>(LoadElement(p, a, g, cur, row, j, false) * inverse);
  }
}

// The float score of two normalised rows (lanes split the elements; any summation order
// stays within MatchBound).
CKV_HD float FloatScore(const float* x, const float* y, int32_t dim) {
  float dot = 0.0f;
  for (int32_t j = LaneIndex(); j < dim; j += LaneCount()) dot += x[j] * y[j];
  return LaneSum(dot);
}

// Near ties a tile match lists per source (kMatchTiles); more than that is kTieOverflow,
// and ResolveSourceEdge then rescores every destination of the chunk exactly.
constexpr int32_t kMaxTies = 8;
constexpr int32_t kTieOverflow = -1;

// Source slot `item` of this pass (kMatch, ResolveSourceEdge).
struct SourceEdge {
  int64_t g = 0;        // its head
  int32_t cur = 0;      // the head's current rows
  int64_t source = 0;   // its row
  RowPlace place;       // its chunk
  int32_t destinations = 0;
};

// The start of steps 3-4 for source slot `item`: false when the slot is unused this pass, or
// when its chunk has no destination (its edge is then written: none). Otherwise resets its
// outputs and fills `edge`. Only `writer` (the lead lane of a warp stage; every thread of a
// thread stage) writes.
CKV_HD bool BeginSourceEdge(const BatchParams& p, const BatchArrays& a, int64_t item,
                            bool writer, SourceEdge* edge) {
  edge->g = item / p.slot_capacity;
  const int32_t slot = static_cast<int32_t>(item % p.slot_capacity);
  if (slot >= a.head_slots[edge->g]) return false;
  edge->cur = a.head_cur[edge->g];
  edge->source = SlotRow(p, slot);
  edge->place = PlaceRow(p, a, edge->g, edge->source);
  edge->destinations = edge->place.length / 2;
  if (writer) {
    a.edge_kept[item] = 0;
    a.sort_values_in[item] = slot;
    if (edge->destinations == 0) {
      a.edge_dest[item] = -1;
      a.edge_score[item] = 0.0;
      a.sort_keys_in[item] = 0;
    }
  }
  return edge->destinations > 0;
}

// The end of steps 3-4: the source's exact best edge (destination k of its chunk, exact
// score), whether it is a candidate, and its sort key.
CKV_HD void EndSourceEdge(const BatchArrays& a, const PassArgs& pass, int64_t g, int64_t item,
                          bool writer, const RowPlace& place, int32_t best, double exact) {
  const bool candidate = pass.floor_on == 0 || exact >= pass.floor;
  if (!writer) return;
  a.edge_dest[item] = static_cast<int32_t>(place.first + 2 * best + 1);
  a.edge_score[item] = exact;
  a.sort_keys_in[item] = candidate ? OrderKey(exact) : 0;
  if (candidate) AtomicIncrement(&a.head_candidates[g]);
}

// Items G * slot_capacity: steps 3-4 for one source, its exact best edge and whether it is
// a candidate, plus its sort key.
CKV_HD void StageMatch(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  SourceEdge edge;
  if (!BeginSourceEdge(p, a, item, LeadLane(), &edge)) return;
  const int64_t g = edge.g, source = edge.source;
  const int32_t cur = edge.cur, destinations = edge.destinations;
  const RowPlace& place = edge.place;
  const float* rows = a.norm_keys + g * p.num_tokens * p.key_dim;
  const float* x = rows + source * p.key_dim;
  float top = 0.0f, second = 0.0f;
  int32_t best = -1;
  for (int32_t k = 0; k < destinations; ++k) {
    const float score = FloatScore(x, rows + (place.first + 2 * k + 1) * p.key_dim, p.key_dim);
    if (best < 0 || score > top) {
      second = best < 0 ? score : top;
      top = score;
      best = k;
    } else if (k == 1 || score > second) {
      second = score;
    }
  }
  double exact = 0.0;
  const double margin = 2.0 * p.bound;
  if (destinations >= 2 && static_cast<double>(second) >= static_cast<double>(top) - margin) {
    // A near tie in float: rescore every destination that could be the exact best.
    best = -1;
    for (int32_t k = 0; k < destinations; ++k) {
      const float score =
          FloatScore(x, rows + (place.first + 2 * k + 1) * p.key_dim, p.key_dim);
      if (static_cast<double>(score) < static_cast<double>(top) - margin) continue;
      const double s = ExactCosine(p, a, g, cur, source, place.first + 2 * k + 1);
      if (best < 0 || s > exact) {
        best = k;
        exact = s;
      }
    }
  } else {
    exact = ExactCosine(p, a, g, cur, source, place.first + 2 * best + 1);
  }
  EndSourceEdge(a, pass, g, item, LeadLane(), place, best, exact);
}

// Steps 3-4 for source slot `item` after the tile match listed its near ties (every
// destination whose tensor-core score is within 2 TileMatchBound of its best, so the exact
// best among them): the exact best of the list (lowest destination on equal scores), or of
// every destination when the list overflowed; then its edge, candidacy and sort key. Run by
// the tile match's block right after it wrote the list (tile_match.h), one thread per source:
// the float64 cosine is a sequential sum (the reference's order), so lanes cannot share one,
// and the rows are still in L2.
CKV_HD void ResolveSourceEdge(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                              int64_t item) {
  SourceEdge edge;
  if (!BeginSourceEdge(p, a, item, true, &edge)) return;
  const int64_t g = edge.g, source = edge.source;
  const int32_t cur = edge.cur, destinations = edge.destinations;
  const RowPlace& place = edge.place;
  const int32_t listed = a.match_count[item];
  const int32_t* ties = a.match_ties + item * kMaxTies;
  const int32_t count = listed == kTieOverflow ? destinations : listed;
  int32_t best = -1;
  double exact = 0.0;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t k = listed == kTieOverflow ? i : ties[i];
    const double s = ExactCosine(p, a, g, cur, source, place.first + 2 * k + 1);
    if (best < 0 || s > exact || (s == exact && k < best)) {
      best = k;
      exact = s;
    }
  }
  EndSourceEdge(a, pass, g, item, true, place, best, exact);
}

}  // namespace centroidkv::cuda
