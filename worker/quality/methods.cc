// The compressors of the quality comparison.
#include "worker/quality/methods.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/eviction.h"
#include "worker/quality/calibration.h"
#include "worker/kmeans.h"

namespace centroidkv::worker::quality {

const std::vector<std::string>& AllMethods() {
  static const std::vector<std::string>* const methods =
      new std::vector<std::string>{kCentroidKv, kCentroidKvOutliers, kStreamingLlm, kH2o,
                                   kSnapKv, kKMeans};
  return *methods;
}

bool UsesObservationWindow(const std::string& method) { return method == kSnapKv; }

PrefillTracking TrackingFor(const std::vector<std::string>& methods,
                            const MethodSettings& settings) {
  auto has = [&methods](const char* name) {
    return std::find(methods.begin(), methods.end(), name) != methods.end();
  };
  return {.whole = has(kH2o),
          .observation_window = has(kSnapKv) ? settings.centroidkv.compression.recent_tokens : 0};
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
  if (method == kCentroidKv || method == kCentroidKvOutliers) {
    if (client == nullptr) return absl::FailedPreconditionError("centroidkv needs a server");
    const bool outliers = method == kCentroidKvOutliers;
    return CacheCompressor([settings, budget, client, outliers, tally](KvCache* cache) {
      const int64_t n = cache->head(0, 0).size();
      std::vector<std::vector<int32_t>> passthrough;
      if (outliers && !settings.outlier_ranking.empty()) {
        const int32_t fit =
            settings.outliers_share_budget
                ? MaxSharedOutlierHeads(cache->num_layers(), cache->num_kv_heads(), n, budget,
                                        settings.centroidkv.compression.sink_tokens,
                                        settings.centroidkv.compression.recent_tokens)
                : static_cast<int32_t>(settings.outlier_ranking.size());
        passthrough = PickRankedHeads(settings.outlier_ranking, fit, cache->num_layers());
      } else if (outliers) {
        passthrough = settings.outlier_heads;
      }
      const CompressCacheOptions options =
          CentroidKvOptions(settings, budget, passthrough, settings.outliers_share_budget,
                            cache->num_layers(), cache->num_kv_heads(), n);
      absl::StatusOr<CompressCacheStats> stats = CompressCache(*client, options, cache);
      if (!stats.ok()) return stats.status();
      if (tally != nullptr) tally->Add(*stats);
      return absl::OkStatus();
    });
  }
  if (method == kStreamingLlm) {
    return CacheCompressor([budget, sinks](KvCache* cache) {
      EvictStreamingLlm(cache, budget, sinks);
      return absl::OkStatus();
    });
  }
  if (method == kH2o) {
    return CacheCompressor([budget, sinks, recent](KvCache* cache) {
      return EvictHeavyHitters(cache, budget, sinks, recent);
    });
  }
  if (method == kSnapKv) {
    const int32_t kernel = settings.snapkv_kernel;
    return CacheCompressor([budget, sinks, recent, kernel](KvCache* cache) {
      return EvictSnapKv(cache, budget, sinks, recent, kernel);
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
