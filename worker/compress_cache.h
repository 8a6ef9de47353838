// The worker's compression step: every layer of a KvCache goes to a CentroidKV server on
// one stream (all layers pipelined: each is submitted without waiting for the others'
// results), and the centroids and counts that come back replace the cache's entries.
// The cache's position (the true token count) is unchanged, so decoding continues with
// RoPE at the original length; later tokens are appended with count 1.
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
  // SPEC section 2 parameters sent with every layer. Its passthrough_heads apply to every
  // layer unless passthrough_per_layer names the layer.
  CompressOptions compression;
  // passthrough_per_layer[l]: the KV heads of layer l returned unchanged (the paper's
  // outlier heads). Layers past the end use compression.passthrough_heads.
  std::vector<std::vector<int32_t>> passthrough_per_layer;
  BackendKind backend = BackendKind::kAuto;
};

struct CompressCacheStats {
  int64_t entries_before = 0;  // over all layers and heads
  int64_t entries_after = 0;
  int32_t max_passes_run = 0;  // the largest passes_run of any layer
  std::string backend;         // as the server reports it
};

// The passthrough heads `options` gives layer `layer`.
const std::vector<int32_t>& PassthroughHeadsOf(const CompressCacheOptions& options, int32_t layer);

// Compresses every layer of `cache` through `client`. The cache changes only when every
// layer succeeded. Errors: the stream's or a job's status, FailedPrecondition when a
// layer's heads differ in length.
absl::StatusOr<CompressCacheStats> CompressCache(client::Client& client,
                                                 const CompressCacheOptions& options,
                                                 KvCache* cache);

}  // namespace centroidkv::worker
