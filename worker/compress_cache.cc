// CompressCache: export each layer, pipeline the jobs on one stream, replace the entries.
#include "worker/compress_cache.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"

namespace centroidkv::worker {
namespace {

LayerView ViewOf(const LayerTensors& tensors) {
  LayerView view{.dtype = DType::kFloat32, .layout = TensorLayout::kHeadMajor,
      .num_heads = tensors.num_heads, .num_tokens = tensors.num_tokens,
      .key_dim = tensors.head_size, .value_dim = tensors.head_size, .keys = tensors.keys.data(),
      .values = tensors.values.data(), .counts = tensors.counts.data(),
      .head_offsets = tensors.head_offsets.empty() ? nullptr : tensors.head_offsets.data()};
  return view;
}

// Sends every layer and collects the results, indexed by layer. `tensors` must outlive
// the stream, which this function closes (or aborts) before returning.
absl::StatusOr<std::vector<client::LayerResult>> RunJobs(client::Client& client,
                                                         const CompressCacheOptions& options,
                                                         const std::vector<LayerTensors>& tensors) {
  const int32_t num_layers = static_cast<int32_t>(tensors.size());
  std::unique_ptr<client::CompressStream> stream = client.OpenStream();
  auto fail = [&stream](absl::Status status) {
    stream->Abort();
    return status;
  };
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    client::LayerJob job;
    job.layer_index = static_cast<uint32_t>(layer);
    job.layer = ViewOf(tensors[static_cast<size_t>(layer)]);
    job.options = options.compression;
    job.options.passthrough_heads = PassthroughHeadsOf(options, layer);
    if (static_cast<size_t>(layer) < options.scores_per_layer.size()) {
      const std::vector<float>& scores = options.scores_per_layer[static_cast<size_t>(layer)];
      if (scores.size() != tensors[static_cast<size_t>(layer)].counts.size()) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "layer ", layer, ": ", scores.size(), " scores for ",
            tensors[static_cast<size_t>(layer)].counts.size(), " entries")));
      }
      job.layer.scores = scores.data();
    }
    if (static_cast<size_t>(layer) < options.head_budgets_per_layer.size()) {
      job.options.head_budgets = options.head_budgets_per_layer[static_cast<size_t>(layer)];
    }
    job.options.compute_assignment = false;
    job.options.output_layout = TensorLayout::kHeadMajor;
    job.output_dtype = options.output_dtype;
    job.backend = options.backend;
    if (absl::StatusOr<uint64_t> id = stream->Submit(job); !id.ok()) {
      // The server may have ended the stream over an earlier job: report its reason.
      absl::Status ended = stream->Close();
      return ended.ok() ? id.status() : ended;
    }
  }
  std::vector<client::LayerResult> results(static_cast<size_t>(num_layers));
  for (int32_t received = 0; received < num_layers; ++received) {
    absl::StatusOr<client::LayerResult> result = stream->Next();
    if (!result.ok()) return fail(result.status());
    if (!result->status.ok()) {
      return fail(absl::Status(
          result->status.code(),
          absl::StrCat("layer ", result->layer_index, ": ", result->status.message())));
    }
    if (result->layer_index >= static_cast<uint32_t>(num_layers)) {
      return fail(absl::InternalError(
          absl::StrCat("the server answered for unknown layer ", result->layer_index)));
    }
    results[result->layer_index] = *std::move(result);
  }
  CKV_RETURN_IF_ERROR(stream->Close());
  return results;
}

// Checks that a result has the shape of what was sent, in `dtype`.
absl::Status CheckResult(const client::LayerResult& result, const LayerTensors& sent,
                         DType dtype) {
  const size_t row_bytes = static_cast<size_t>(sent.head_size) * DTypeSize(dtype);
  if (result.num_heads != sent.num_heads || result.key_dim != sent.head_size ||
      result.value_dim != sent.head_size || result.dtype != dtype ||
      result.offsets.size() != static_cast<size_t>(sent.num_heads) + 1 ||
      static_cast<int64_t>(result.counts.size()) != result.total_entries() ||
      result.keys.size() != result.counts.size() * row_bytes ||
      result.values.size() != result.counts.size() * row_bytes) {
    return absl::InternalError(
        absl::StrCat("layer ", result.layer_index, ": the result's shape does not match the job"));
  }
  for (size_t h = 0; h < static_cast<size_t>(sent.num_heads); ++h) {
    if (result.offsets[h] > result.offsets[h + 1] || result.offsets[0] != 0) {
      return absl::InternalError(
          absl::StrCat("layer ", result.layer_index, ": the result's offsets are not sorted"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<int32_t>& PassthroughHeadsOf(const CompressCacheOptions& options, int32_t layer) {
  if (layer >= 0 && static_cast<size_t>(layer) < options.passthrough_per_layer.size()) {
    return options.passthrough_per_layer[static_cast<size_t>(layer)];
  }
  return options.compression.passthrough_heads;
}

absl::StatusOr<CompressCacheStats> CompressCache(client::Client& client,
                                                 const CompressCacheOptions& options,
                                                 KvCache* cache) {
  CompressCacheStats stats;
  stats.entries_before = cache->TotalEntries();
  std::vector<LayerTensors> tensors;
  for (int32_t layer = 0; layer < cache->num_layers(); ++layer) {
    CKV_ASSIGN_OR_RETURN(LayerTensors layer_tensors, cache->ExportLayer(layer));
    tensors.push_back(std::move(layer_tensors));
  }
  CKV_ASSIGN_OR_RETURN(std::vector<client::LayerResult> results, RunJobs(client, options, tensors));
  const int32_t hs = cache->head_size();
  for (size_t layer = 0; layer < results.size(); ++layer) {
    CKV_RETURN_IF_ERROR(CheckResult(results[layer], tensors[layer], options.output_dtype));
  }
  for (size_t layer = 0; layer < results.size(); ++layer) {
    const client::LayerResult& result = results[layer];
    const std::vector<float> keys = result.KeysAsFloat();
    const std::vector<float> values = result.ValuesAsFloat();
    for (int32_t h = 0; h < result.num_heads; ++h) {
      const int64_t begin = result.offsets[static_cast<size_t>(h)];
      const int64_t end = result.offsets[static_cast<size_t>(h) + 1];
      CKV_RETURN_IF_ERROR(cache->ReplaceHead(
          static_cast<int32_t>(layer), h,
          std::vector<float>(keys.begin() + begin * hs, keys.begin() + end * hs),
          std::vector<float>(values.begin() + begin * hs, values.begin() + end * hs),
          std::vector<uint32_t>(result.counts.begin() + begin, result.counts.begin() + end)));
    }
    stats.max_passes_run = std::max(stats.max_passes_run, result.passes_run);
    stats.backend = result.backend;
    LayerAccount account;
    account.target_length = result.target_length;
    account.target_reached = result.target_reached;
    account.head_entries = result.head_entries;
    account.stop_reasons = result.stop_reasons;
    account.padded_length = result.padded_length;
    if (!account.target_reached) ++stats.layers_target_missed;
    stats.layers.push_back(std::move(account));
  }
  stats.entries_after = cache->TotalEntries();
  stats.rows_after = cache->TotalRows();
  return stats;
}

}  // namespace centroidkv::worker
