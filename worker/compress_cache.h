// The worker's compression step: every layer of a KvCache goes to a CentroidKV server on
// one stream (all layers pipelined: each is submitted without waiting for the others'
// results), and the centroids and counts that come back replace the cache's entries.
// The cache's position (the true token count) is unchanged, so decoding continues with
// RoPE at the original length; later tokens are appended with count 1.
//
// Equal lengths for a paged cache: compression.exact_target keeps merging until every
// compressed head holds exactly t entries; compression.pad_heads pads every head of a
// layer with count-0 rows to the layer's longest head, pad_to to a fixed length (the
// same for every layer). Padding rows are masked by attention and left out when the
// cache is sent again (kv_cache.h); heads of different lengths are sent ragged. What
// the service says about each layer (target reached, entries per head, why it stopped)
// comes back in CompressCacheStats.
//
// Thread-safety: one call per cache at a time; the Client may be shared (it is
// thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/kinds.h"
#include "worker/kv_cache.h"

namespace centroidkv::worker {

struct CompressCacheOptions {
  // SPEC section 2 parameters sent with every layer, with exact_target, pad_heads and
  // pad_to. Its passthrough_heads apply to every layer unless passthrough_per_layer names
  // the layer. output_layout is ignored: the cache is head-major.
  CompressOptions compression;
  // passthrough_per_layer[l]: the KV heads of layer l returned unchanged (the paper's
  // outlier heads). Layers past the end use compression.passthrough_heads.
  std::vector<std::vector<int32_t>> passthrough_per_layer;
  BackendKind backend = BackendKind::kAuto;
  // The dtype the centroids come back in, widened into the float cache as the attention of
  // a serving engine would read them: float32 (exact), fp16 / bf16, or fp8 with the scales
  // of compression.result_key_scales / result_value_scales (none: per head, dynamic).
  DType output_dtype = DType::kFloat32;
  // Scored jobs (docs/scored-jobs.md): when not empty, scores_per_layer[l] holds layer l's
  // importance scores laid out as its exported counts (head-major, the real entries of each
  // head), and head_budgets_per_layer[l] (may be empty) the most entries each head keeps.
  std::vector<std::vector<float>> scores_per_layer;
  std::vector<std::vector<int32_t>> head_budgets_per_layer;
};

// The service's account of one layer (JobResult's target fields).
struct LayerAccount {
  int64_t target_length = 0;              // t
  bool target_reached = false;            // every compressed head has at most t entries
  std::vector<uint32_t> head_entries;     // [H] real entries per head
  std::vector<StopReason> stop_reasons;   // [H]
  int32_t padded_length = 0;              // rows per head when padded, else 0
};

struct CompressCacheStats {
  int64_t entries_before = 0;  // real entries (count > 0) over all layers and heads
  int64_t entries_after = 0;
  int64_t rows_after = 0;      // rows stored after, count-0 padding included
  int32_t max_passes_run = 0;  // the largest passes_run of any layer
  std::string backend;         // as the server reports it
  std::vector<LayerAccount> layers;  // [num_layers]
  int32_t layers_target_missed = 0;  // layers whose target_reached is false

  bool target_reached() const { return layers_target_missed == 0; }
};

// The passthrough heads `options` gives layer `layer`.
const std::vector<int32_t>& PassthroughHeadsOf(const CompressCacheOptions& options, int32_t layer);

// Compresses every layer of `cache` through `client`. The cache changes only when every
// layer succeeded. Errors: the stream's or a job's status (FailedPrecondition naming
// pad_to when a head is longer than pad_to).
absl::StatusOr<CompressCacheStats> CompressCache(client::Client& client,
                                                 const CompressCacheOptions& options,
                                                 KvCache* cache);

}  // namespace centroidkv::worker
