// The parameters of one layer job (SPEC.md section 2, plus the serving-engine options done
// above the backends): what a client asks, the wire carries and the engine runs.
// Header-only; a value type.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "centroidkv/types/kinds.h"

namespace centroidkv {

// Fitted jobs (LayerView::queries set; docs/scored-jobs.md): per KV head, real-valued
// log-weights for the result rows and refitted values for the merged rows, so that
// attention on the reference queries matches the full cache's. Done above the backends.
struct FitOptions {
  static constexpr double kDefaultLogWeightBound = 3.0;
  static constexpr int32_t kDefaultBlockTokens = 32;

  // Each row's log-weight stays within ln(count) +- this (> 0).
  double log_weight_bound = kDefaultLogWeightBound;
  // The fit runs over blocks of this many input positions (>= 1): each block's rows match
  // the attention mass of the entries they stand for. Bounds the solves' size.
  int32_t block_tokens = kDefaultBlockTokens;
  // The merged rows' values refitted as well (ridge least squares); false: log-weights only.
  bool fit_values = true;
  // Scale of q . k in the logits; 0: 1 / sqrt(key_dim).
  double query_scale = 0.0;
};

// SPEC.md section 2 parameters. Field names follow the SPEC and the wire API.
struct CompressOptions {
  static constexpr double kDefaultTargetRatio = 0.25;
  static constexpr int32_t kDefaultChunkSize = 256;
  static constexpr int32_t kDefaultSinkTokens = 16;
  static constexpr int32_t kDefaultRecentTokens = 64;
  static constexpr int32_t kDefaultMaxPasses = 8;

  // At most one of the two targets is set; with neither, target_ratio = 0.25.
  std::optional<double> target_ratio{};    // rho in (0, 1]: t = ceil(rho * n)
  std::optional<int64_t> target_tokens{};  // t >= 1 (clamped to n)
  int32_t chunk_size = kDefaultChunkSize;           // C >= 2
  int32_t sink_tokens = kDefaultSinkTokens;         // S >= 0, never merged
  int32_t recent_tokens = kDefaultRecentTokens;     // W >= 0, never merged
  std::optional<double> min_similarity{};           // tau in [-1, 1]; unset = off
  double tighten_per_pass = 0.0;                    // delta >= 0
  int32_t max_passes = kDefaultMaxPasses;           // P >= 1
  bool uniform_heads = true;
  std::vector<int32_t> passthrough_heads{};         // heads returned unchanged
  bool compute_assignment = true;                   // fill CompressResult::assignment
  // The element type of the result's rows: float32, or fp16 / bf16 (each element the
  // float32 result rounded once, to nearest even): half the bytes to write and to send when
  // the caller wants half precision anyway (the service's output_dtype).
  DType result_dtype = DType::kFloat32;
  // fp8 results (result_dtype kFp8E4M3 / kFp8E5M2; done above the backends): the scales the
  // rows are stored with, a row element standing for fp8 x scale (vLLM's k_scale /
  // v_scale). One entry (per layer) or one per head: static scales, each finite and > 0,
  // values beyond scale x the format's maximum saturating. Empty (the default): dynamic, each
  // head's scale is its rows' largest magnitude / the format's maximum (1 for an all-zero
  // head). CompressResult::key_scales / value_scales return the scales used, per head.
  std::vector<float> result_key_scales{};
  std::vector<float> result_value_scales{};

  // Above the backends (ClusterEngine::Compress), identical for every backend:
  // Keep merging past the similarity floor and max_passes until every compressed head has
  // exactly t entries, where sink and recent entries allow it: a second stage on the
  // result, floor off and each head on its own (merging twice equals merging once).
  bool exact_target = false;
  // Every head padded at its end with count-0 rows (zero keys and values) to the longest
  // head's length, or to pad_to rows when pad_to > 0 (FailedPrecondition if a head is longer).
  bool pad_heads = false;
  int32_t pad_to = 0;
  // kTokenMajor: rows [L, H, d] and counts [L, H], every head padded to L as with pad_heads.
  TensorLayout output_layout = TensorLayout::kHeadMajor;

  // Scored and budgeted jobs (docs/scored-jobs.md; above the backends):
  static constexpr double kDefaultCentroidShare = 0.15;
  static constexpr int32_t kDefaultMaxClusterSize = 0;
  // [H] the most entries each head keeps (>= 1; a passthrough head's at least its length),
  // sinks, recent and exact entries and centroids all counted; empty: t for every head.
  // Every head then reaches its budget on its own (uniform_heads has no effect).
  std::vector<int32_t> head_budgets{};
  // With scores (LayerView::scores): the share of each head's budget, after its sink and
  // recent entries, given to centroids of the unkept tail; the rest goes to the top-scored
  // entries, kept exact. 0: score top-k eviction.
  double centroid_share = kDefaultCentroidShare;
  // With scores: a head whose tail centroids would each stand for more than this many
  // entries on average keeps its whole budget exact instead (0: no limit).
  int32_t max_cluster_size = kDefaultMaxClusterSize;
  // With queries (LayerView::queries).
  FitOptions fit{};
};

}  // namespace centroidkv
