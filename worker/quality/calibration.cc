// Outlier-head calibration and the text form of heads per layer.
#include "worker/quality/calibration.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/compress_cache.h"

namespace centroidkv::worker::quality {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseHeadList(absl::string_view list, int32_t num_heads) {
  std::vector<int32_t> heads;
  for (absl::string_view field : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    int32_t head = 0;
    if (!absl::SimpleAtoi(field, &head) || head < 0 || head >= num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", field, "\" is not a KV head in [0, ", num_heads, ")"));
    }
    if (std::find(heads.begin(), heads.end(), head) == heads.end()) heads.push_back(head);
  }
  std::sort(heads.begin(), heads.end());
  return heads;
}

}  // namespace

std::vector<std::vector<int32_t>> AllHeadsBut(int32_t layer, int32_t head, int32_t num_layers,
                                              int32_t num_heads) {
  std::vector<std::vector<int32_t>> passthrough(static_cast<size_t>(num_layers));
  for (int32_t l = 0; l < num_layers; ++l) {
    for (int32_t h = 0; h < num_heads; ++h) {
      if (l != layer || h != head) passthrough[static_cast<size_t>(l)].push_back(h);
    }
  }
  return passthrough;
}

absl::StatusOr<std::vector<HeadScore>> ScoreHeads(Transformer& transformer, client::Client& client,
                                                  const std::vector<PrefilledText>& texts,
                                                  const MethodSettings& settings, double budget) {
  const ModelConfig& config = transformer.model().config();
  std::vector<HeadScore> scores;
  for (int32_t layer = 0; layer < config.n_layers; ++layer) {
    for (int32_t head = 0; head < config.n_kv_heads; ++head) {
      HeadScore score{layer, head, {}};
      for (const PrefilledText& text : texts) {
        const CompressCacheOptions options = CentroidKvOptions(
            settings, budget, AllHeadsBut(layer, head, config.n_layers, config.n_kv_heads),
            /*share_budget=*/false, config.n_layers, config.n_kv_heads,
            text.cache.head(0, 0).size());
        absl::StatusOr<Agreement> agreement =
            EvaluateCompressed(transformer, text, [&client, &options](KvCache* cache) {
              return CompressCache(client, options, cache).status();
            });
        if (!agreement.ok()) return agreement.status();
        score.agreement.Add(*agreement);
      }
      scores.push_back(score);
    }
  }
  std::stable_sort(scores.begin(), scores.end(), [](const HeadScore& a, const HeadScore& b) {
    return a.agreement.mean_kl() > b.agreement.mean_kl();
  });
  return scores;
}

std::vector<std::vector<int32_t>> PickRankedHeads(
    const std::vector<std::pair<int32_t, int32_t>>& ranked, int32_t count, int32_t num_layers) {
  std::vector<std::vector<int32_t>> per_layer(static_cast<size_t>(num_layers));
  for (int32_t i = 0; i < count && static_cast<size_t>(i) < ranked.size(); ++i) {
    const auto& [layer, head] = ranked[static_cast<size_t>(i)];
    per_layer[static_cast<size_t>(layer)].push_back(head);
  }
  for (std::vector<int32_t>& heads : per_layer) std::sort(heads.begin(), heads.end());
  return per_layer;
}

std::vector<std::vector<int32_t>> PickOutlierHeads(const std::vector<HeadScore>& scores,
                                                   int32_t count, int32_t num_layers) {
  std::vector<std::pair<int32_t, int32_t>> ranked;
  for (const HeadScore& s : scores) ranked.emplace_back(s.layer, s.head);
  return PickRankedHeads(ranked, count, num_layers);
}

std::string FormatHeads(const std::vector<std::vector<int32_t>>& per_layer) {
  std::vector<std::string> items;
  for (size_t layer = 0; layer < per_layer.size(); ++layer) {
    if (per_layer[layer].empty()) continue;
    items.push_back(absl::StrCat(layer, ":", absl::StrJoin(per_layer[layer], ",")));
  }
  return absl::StrJoin(items, ";");
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ParseHeads(const std::string& text,
                                                             int32_t num_layers,
                                                             int32_t num_heads) {
  std::vector<std::vector<int32_t>> per_layer(static_cast<size_t>(num_layers));
  if (text.find(':') == std::string::npos) {  // "1,3": the same heads in every layer
    absl::StatusOr<std::vector<int32_t>> heads = ParseHeadList(text, num_heads);
    if (!heads.ok()) return heads.status();
    per_layer.assign(static_cast<size_t>(num_layers), *heads);
    return per_layer;
  }
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, ':');
    int32_t layer = 0;
    if (!absl::SimpleAtoi(parts.first, &layer) || layer < 0 || layer >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("passthrough heads \"", text, "\": \"",
                                                     parts.first, "\" is not a layer in [0, ",
                                                     num_layers, ")"));
    }
    absl::StatusOr<std::vector<int32_t>> heads = ParseHeadList(parts.second, num_heads);
    if (!heads.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("passthrough heads \"", text, "\": ", heads.status().message()));
    }
    std::vector<int32_t>& into = per_layer[static_cast<size_t>(layer)];
    into.insert(into.end(), heads->begin(), heads->end());
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
  }
  return per_layer;
}

}  // namespace centroidkv::worker::quality
