#include "kernels/cpu/edge_decisions.h"

#include <algorithm>
#include <cmath>

namespace centroidkv::cpu {
namespace {

// The reference's top-r order: score descending, then source ascending.
bool Precedes(const Edge& x, const Edge& y) {
  if (x.score != y.score) return x.score > y.score;
  return x.source < y.source;
}

// The exact best of the destinations offered (in increasing order; ties keep the lowest),
// written to `edge` by Finish().
class ExactBest {
 public:
  ExactBest(int64_t first, const ExactScorer& scorer, Edge* edge)
      : first_(first), scorer_(scorer), edge_(edge) {}

  void Offer(int32_t k) {
    const double score = scorer_(edge_->source, first_ + 2 * k + 1);
    if (best_ < 0 || score > best_score_) {
      best_ = k;
      best_score_ = score;
    }
  }

  void Finish() {
    edge_->destination = static_cast<int32_t>(first_ + 2 * best_ + 1);
    edge_->score = best_score_;
    edge_->exact = true;
  }

 private:
  int64_t first_;
  const ExactScorer& scorer_;
  Edge* edge_;
  int32_t best_ = -1;
  double best_score_ = 0.0;
};

// The exact best destination of source `i` among those whose float score is within
// 2 * bound of its float best: the matcher's near-tie list when it kept one, else a rescan.
void ResolveNearTie(int32_t i, ChunkMatcher* matcher, int64_t first, double bound,
                    const ExactScorer& scorer, Edge* edge) {
  ExactBest best(first, scorer, edge);
  const NearTies* ties = matcher->near_ties(i);
  if (ties != nullptr && ties->count >= 1 && ties->count <= NearTies::kMax) {
    for (int32_t t = 0; t < ties->count; ++t) best.Offer(ties->destinations[t]);
  } else {
    const std::span<const float> scores = matcher->Rescore(i);
    const double top = *std::max_element(scores.begin(), scores.end());
    for (int32_t k = 0; k < static_cast<int32_t>(scores.size()); ++k) {
      if (static_cast<double>(scores[k]) >= top - 2.0 * bound) best.Offer(k);
    }
  }
  best.Finish();
}

}  // namespace

void MakeExact(Edge* edge, const ExactScorer& scorer) {
  if (edge->exact) return;
  edge->score = scorer(edge->source, edge->destination);
  edge->exact = true;
}

void ResolveChunkEdges(const RowMatch* matches, ChunkMatcher* matcher, int64_t first, double floor,
                       double bound, const ExactScorer& scorer, Edge* edges) {
  const int32_t destinations = matcher->destinations();
  for (int32_t i = 0; i < matcher->sources(); ++i) {
    Edge& edge = edges[i];
    edge = Edge{};
    edge.source = static_cast<int32_t>(first + 2 * i);
    const RowMatch& match = matches[i];
    if (destinations >= 2 &&
        static_cast<double>(match.second) >= static_cast<double>(match.first) - 2.0 * bound) {
      ResolveNearTie(i, matcher, first, bound, scorer, &edge);
    } else {
      edge.destination = static_cast<int32_t>(first + 2 * match.best + 1);
      edge.score = match.first;
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

void OrderSources(Edge* edges, std::span<int32_t> slots, double bound, const ExactScorer& scorer) {
  if (slots.size() < 2) return;
  auto precedes = [&](int32_t x, int32_t y) { return Precedes(edges[x], edges[y]); };
  std::sort(slots.begin(), slots.end(), precedes);
  bool ambiguous = false;
  for (size_t k = 0; k + 1 < slots.size() && !ambiguous; ++k) {
    const Edge& x = edges[slots[k]];
    const Edge& y = edges[slots[k + 1]];
    ambiguous = !(x.exact && y.exact) && x.score - y.score <= 2.0 * bound;
  }
  if (!ambiguous) return;
  for (int32_t slot : slots) MakeExact(&edges[slot], scorer);
  std::sort(slots.begin(), slots.end(), precedes);
}

}  // namespace centroidkv::cpu
