// From float32 matches to exactly the reference engine's decisions (SPEC.md section 2 steps
// 3, 4 and 6, and the order of step 7's sums). Every float score is within `bound` =
// MatchErrorBound(kernels, dim) of the reference's float64 score (soft_match.h), so:
// - argmax: when a source's float top two differ by more than 2 * bound, the float best is
//   the reference's best. Otherwise every destination whose float score is within 2 * bound
//   of the top is rescored exactly, and the exact best wins (the lowest destination on ties);
//   on a matrix engine the matcher lists those destinations (NearTies), elsewhere they are
//   found by rescoring the source's row in float.
// - floor: a float score more than `bound` from the floor decides; otherwise it is rescored.
// - top r: with tau the r-th highest score, a score above tau + 2 * bound is surely kept and
//   one below tau - 2 * bound surely not (each scores above/below at least r others); only
//   the scores in between are rescored and ordered exactly (score descending, then source).
// - merge order: the kept sources of one destination are summed in the order of the global
//   top-r list; where float scores cannot order two of them, they are rescored.
// Rescoring (ExactCosine) is rare: it costs O(dim) per edge, against O(dim * C / 2) for
// matching one source.
// Thread-compatible: each function touches only the edges it is given.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/exact_cosine.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/soft_match.h"

namespace centroidkv::cpu {

// The best edge of one source in the current pass.
struct Edge {
  double score = 0.0;        // the reference's float64 cosine when `exact`, else the float32
                             // score (within the bound of it)
  int32_t source = 0;        // a: row of the head
  int32_t destination = -1;  // b: row of the head; -1 when the source has no destination
  bool exact = false;
  bool candidate = false;  // score >= the pass's floor (decided exactly)
  bool kept = false;       // among the r edges merged this pass
};

// Exact (reference) scores of the current keys of one head: rows widened to double by the
// SIMD kernels (exact), then the reference's loop (exact_cosine.h).
class ExactScorer {
 public:
  ExactScorer(const KernelTable& kernels, const RowBlock& keys, int32_t dim)
      : kernels_(&kernels), keys_(keys), dim_(dim) {}

  double operator()(int64_t a, int64_t b) const;

  // out[k] = (*this)(a, bs[k]) for every k, several pairs at once.
  void Scores(int64_t a, std::span<const int64_t> bs, double* out) const;

 private:
  const KernelTable* kernels_;
  RowBlock keys_;
  int32_t dim_;
};

// Replaces a float score by the exact one.
void MakeExact(Edge* edge, const ExactScorer& scorer);

// Steps 3-4 for the chunk that `matcher` last matched (first row `first`): edges[i] for
// every source i, with `matches` from that call. `floor` is -infinity when there is none.
// False when some source's scores are not finite (its keys changed after they were checked
// for NaN and Inf): that source gets no edge (destination -1, not a candidate), every index
// stays inside the chunk, and the caller must fail the job.
bool ResolveChunkEdges(const RowMatch* matches, ChunkMatcher* matcher, int64_t first, double floor,
                       double bound, const ExactScorer& scorer, Edge* edges);

// Step 6: sets `kept` on the r best candidates of `edges` (the slots of one head). `order`
// is scratch.
void KeepBest(std::span<Edge> edges, int64_t r, double bound, const ExactScorer& scorer,
              std::vector<int32_t>* order);

// Sorts `slots` (indexes into `edges`, the kept sources of one destination) into the order
// the reference engine sums them: score descending, then source ascending.
void OrderSources(Edge* edges, std::span<int32_t> slots, double bound, const ExactScorer& scorer);

}  // namespace centroidkv::cpu
