// The compressors of the quality comparison.
#include "worker/quality/methods.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "worker/eviction.h"
#include "worker/head_budgets.h"
#include "worker/quality/calibration.h"
#include "worker/kmeans.h"

namespace centroidkv::worker::quality {

const std::vector<std::string>& AllMethods() {
  static const std::vector<std::string>* const methods =
      new std::vector<std::string>{kCentroidKv, kCentroidKvOutliers, kStreamingLlm, kH2o,
                                   kSnapKv, kKMeans};
  return *methods;
}

std::string BaseMethod(const std::string& method) {
  return std::string(
      absl::StripSuffix(absl::StripSuffix(method, kOutliersSuffix), kMergeSuffix));
}

bool MergesEvicted(const std::string& method) {
  return absl::EndsWith(absl::StripSuffix(method, kOutliersSuffix), kMergeSuffix);
}

bool KeepsOutlierHeads(const std::string& method) {
  return absl::EndsWith(method, kOutliersSuffix);
}

bool IsWindowScored(const std::string& method) {
  return method == kCentroidKvSnapKv || absl::StartsWith(method, absl::StrCat(kCentroidKvSnapKv, "@"));
}

bool UsesObservationWindow(const std::string& method) {
  return BaseMethod(method) == kSnapKv || IsWindowScored(method);
}

PrefillTracking TrackingFor(const std::vector<std::string>& methods,
                            const MethodSettings& settings) {
  const bool whole = std::any_of(methods.begin(), methods.end(),
                                 [](const std::string& m) { return BaseMethod(m) == kH2o; });
  const bool window = std::any_of(methods.begin(), methods.end(), UsesObservationWindow);
  return {.whole = whole,
          .observation_window = window ? settings.centroidkv.compression.recent_tokens : 0};
}

void TargetTally::Add(const CompressCacheStats& stats) {
  layers += static_cast<int64_t>(stats.layers.size());
  layers_missed += stats.layers_target_missed;
  padding_rows += stats.rows_after - stats.entries_after;
}

int64_t CountHeads(const std::vector<std::vector<int32_t>>& per_layer) {
  int64_t count = 0;
  for (const std::vector<int32_t>& heads : per_layer) count += static_cast<int64_t>(heads.size());
  return count;
}

namespace {

// t' of the shared budget: what each of the other heads keeps with `kept` outlier heads.
int64_t SharedTarget(int64_t heads, int64_t kept, int64_t n, double budget) {
  const int64_t left = heads * BudgetEntries(n, budget) - kept * n;
  return std::max<int64_t>(1, left / std::max<int64_t>(1, heads - kept));
}

}  // namespace

int32_t MaxSharedOutlierHeads(int32_t num_layers, int32_t num_heads, int64_t n, double budget,
                              int32_t sinks, int32_t recent) {
  const int64_t heads = int64_t{num_layers} * num_heads;
  int32_t count = 0;
  while (count + 1 < heads &&
         SharedTarget(heads, count + 1, n, budget) >= int64_t{sinks} + recent) {
    ++count;
  }
  return count;
}

namespace {

// The outlier heads one compression of `cache` at `budget` keeps whole: the longest prefix
// of the ranking that the budget affords at this length (all of it when they do not share
// the budget), or the fixed heads.
std::vector<std::vector<int32_t>> OutlierHeadsFor(const MethodSettings& settings,
                                                  const KvCache& cache, double budget) {
  if (settings.outlier_ranking.empty()) return settings.outlier_heads;
  const int32_t fit =
      settings.outliers_share_budget
          ? MaxSharedOutlierHeads(cache.num_layers(), cache.num_kv_heads(),
                                  cache.head(0, 0).size(), budget,
                                  settings.centroidkv.compression.sink_tokens,
                                  settings.centroidkv.compression.recent_tokens)
          : static_cast<int32_t>(settings.outlier_ranking.size());
  return PickRankedHeads(settings.outlier_ranking, fit, cache.num_layers());
}

// An eviction baseline that shrinks every head longer than `entries` to that many.
using BudgetEviction = std::function<absl::Status(KvCache* cache, int64_t entries)>;

absl::StatusOr<BudgetEviction> EvictionToBudget(const std::string& base,
                                                const MethodSettings& settings,
                                                EvictedEntries evicted) {
  const int32_t sinks = settings.centroidkv.compression.sink_tokens;
  const int32_t recent = settings.centroidkv.compression.recent_tokens;
  if (base == kStreamingLlm) {
    return BudgetEviction([sinks, evicted](KvCache* cache, int64_t entries) {
      EvictStreamingLlmToBudget(cache, entries, sinks, evicted);
      return absl::OkStatus();
    });
  }
  if (base == kH2o) {
    return BudgetEviction([sinks, recent, evicted](KvCache* cache, int64_t entries) {
      return EvictHeavyHittersToBudget(cache, entries, sinks, recent, evicted);
    });
  }
  if (base == kSnapKv) {
    const int32_t kernel = settings.snapkv_kernel;
    return BudgetEviction([sinks, recent, kernel, evicted](KvCache* cache, int64_t entries) {
      return EvictSnapKvToBudget(cache, entries, sinks, recent, kernel, evicted);
    });
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown method \"", base, kOutliersSuffix, "\": \"+outliers\" goes with centroidkv, ",
      kStreamingLlm, ", ", kH2o, " or ", kSnapKv));
}

// Evicts every head of `cache` but `whole` with `evict`: those are set aside while it runs
// (an empty head fits every budget, so the eviction leaves it alone), then put back.
absl::Status EvictAllBut(KvCache* cache, const std::vector<std::vector<int32_t>>& whole,
                         int64_t entries, const BudgetEviction& evict) {
  std::vector<std::pair<std::pair<int32_t, int32_t>, HeadCache>> aside;
  for (int32_t layer = 0; layer < static_cast<int32_t>(whole.size()); ++layer) {
    for (int32_t head : whole[static_cast<size_t>(layer)]) {
      aside.emplace_back(std::make_pair(layer, head), std::move(cache->head(layer, head)));
      cache->head(layer, head) = HeadCache{};
    }
  }
  const absl::Status status = evict(cache, entries);
  for (auto& [at, head] : aside) cache->head(at.first, at.second) = std::move(head);
  return status;
}

// The centroid share a window-scored method names after its "@", or none (the service's).
absl::StatusOr<std::optional<double>> CentroidShareOf(const std::string& method) {
  const size_t at = method.find('@');
  if (at == std::string::npos) return std::optional<double>();
  double share = 0.0;
  if (!absl::SimpleAtod(method.substr(at + 1), &share) || !(share >= 0.0 && share <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("method \"", method, "\": the centroid share "
                                                   "after '@' must be a number in [0, 1]"));
  }
  return std::optional<double>(share);
}

// A scored job per layer: SnapKV's window scores, one budget over layers x heads (the total
// of `budget` of every head), the tail's centroids `share` of each head's room.
absl::Status CompressWindowScored(const MethodSettings& settings, double budget,
                                  std::optional<double> share, client::Client& client,
                                  KvCache* cache, TargetTally* tally) {
  if (!cache->tracks_attention()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kCentroidKvSnapKv, " needs the observation window's attention (PrefillTracked)"));
  }
  std::vector<std::vector<std::vector<double>>> scores(static_cast<size_t>(cache->num_layers()));
  int64_t total = 0;
  for (int32_t layer = 0; layer < cache->num_layers(); ++layer) {
    for (int32_t h = 0; h < cache->num_kv_heads(); ++h) {
      const HeadCache& head = cache->head(layer, h);
      scores[static_cast<size_t>(layer)].push_back(SnapKvScores(head, settings.snapkv_kernel));
      total += BudgetEntries(head.size(), budget);
    }
  }
  // Where an even share cannot hold the protected windows, they shrink as SnapKV's do
  // (SplitBudget: sinks first), so that the job keeps its budget.
  CompressCacheOptions options = settings.centroidkv;
  const int64_t heads = int64_t{cache->num_layers()} * cache->num_kv_heads();
  const BudgetSplit split = SplitBudget(total / std::max<int64_t>(1, heads),
                                        options.compression.sink_tokens,
                                        options.compression.recent_tokens);
  options.compression.sink_tokens = static_cast<int32_t>(split.sinks);
  options.compression.recent_tokens = static_cast<int32_t>(split.recent);
  absl::StatusOr<std::vector<std::vector<int32_t>>> budgets =
      GlobalHeadBudgets(scores, total, options.compression.sink_tokens,
                        options.compression.recent_tokens);
  if (!budgets.ok()) return budgets.status();
  options.compression.passthrough_heads.clear();
  options.passthrough_per_layer.clear();
  options.compression.target_tokens.reset();
  options.compression.target_ratio = budget;
  if (share.has_value()) options.compression.centroid_share = *share;
  options.head_budgets_per_layer = *std::move(budgets);
  for (const std::vector<std::vector<double>>& layer : scores) {
    std::vector<float> flat;
    for (const std::vector<double>& head : layer) flat.insert(flat.end(), head.begin(), head.end());
    options.scores_per_layer.push_back(std::move(flat));
  }
  absl::StatusOr<CompressCacheStats> stats = CompressCache(client, options, cache);
  if (!stats.ok()) return stats.status();
  if (tally != nullptr) tally->Add(*stats);
  return absl::OkStatus();
}

}  // namespace

CompressCacheOptions CentroidKvOptions(const MethodSettings& settings, double budget,
                                       const std::vector<std::vector<int32_t>>& passthrough,
                                       bool share_budget, int32_t num_layers, int32_t num_heads,
                                       int64_t n) {
  CompressCacheOptions options = settings.centroidkv;
  options.compression.passthrough_heads.clear();
  options.passthrough_per_layer = passthrough;
  options.passthrough_per_layer.resize(static_cast<size_t>(num_layers));
  const int64_t heads = int64_t{num_layers} * num_heads;
  const int64_t kept = CountHeads(options.passthrough_per_layer);
  options.compression.target_ratio.reset();
  options.compression.target_tokens.reset();
  if (kept == 0 || !share_budget) {
    options.compression.target_ratio = budget;
  } else {
    options.compression.target_tokens = SharedTarget(heads, kept, n, budget);
  }
  return options;
}

absl::StatusOr<CacheCompressor> MakeCompressor(const std::string& method, double budget,
                                               const MethodSettings& settings,
                                               client::Client* client, TargetTally* tally) {
  const int32_t sinks = settings.centroidkv.compression.sink_tokens;
  const int32_t recent = settings.centroidkv.compression.recent_tokens;
  const EvictedEntries evicted{.merged = MergesEvicted(method),
                               .min_similarity = settings.merge_min_similarity};
  if (MergesEvicted(method) && BaseMethod(method) != kH2o && BaseMethod(method) != kSnapKv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown method \"", method, "\": \"", kMergeSuffix, "\" goes with ", kH2o, " or ",
        kSnapKv, " (StreamingLLM keeps nothing to merge into)"));
  }
  if (method == kCentroidKv || method == kCentroidKvOutliers) {
    if (client == nullptr) return absl::FailedPreconditionError("centroidkv needs a server");
    const bool outliers = method == kCentroidKvOutliers;
    return CacheCompressor([settings, budget, client, outliers, tally](KvCache* cache) {
      const CompressCacheOptions options = CentroidKvOptions(
          settings, budget,
          outliers ? OutlierHeadsFor(settings, *cache, budget)
                   : std::vector<std::vector<int32_t>>{},
          settings.outliers_share_budget, cache->num_layers(), cache->num_kv_heads(),
          cache->head(0, 0).size());
      absl::StatusOr<CompressCacheStats> stats = CompressCache(*client, options, cache);
      if (!stats.ok()) return stats.status();
      if (tally != nullptr) tally->Add(*stats);
      return absl::OkStatus();
    });
  }
  if (IsWindowScored(method)) {
    if (client == nullptr) return absl::FailedPreconditionError(absl::StrCat(method, " needs a server"));
    absl::StatusOr<std::optional<double>> share = CentroidShareOf(method);
    if (!share.ok()) return share.status();
    return CacheCompressor([settings, budget, share = *share, client, tally](KvCache* cache) {
      return CompressWindowScored(settings, budget, share, *client, cache, tally);
    });
  }
  if (KeepsOutlierHeads(method)) {
    absl::StatusOr<BudgetEviction> evict =
        EvictionToBudget(BaseMethod(method), settings, evicted);
    if (!evict.ok()) return evict.status();
    return CacheCompressor([settings, budget, evict = *std::move(evict)](KvCache* cache) {
      const std::vector<std::vector<int32_t>> whole = OutlierHeadsFor(settings, *cache, budget);
      // The same per-head target as centroidkv+outliers: the whole heads' rows come out of
      // the others' share when they share the budget.
      const CompressCacheOptions shares =
          CentroidKvOptions(settings, budget, whole, settings.outliers_share_budget,
                            cache->num_layers(), cache->num_kv_heads(), cache->head(0, 0).size());
      const int64_t entries = shares.compression.target_tokens.value_or(
          BudgetEntries(cache->head(0, 0).size(), budget));
      return EvictAllBut(cache, whole, entries, evict);
    });
  }
  if (method == kStreamingLlm) {
    return CacheCompressor([budget, sinks](KvCache* cache) {
      EvictStreamingLlm(cache, budget, sinks);
      return absl::OkStatus();
    });
  }
  if (BaseMethod(method) == kH2o) {
    return CacheCompressor([budget, sinks, recent, evicted](KvCache* cache) {
      return EvictHeavyHitters(cache, budget, sinks, recent, evicted);
    });
  }
  if (BaseMethod(method) == kSnapKv) {
    const int32_t kernel = settings.snapkv_kernel;
    return CacheCompressor([budget, sinks, recent, kernel, evicted](KvCache* cache) {
      return EvictSnapKv(cache, budget, sinks, recent, kernel, evicted);
    });
  }
  if (method == kKMeans) {
    KMeansOptions options;
    options.sinks = sinks;
    options.recent = recent;
    options.iterations = settings.kmeans_iterations;
    options.seed = settings.kmeans_seed;
    return CacheCompressor([budget, options](KvCache* cache) {
      KMeansCompress(cache, budget, options);
      return absl::OkStatus();
    });
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown method \"", method, "\""));
}

}  // namespace centroidkv::worker::quality
