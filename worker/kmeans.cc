// Count-weighted k-means on keys, one head at a time.
#include "worker/kmeans.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "worker/eviction.h"
#include "worker/sampler.h"

namespace centroidkv::worker {
namespace {

// Points to cluster: rows of `keys` (d floats each) with weights.
struct Points {
  const float* keys = nullptr;
  const uint32_t* counts = nullptr;
  int64_t size = 0;
  int32_t dim = 0;

  const float* row(int64_t i) const { return keys + i * dim; }
};

double SquaredDistance(const float* a, const double* b, int32_t dim) {
  double sum = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    const double diff = static_cast<double>(a[j]) - b[j];
    sum += diff * diff;
  }
  return sum;
}

// Index drawn with probability proportional to weights (which must not all be 0).
int64_t Draw(const std::vector<double>& weights, Rng* rng) {
  double total = 0.0;
  for (double w : weights) total += w;
  double target = rng->Uniform() * total;
  for (size_t i = 0; i < weights.size(); ++i) {
    target -= weights[i];
    if (target < 0.0 && weights[i] > 0.0) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(std::max_element(weights.begin(), weights.end()) - weights.begin());
}

// k-means++: centers [k, dim], each a copy of a point.
std::vector<double> SeedCenters(const Points& points, int64_t k, Rng* rng) {
  const int32_t dim = points.dim;
  std::vector<double> centers;
  std::vector<double> weights(static_cast<size_t>(points.size));
  for (int64_t i = 0; i < points.size; ++i) weights[static_cast<size_t>(i)] = points.counts[i];
  std::vector<double> nearest(static_cast<size_t>(points.size),
                              std::numeric_limits<double>::infinity());
  for (int64_t c = 0; c < k; ++c) {
    const int64_t pick = Draw(weights, rng);
    centers.insert(centers.end(), points.row(pick), points.row(pick) + dim);
    const double* center = centers.data() + c * dim;
    for (int64_t i = 0; i < points.size; ++i) {
      const size_t s = static_cast<size_t>(i);
      nearest[s] = std::min(nearest[s], SquaredDistance(points.row(i), center, dim));
      weights[s] = points.counts[i] * nearest[s];
    }
    if (std::all_of(weights.begin(), weights.end(), [](double w) { return w == 0.0; })) {
      // Fewer distinct points than clusters: the remaining centers repeat points.
      for (int64_t i = 0; i < points.size; ++i) weights[static_cast<size_t>(i)] = 1.0;
    }
  }
  return centers;
}

// Nearest center of each point; returns whether any assignment changed.
bool Assign(const Points& points, const std::vector<double>& centers, int64_t k,
            std::vector<int64_t>* assignment, std::vector<double>* distance) {
  bool changed = false;
  for (int64_t i = 0; i < points.size; ++i) {
    int64_t best = 0;
    double best_distance = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < k; ++c) {
      const double d = SquaredDistance(points.row(i), centers.data() + c * points.dim, points.dim);
      if (d < best_distance) {
        best_distance = d;
        best = c;
      }
    }
    const size_t s = static_cast<size_t>(i);
    changed |= (*assignment)[s] != best;
    (*assignment)[s] = best;
    (*distance)[s] = best_distance;
  }
  return changed;
}

// Count-weighted means of the assigned keys; an empty cluster takes the point that is
// farthest (by weight times squared distance) from its center.
void UpdateCenters(const Points& points, int64_t k, std::vector<int64_t>* assignment,
                   std::vector<double>* distance, std::vector<double>* centers) {
  const int32_t dim = points.dim;
  std::vector<double> weight(static_cast<size_t>(k), 0.0);
  std::fill(centers->begin(), centers->end(), 0.0);
  for (int64_t i = 0; i < points.size; ++i) {
    const int64_t c = (*assignment)[static_cast<size_t>(i)];
    weight[static_cast<size_t>(c)] += points.counts[i];
    for (int32_t j = 0; j < dim; ++j)
      (*centers)[c * dim + j] += points.counts[i] * points.row(i)[j];
  }
  for (int64_t c = 0; c < k; ++c) {
    if (weight[static_cast<size_t>(c)] > 0.0) {
      for (int32_t j = 0; j < dim; ++j) (*centers)[c * dim + j] /= weight[static_cast<size_t>(c)];
      continue;
    }
    int64_t far = 0;
    for (int64_t i = 1; i < points.size; ++i) {
      if (points.counts[i] * (*distance)[static_cast<size_t>(i)] >
          points.counts[far] * (*distance)[static_cast<size_t>(far)]) {
        far = i;
      }
    }
    std::copy(points.row(far), points.row(far) + dim, centers->begin() + c * dim);
    (*assignment)[static_cast<size_t>(far)] = c;
    (*distance)[static_cast<size_t>(far)] = 0.0;
  }
}

// Replaces the entries [begin, begin + size) of `head` by the clusters of `assignment`,
// ordered by their first member (MergeEntries); the others stay as they are.
void MergeClusters(HeadCache* head, int32_t dim, int64_t begin, int64_t size, int64_t k,
                   const std::vector<int64_t>& assignment) {
  std::vector<int64_t> group_of_cluster(static_cast<size_t>(k), -1);
  std::vector<int64_t> group_of(static_cast<size_t>(head->size()));
  int64_t groups = 0;
  for (int64_t i = 0; i < head->size(); ++i) {
    if (i < begin || i >= begin + size) {
      group_of[static_cast<size_t>(i)] = groups++;
      continue;
    }
    int64_t& cluster_group =
        group_of_cluster[static_cast<size_t>(assignment[static_cast<size_t>(i - begin)])];
    if (cluster_group < 0) cluster_group = groups++;
    group_of[static_cast<size_t>(i)] = cluster_group;
  }
  MergeEntries(head, dim, group_of, groups);
}

void ClusterHead(HeadCache* head, int32_t dim, double ratio, const KMeansOptions& options,
                 uint64_t seed) {
  const int64_t n = head->size();
  const BudgetSplit split = SplitBudget(BudgetEntries(n, ratio), options.sinks, options.recent);
  const int64_t size = n - split.sinks - split.recent;
  const int64_t k = split.middle;
  if (k >= size) return;  // already within the budget
  std::vector<int64_t> assignment(static_cast<size_t>(size), -1);
  if (k > 0) {
    Points points{head->keys.data() + split.sinks * dim, head->counts.data() + split.sinks, size,
                  dim};
    Rng rng(seed);
    std::vector<double> centers = SeedCenters(points, k, &rng);
    std::vector<double> distance(static_cast<size_t>(size), 0.0);
    for (int32_t it = 0; it < options.iterations; ++it) {
      if (!Assign(points, centers, k, &assignment, &distance) && it > 0) break;
      UpdateCenters(points, k, &assignment, &distance, &centers);
    }
    Assign(points, centers, k, &assignment, &distance);
  }
  if (k == 0) {  // nothing left for clusters: drop the middle
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < n; ++i) {
      if (i < split.sinks || i >= n - split.recent) keep.push_back(i);
    }
    KeepEntries(head, dim, keep);
    return;
  }
  MergeClusters(head, dim, split.sinks, size, k, assignment);
  head->attention.clear();
}

}  // namespace

void KMeansCompress(KvCache* cache, double ratio, const KMeansOptions& options) {
  for (int32_t layer = 0; layer < cache->num_layers(); ++layer) {
    for (int32_t h = 0; h < cache->num_kv_heads(); ++h) {
      const uint64_t seed = options.seed + static_cast<uint64_t>(layer * cache->num_kv_heads() + h);
      ClusterHead(&cache->head(layer, h), cache->head_size(), ratio, options, seed);
    }
  }
}

}  // namespace centroidkv::worker
