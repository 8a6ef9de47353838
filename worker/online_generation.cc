// Long generation with online compression: the decode loop and each method's step.
#include "worker/online_generation.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "centroidkv/client/sequence.h"
#include "centroidkv/common/status_macros.h"
#include "worker/eviction.h"

namespace centroidkv::worker {

std::string_view OnlineMethodName(OnlineMethod method) {
  switch (method) {
    case OnlineMethod::kFull:
      return "full";
    case OnlineMethod::kCentroidKv:
      return "centroidkv";
    case OnlineMethod::kStreamingLlm:
      return "streamingllm";
    case OnlineMethod::kH2o:
      return "h2o";
  }
  return "?";
}

namespace {

// CentroidKV's side of the loop: the new rows go to the Sequence, arrived splices into the
// cache where CacheRows places them.
class OnlineCentroidKv {
 public:
  static absl::StatusOr<std::unique_ptr<OnlineCentroidKv>> Open(client::Client& client,
                                                                const KvCache& cache,
                                                                const OnlineSettings& s) {
    client::SequenceOptions o;
    o.num_layers = cache.num_layers();
    o.num_heads = cache.num_kv_heads();
    o.key_dim = cache.head_size();
    o.value_dim = cache.head_size();
    o.dtype = DType::kFloat32;
    o.sink_tokens = s.sink_tokens;
    o.recent_tokens = s.recent_tokens;
    o.chunk_tokens = s.chunk_tokens;
    o.policy = client::OnlinePolicy::kFixedBudget;
    o.budget_entries = s.budget_entries;
    o.compression = s.compression;
    o.backend = s.backend;
    CKV_ASSIGN_OR_RETURN(std::unique_ptr<client::Sequence> sequence,
                         client::Sequence::Open(client, o));
    return std::unique_ptr<OnlineCentroidKv>(
        new OnlineCentroidKv(std::move(sequence), cache.num_layers(), s.pipelined));
  }

  // After a Forward: hands the token's rows over and applies what has arrived.
  absl::Status AfterStep(KvCache* cache, OnlineRun* run) {
    const int32_t heads = cache->num_kv_heads();
    const size_t hs = static_cast<size_t>(cache->head_size());
    for (int32_t l = 0; l < cache->num_layers(); ++l) {
      for (int32_t h = 0; h < heads; ++h) {
        const HeadCache& head = cache->head(l, h);
        std::copy(head.keys.end() - static_cast<ptrdiff_t>(hs), head.keys.end(),
                  keys_.begin() + static_cast<ptrdiff_t>(h * hs));
        std::copy(head.values.end() - static_cast<ptrdiff_t>(hs), head.values.end(),
                  values_.begin() + static_cast<ptrdiff_t>(h * hs));
      }
      CKV_RETURN_IF_ERROR(sequence_->Append(l, keys_.data(), values_.data()));
    }
    CKV_RETURN_IF_ERROR(sequence_->EndToken());
    rows_.AppendToken();
    if (!pipelined_) CKV_RETURN_IF_ERROR(sequence_->Flush());
    return ApplyArrived(cache, run);
  }

  // Waits for every job and applies the rest.
  absl::Status Finish(KvCache* cache, OnlineRun* run) {
    CKV_RETURN_IF_ERROR(sequence_->Flush());
    CKV_RETURN_IF_ERROR(ApplyArrived(cache, run));
    return sequence_->Close();
  }

 private:
  OnlineCentroidKv(std::unique_ptr<client::Sequence> sequence, int32_t layers, bool pipelined)
      : sequence_(std::move(sequence)),
        rows_(layers),
        pipelined_(pipelined),
        keys_(static_cast<size_t>(sequence_->options().num_heads * sequence_->options().key_dim)),
        values_(keys_.size()) {}

  absl::Status ApplyArrived(KvCache* cache, OnlineRun* run) {
    for (const client::Splice& splice : sequence_->TakeSplices()) {
      CKV_ASSIGN_OR_RETURN(const std::optional<client::SpliceRows> place, rows_.Place(splice));
      if (!place.has_value()) {
        ++run->splices_stale;
        continue;
      }
      const size_t n = static_cast<size_t>(splice.rows_per_head);
      const size_t floats = n * static_cast<size_t>(splice.key_dim);
      const auto* keys = reinterpret_cast<const float*>(splice.keys.data());
      const auto* values = reinterpret_cast<const float*>(splice.values.data());
      for (int32_t h = 0; h < splice.num_heads; ++h) {
        const size_t hh = static_cast<size_t>(h);
        CKV_RETURN_IF_ERROR(
            cache->SpliceRows(static_cast<int32_t>(splice.layer), h, place->row_begin,
                              place->row_end, std::span<const float>(keys + hh * floats, floats),
                              std::span<const float>(values + hh * floats, floats),
                              std::span<const uint32_t>(splice.counts.data() + hh * n, n)));
      }
      ++run->splices_applied;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<client::Sequence> sequence_;
  client::CacheRows rows_;
  bool pipelined_;
  std::vector<float> keys_, values_;  // one token of one layer, [H, head_size]
};

int64_t MostRows(const KvCache& cache) {
  int64_t most = 0;
  for (int32_t l = 0; l < cache.num_layers(); ++l) {
    for (int32_t h = 0; h < cache.num_kv_heads(); ++h)
      most = std::max(most, cache.head(l, h).size());
  }
  return most;
}

}  // namespace

absl::StatusOr<OnlineRun> RunOnline(Transformer& transformer, std::span<const int32_t> tokens,
                                    OnlineMethod method, const OnlineSettings& settings,
                                    client::Client* client) {
  if (settings.prompt_tokens < 1 || settings.prompt_tokens >= static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens ", settings.prompt_tokens,
                                                   " must be in [1, ", tokens.size(), ")"));
  }
  KvCache cache = transformer.NewCache();
  if (method == OnlineMethod::kH2o) cache.TrackAttention(true);
  std::unique_ptr<OnlineCentroidKv> centroidkv;
  if (method == OnlineMethod::kCentroidKv) {
    if (client == nullptr) return absl::InvalidArgumentError("centroidkv needs a client");
    CKV_ASSIGN_OR_RETURN(centroidkv, OnlineCentroidKv::Open(*client, cache, settings));
  }
  OnlineRun run;
  double rows_sum = 0.0;
  const double heads = static_cast<double>(cache.num_layers() * cache.num_kv_heads());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto start = std::chrono::steady_clock::now();
    CKV_RETURN_IF_ERROR(transformer.Forward(tokens[t], &cache));
    switch (method) {
      case OnlineMethod::kFull:
        break;
      case OnlineMethod::kCentroidKv:
        CKV_RETURN_IF_ERROR(centroidkv->AfterStep(&cache, &run));
        break;
      case OnlineMethod::kStreamingLlm:
        EvictStreamingLlmToBudget(&cache, settings.budget_entries, settings.sink_tokens);
        break;
      case OnlineMethod::kH2o:
        CKV_RETURN_IF_ERROR(EvictHeavyHittersToBudget(
            &cache, settings.budget_entries, settings.sink_tokens, settings.recent_tokens));
        break;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (t < static_cast<size_t>(settings.prompt_tokens)) continue;
    run.logits.push_back(transformer.logits());
    run.step_seconds.push_back(seconds);
    rows_sum += static_cast<double>(cache.TotalRows()) / heads;
    run.max_rows = std::max(run.max_rows, MostRows(cache));
  }
  if (centroidkv != nullptr) CKV_RETURN_IF_ERROR(centroidkv->Finish(&cache, &run));
  run.final_rows = MostRows(cache);
  run.mean_rows = rows_sum / static_cast<double>(std::max<size_t>(1, run.logits.size()));
  return run;
}

}  // namespace centroidkv::worker
