// Baselines that shrink a KvCache in-process to a budget of entries per head, for the
// quality comparison (SPEC section 4). Each keeps a subset of the entries unchanged:
//   - StreamingLLM: the first `sinks` entries (attention sinks) and the most recent ones;
//   - H2O-style: sinks, the `recent` newest entries, and the entries with the most
//     attention accumulated during prefill (KvCache::TrackAttention) in the rest;
//   - SnapKV: sinks, the observation window (the `window` newest entries, the end of the
//     context) and the entries the window's queries attended to most (their attention
//     summed over the window and the KV head's query heads, average-pooled over
//     `kernel` neighbouring positions as kvpress's SnapKVPress does) in the rest. The
//     cache's statistic must cover the window's queries only (PrefillTracked).
// A head that already fits the budget is left alone. Positions are unchanged, so decoding
// continues at the true length, as after CentroidKV.
//
// What becomes of the entries an eviction drops (EvictedEntries): gone, as the methods were
// published, or merged ("evict, then merge", as D2O does): each dropped entry joins the kept
// entry between the protected windows whose key is the most cosine-similar to its own (the
// lowest index on ties), as a count-weighted mean of keys and of values with the counts
// summed, so that attention (which adds ln(count)) still gives it its share; where nothing
// is kept between the windows (StreamingLLM), it is dropped. Sinks and recent entries come
// back unchanged either way, as CentroidKV's protected entries do.
//
// Thread-safety: none; each call changes one cache.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/kv_cache.h"

namespace centroidkv::worker {

// Entries a head of n keeps at a budget ratio rho: ceil(rho * n) as the engine computes
// it (SPEC section 2), at least 1 and at most n.
int64_t BudgetEntries(int64_t n, double ratio);

// How a budget of `budget` entries splits into protected sinks, protected recent entries
// and the rest (`middle`), when the protected windows do not fit the budget whole: sinks
// first, then recent.
struct BudgetSplit {
  int64_t sinks = 0;
  int64_t recent = 0;
  int64_t middle = 0;
};
BudgetSplit SplitBudget(int64_t budget, int64_t sinks, int64_t recent);

// Keeps the entries of `head` whose indices are in `keep` (ascending).
void KeepEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& keep);

// Replaces the entries of `head` by `groups` entries: entry g is the count-weighted mean key
// and value of the entries i with group_of[i] == g (summed in double, in index order), with
// their counts and, where tracked, their attention summed; entries of group -1 are dropped.
// Every group has a member; a group whose counts sum to 0 keeps its first member as it is.
// (CentroidKV's merge, as the k-means baseline and evict-then-merge use it.)
void MergeEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& group_of,
                  int64_t groups);

struct EvictedEntries {
  bool merged = false;  // false: dropped
  // Merged only where the best kept entry's cosine is at least this (a similarity floor, as
  // D2O's threshold); dropped below it. -1: every evicted entry is merged.
  double min_similarity = -1.0;
};

// The same, with every entry not in `keep` merged into the most similar kept entry of
// [first, end) (see above; the attention statistics add up too); dropped when none is kept
// there or the best similarity is below `min_similarity`.
void KeepAndMergeEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& keep,
                         int64_t first, int64_t end, double min_similarity = -1.0);

// StreamingLLM: sinks plus the most recent entries, `ratio` of each head's entries.
void EvictStreamingLlm(KvCache* cache, double ratio, int32_t sinks,
                       EvictedEntries evicted = {});

// The same, online: every head longer than `budget_entries` keeps sinks plus its newest.
void EvictStreamingLlmToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                               EvictedEntries evicted = {});

// H2O-style heavy hitters: sinks, `recent` newest, and the highest accumulated attention
// among the others. FailedPrecondition when the cache did not track attention.
absl::Status EvictHeavyHitters(KvCache* cache, double ratio, int32_t sinks, int32_t recent,
                               EvictedEntries evicted = {});

// The same, online: every head longer than `budget_entries` drops its least attended
// entries outside the protected windows (attention keeps accumulating while decoding).
absl::Status EvictHeavyHittersToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                       int32_t recent,
                                       EvictedEntries evicted = {});

// SnapKV at `ratio` of each head's entries. FailedPrecondition when the cache did not track
// attention; InvalidArgument for a kernel below 1.
absl::Status EvictSnapKv(KvCache* cache, double ratio, int32_t sinks, int32_t window,
                         int32_t kernel, EvictedEntries evicted = {});

// SnapKV's importance of each entry of `head`: its observation-window attention, average-
// pooled over `kernel` neighbouring positions (what EvictSnapKv ranks by; the scores of the
// window-scored CentroidKV jobs). Empty when the cache did not track attention.
std::vector<double> SnapKvScores(const HeadCache& head, int32_t kernel);

// The same to `budget_entries` entries per head (heads that fit are left alone).
absl::Status EvictSnapKvToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                 int32_t window, int32_t kernel,
                                 EvictedEntries evicted = {});

}  // namespace centroidkv::worker
