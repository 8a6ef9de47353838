#include "kernels/cpu/edge_decisions.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace centroidkv::cpu {
namespace {

// The reference's top-r order: score descending, then source ascending. A NaN score (an
// exact rescore of keys that a client changed during the job) sorts last, so the order stays
// a strict weak one and the sorts stay inside their ranges.
bool Precedes(const Edge& x, const Edge& y) {
  const bool x_nan = std::isnan(x.score), y_nan = std::isnan(y.score);
  if (x_nan || y_nan) return x_nan != y_nan ? y_nan : x.source < y.source;
  if (x.score != y.score) return x.score > y.score;
  return x.source < y.source;
}

// Per-thread buffers of the scorer: widened rows and the scores of one batch.
struct ScorerBuffers {
  std::vector<double> rows;
  std::vector<const double*> row_pointers;
  std::vector<double> scores;
  std::vector<int64_t> candidates;
};

ScorerBuffers& Buffers() {
  thread_local ScorerBuffers buffers;
  return buffers;
}

// The exact best destination of source `i` among those whose float score is within
// 2 * bound of its float best (the lowest destination on exact ties): the matcher's
// near-tie list when it kept one, else those a rescan of the row in float finds. False when
// there is none (the scores are NaN: the keys changed after they were checked).
bool ResolveNearTie(int32_t i, ChunkMatcher* matcher, int64_t first, double bound,
                    const ExactScorer& scorer, Edge* edge) {
  std::vector<int64_t>& candidates = Buffers().candidates;
  candidates.clear();
  const NearTies* ties = matcher->near_ties(i);
  if (ties != nullptr && ties->count >= 1 && ties->count <= NearTies::kMax) {
    for (int32_t t = 0; t < ties->count; ++t) {
      candidates.push_back(first + 2 * ties->destinations[t] + 1);
    }
  } else {
    const std::span<const float> scores = matcher->Rescore(i);
    const double top = *std::max_element(scores.begin(), scores.end());
    for (int32_t k = 0; k < static_cast<int32_t>(scores.size()); ++k) {
      if (static_cast<double>(scores[k]) >= top - 2.0 * bound) candidates.push_back(first + 2 * k + 1);
    }
  }
  if (candidates.empty()) return false;
  std::vector<double>& exact = Buffers().scores;
  exact.resize(candidates.size());
  scorer.Scores(edge->source, candidates, exact.data());
  size_t best = 0;
  for (size_t c = 1; c < candidates.size(); ++c) {
    if (exact[c] > exact[best]) best = c;  // candidates increase: ties keep the lowest
  }
  edge->destination = static_cast<int32_t>(candidates[best]);
  edge->score = exact[best];
  edge->exact = true;
  return true;
}

}  // namespace

double ExactScorer::operator()(int64_t a, int64_t b) const {
  double score = 0.0;
  Scores(a, {&b, 1}, &score);
  return score;
}

void ExactScorer::Scores(int64_t a, std::span<const int64_t> bs, double* out) const {
  ScorerBuffers& buffers = Buffers();
  const size_t dim = static_cast<size_t>(dim_);
  // Candidates are scored a few at a time so the widened rows stay in L1.
  constexpr size_t kBatch = 8;
  if (buffers.rows.size() < (kBatch + 1) * dim) buffers.rows.resize((kBatch + 1) * dim);
  buffers.row_pointers.resize(kBatch);
  double* x = buffers.rows.data();
  kernels_->convert_row_f64(&keys_, a, dim_, x);
  for (size_t begin = 0; begin < bs.size(); begin += kBatch) {
    const size_t count = std::min(kBatch, bs.size() - begin);
    for (size_t k = 0; k < count; ++k) {
      double* y = x + (k + 1) * dim;
      kernels_->convert_row_f64(&keys_, bs[begin + k], dim_, y);
      buffers.row_pointers[k] = y;
    }
    CosinesOfWidened(x, buffers.row_pointers.data(), static_cast<int32_t>(count), dim_,
                     out + begin);
  }
}

void MakeExact(Edge* edge, const ExactScorer& scorer) {
  if (edge->exact) return;
  edge->score = scorer(edge->source, edge->destination);
  edge->exact = true;
}

bool ResolveChunkEdges(const RowMatch* matches, ChunkMatcher* matcher, int64_t first, double floor,
                       double bound, const ExactScorer& scorer, Edge* edges) {
  const int32_t destinations = matcher->destinations();
  bool usable = true;
  for (int32_t i = 0; i < matcher->sources(); ++i) {
    Edge& edge = edges[i];
    edge = Edge{};
    edge.source = static_cast<int32_t>(first + 2 * i);
    const RowMatch& match = matches[i];
    bool resolved = false;
    if (destinations >= 2 &&
        static_cast<double>(match.second) >= static_cast<double>(match.first) - 2.0 * bound) {
      resolved = ResolveNearTie(i, matcher, first, bound, scorer, &edge);
    } else if (match.best >= 0 && match.best < destinations) {
      edge.destination = static_cast<int32_t>(first + 2 * int64_t{match.best} + 1);
      edge.score = match.first;
      resolved = true;
    }
    // A NaN score (and with it a best outside the chunk) comes only from keys that stopped
    // being finite after their check: a client writing its shared-memory input during the
    // job. Such a source gets no edge, and the caller fails the job.
    if (!resolved || !std::isfinite(edge.score)) {
      edge = Edge{};
      edge.source = static_cast<int32_t>(first + 2 * i);
      usable = false;
      continue;
    }
    if (std::isinf(floor)) {
      edge.candidate = true;
    } else if (!edge.exact && edge.score - bound >= floor) {
      edge.candidate = true;
    } else if (!edge.exact && edge.score + bound < floor) {
      edge.candidate = false;
    } else {
      MakeExact(&edge, scorer);
      edge.candidate = edge.score >= floor;
    }
  }
  return usable;
}

void KeepBest(std::span<Edge> edges, int64_t r, double bound, const ExactScorer& scorer,
              std::vector<int32_t>* order) {
  order->clear();
  for (size_t slot = 0; slot < edges.size(); ++slot) {
    if (edges[slot].candidate) order->push_back(static_cast<int32_t>(slot));
  }
  if (r <= 0) return;
  if (r >= static_cast<int64_t>(order->size())) {
    for (int32_t slot : *order) edges[slot].kept = true;
    return;
  }
  auto higher = [&](int32_t x, int32_t y) { return edges[x].score > edges[y].score; };
  std::nth_element(order->begin(), order->begin() + (r - 1), order->end(), higher);
  const double tau = edges[(*order)[r - 1]].score;
  // Surely kept | undecided | surely not.
  auto undecided = std::partition(order->begin(), order->end(),
                                  [&](int32_t s) { return edges[s].score > tau + 2.0 * bound; });
  const auto kept_surely = undecided - order->begin();
  auto rest = std::partition(undecided, order->end(),
                             [&](int32_t s) { return edges[s].score >= tau - 2.0 * bound; });
  for (auto it = order->begin(); it != undecided; ++it) edges[*it].kept = true;
  for (auto it = undecided; it != rest; ++it) MakeExact(&edges[*it], scorer);
  const auto needed = static_cast<std::ptrdiff_t>(r - kept_surely);
  std::partial_sort(undecided, undecided + needed, rest,
                    [&](int32_t x, int32_t y) { return Precedes(edges[x], edges[y]); });
  for (auto it = undecided; it != undecided + needed; ++it) edges[*it].kept = true;
}

namespace {

// Sorts by `less`, a strict total order (so any sort gives the same order). A destination
// has a few kept sources, mostly one to three: insertion sort, without std::sort's set-up.
template <typename Less>
void SortSmall(std::span<int32_t> slots, Less less) {
  if (slots.size() > 16) {
    std::sort(slots.begin(), slots.end(), less);
    return;
  }
  for (size_t i = 1; i < slots.size(); ++i) {
    const int32_t slot = slots[i];
    size_t k = i;
    for (; k > 0 && less(slot, slots[k - 1]); --k) slots[k] = slots[k - 1];
    slots[k] = slot;
  }
}

}  // namespace

void OrderSources(Edge* edges, std::span<int32_t> slots, double bound, const ExactScorer& scorer) {
  if (slots.size() < 2) return;
  auto precedes = [&](int32_t x, int32_t y) { return Precedes(edges[x], edges[y]); };
  SortSmall(slots, precedes);
  bool ambiguous = false;
  for (size_t k = 0; k + 1 < slots.size() && !ambiguous; ++k) {
    const Edge& x = edges[slots[k]];
    const Edge& y = edges[slots[k + 1]];
    ambiguous = !(x.exact && y.exact) && x.score - y.score <= 2.0 * bound;
  }
  if (!ambiguous) return;
  for (int32_t slot : slots) MakeExact(&edges[slot], scorer);
  SortSmall(slots, precedes);
}

}  // namespace centroidkv::cpu
