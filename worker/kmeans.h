// The k-means baseline of the quality comparison: per head, the entries between the sinks
// and the recent window are clustered on their keys (Euclidean, count-weighted Lloyd
// iterations from a seeded k-means++ start) into as many clusters as the budget leaves,
// and each cluster becomes one entry: the count-weighted mean key and value, with the sum
// of the counts, so attention's ln(count) applies exactly as for CentroidKV's centroids.
// Sinks and recent entries are kept unchanged, as CentroidKV protects them.
//
// Thread-safety: none; each call changes one cache.
#pragma once

#include <cstdint>

#include "worker/kv_cache.h"

namespace centroidkv::worker {

struct KMeansOptions {
  int32_t sinks = 4;
  int32_t recent = 32;
  int32_t iterations = 25;  // Lloyd iterations at most (stops when nothing moves)
  uint64_t seed = 1;        // k-means++ seeding; head (l, h) uses seed + l * H + h
};

// Compresses every head to ceil(ratio * n) entries (BudgetEntries).
void KMeansCompress(KvCache* cache, double ratio, const KMeansOptions& options);

}  // namespace centroidkv::worker
