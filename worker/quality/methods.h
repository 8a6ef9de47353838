// The compression methods the quality report compares at the same budget (SPEC section 4):
//   centroidkv           the service (through a running server), SPEC section 2
//   centroidkv+outliers  the same with calibrated passthrough ("outlier") heads
//   streamingllm         sinks + the most recent entries
//   h2o                  sinks + recent + the most attended during prefill
//   snapkv               sinks + the observation window (the recent entries, the end of the
//                        context) + the entries the window's queries attended to most
//   kmeans               sinks + recent + count-weighted k-means on keys in between
//   streamingllm+outliers, h2o+outliers, snapkv+outliers
//                        the control for centroidkv+outliers: the same outlier heads kept
//                        whole, the other heads evicted to the same shared budget, so a
//                        table shows what merging adds beyond keeping those heads
//   centroidkv+snapkv[@SHARE]
//                        a scored job (docs/scored-jobs.md): SnapKV's window scores sent
//                        to the service with one budget over all layers x heads (as KVzip
//                        allocates it, worker/head_budgets.h); each head keeps its sink,
//                        recent and top-scored entries exact and the service's centroids
//                        of the unkept tail, SHARE of its room (default: the service's
//                        centroid_share; @0: SnapKV's selection with the global budget);
//                        where an even share cannot hold the sink and recent windows, they
//                        shrink as SnapKV's do (sinks first)
//   h2o+merge, snapkv+merge (and with +outliers: snapkv+merge+outliers)
//                        evict, then merge (D2O-style): the same kept entries, with each
//                        dropped entry merged into its most similar kept one
//                        (worker/eviction.h), so a table shows whether merging what
//                        eviction drops keeps what eviction loses
//
// Budget accounting: every method keeps ceil(budget * n) entries per head. With outlier
// heads sharing the budget (the default), the other heads of the whole model shrink to
// keep the total at the budget: t' = floor((L * H * t - P * n) / (L * H - P)) for P
// passthrough heads, so the comparison stays at equal KV memory.
//
// Thread-safety: the compressors copy the settings and borrow the Client (thread-safe),
// which must outlive them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "worker/compress_cache.h"
#include "worker/evaluation.h"

namespace centroidkv::worker::quality {

inline constexpr char kCentroidKv[] = "centroidkv";
inline constexpr char kCentroidKvOutliers[] = "centroidkv+outliers";
inline constexpr char kStreamingLlm[] = "streamingllm";
inline constexpr char kH2o[] = "h2o";
inline constexpr char kKMeans[] = "kmeans";
inline constexpr char kSnapKv[] = "snapkv";
inline constexpr char kCentroidKvSnapKv[] = "centroidkv+snapkv";
inline constexpr char kOutliersSuffix[] = "+outliers";
inline constexpr char kMergeSuffix[] = "+merge";

// The method without its "+merge" and "+outliers": "snapkv" for "snapkv+merge+outliers",
// "centroidkv" for centroidkv+outliers; the name itself otherwise.
std::string BaseMethod(const std::string& method);

// True for "<eviction>+merge[+outliers]": what the eviction drops is merged, not dropped.
bool MergesEvicted(const std::string& method);

// True for "centroidkv+snapkv" and "centroidkv+snapkv@SHARE": a window-scored job.
bool IsWindowScored(const std::string& method);

// True for "<method>+outliers": the outlier heads stay whole (MethodSettings).
bool KeepsOutlierHeads(const std::string& method);

// Settings shared by every method.
struct MethodSettings {
  // CentroidKV's SPEC parameters (its target is set per budget); sinks and recent are
  // also the protected windows of the baselines.
  CompressCacheOptions centroidkv;
  // Outlier heads per layer, used by the "+outliers" methods.
  std::vector<std::vector<int32_t>> outlier_heads;
  // Or ranked (layer, KV head), most harmful first: when not empty, each compression of a
  // "+outliers" method keeps whole the longest prefix that its budget can share at its
  // cache's length (MaxSharedOutlierHeads), none where not even one fits; all of them
  // when they do not share the budget.
  std::vector<std::pair<int32_t, int32_t>> outlier_ranking;
  // When true, outlier heads count against the budget (the other heads shrink more).
  bool outliers_share_budget = true;
  // The "+merge" methods' similarity floor (EvictedEntries::min_similarity; -1: none).
  double merge_min_similarity = -1.0;
  int32_t kmeans_iterations = 25;
  // SnapKV's pooling kernel (kvpress's SnapKVPress default); its window is the recent one.
  int32_t snapkv_kernel = 5;
  uint64_t kmeans_seed = 1;
};

// What the service said about the targets of one method's compressions (CentroidKV
// only; zero for the in-process baselines): layer jobs, those whose target_reached was
// false, and the count-0 padding rows returned (pad_heads / pad_to).
struct TargetTally {
  int64_t layers = 0;
  int64_t layers_missed = 0;
  int64_t padding_rows = 0;
  void Add(const CompressCacheStats& stats);
};

// Every method name, in report order.
const std::vector<std::string>& AllMethods();

// Whether `method` compresses the prefill's window cache (PrefillTracking): SnapKV and the
// window-scored CentroidKV.
bool UsesObservationWindow(const std::string& method);

// The statistics a prefill must keep for `methods`: H2O's whole-prefill attention,
// SnapKV's observation window of the recent entries.
PrefillTracking TrackingFor(const std::vector<std::string>& methods,
                            const MethodSettings& settings);

// The number of passthrough heads in `per_layer`.
int64_t CountHeads(const std::vector<std::vector<int32_t>>& per_layer);

// The most outlier heads the budget can share: the largest P for which the other heads'
// target t' stays at or above sinks + recent (the engine never merges those entries, so
// a smaller t' could not be reached and the total would exceed the budget).
int32_t MaxSharedOutlierHeads(int32_t num_layers, int32_t num_heads, int64_t n, double budget,
                              int32_t sinks, int32_t recent);

// CentroidKV's options at `budget` with `passthrough` heads per layer for a cache of
// `num_layers` x `num_heads` heads holding `n` entries each (see the budget note above).
CompressCacheOptions CentroidKvOptions(const MethodSettings& settings, double budget,
                                       const std::vector<std::vector<int32_t>>& passthrough,
                                       bool share_budget, int32_t num_layers, int32_t num_heads,
                                       int64_t n);

// The compressor of `method` at `budget` (InvalidArgument for an unknown name).
// `client` may be null for the in-process baselines. CentroidKV's compressors add their
// account to `*tally` when it is not null (it must outlive the compressor).
absl::StatusOr<CacheCompressor> MakeCompressor(const std::string& method, double budget,
                                               const MethodSettings& settings,
                                               client::Client* client,
                                               TargetTally* tally = nullptr);

}  // namespace centroidkv::worker::quality
