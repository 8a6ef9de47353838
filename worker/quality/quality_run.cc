// The quality loop: texts x budgets x methods.
#include "worker/quality/quality_run.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/quality/methods.h"

namespace centroidkv::worker::quality {

absl::StatusOr<std::vector<MethodResult>> RunQuality(Transformer& transformer,
                                                     client::Client* client,
                                                     const std::vector<std::vector<int32_t>>& texts,
                                                     const RunSettings& settings,
                                                     const Progress& progress) {
  std::vector<MethodResult> results;
  for (double budget : settings.budgets) {
    for (const std::string& method : settings.methods) {
      results.push_back(MethodResult{method, budget, {}, {}, 0, 0, {}});
    }
  }
  // Each compressor tallies into its result, which no longer moves.
  std::vector<CacheCompressor> compressors;
  for (MethodResult& result : results) {
    absl::StatusOr<CacheCompressor> compressor = MakeCompressor(
        result.method, result.budget, settings.method_settings, client, &result.targets);
    if (!compressor.ok()) return compressor.status();
    compressors.push_back(*std::move(compressor));
  }
  const PrefillTracking tracking = TrackingFor(settings.methods, settings.method_settings);
  const size_t length = static_cast<size_t>(settings.prefill + settings.continuation);
  for (size_t t = 0; t < texts.size(); ++t) {
    if (texts[t].size() < length) {
      return absl::InvalidArgumentError(
          absl::StrCat("text ", t, " has ", texts[t].size(), " tokens; ", length, " are needed"));
    }
    absl::StatusOr<PrefilledText> text =
        PrefillText(transformer, std::span<const int32_t>(texts[t]).first(length), settings.prefill,
                    tracking);
    if (!text.ok()) return text.status();
    std::string line = absl::StrCat("text ", t + 1, "/", texts.size(), ":");
    for (size_t m = 0; m < results.size(); ++m) {
      int64_t entries = 0;
      absl::StatusOr<Agreement> agreement =
          EvaluateCompressed(transformer, *text, compressors[m], &entries,
                             UsesObservationWindow(results[m].method));
      if (!agreement.ok()) {
        return absl::Status(agreement.status().code(),
                            absl::StrCat(results[m].method, " at budget ", results[m].budget,
                                         ", text ", t, ": ", agreement.status().message()));
      }
      results[m].agreement.Add(*agreement);
      results[m].texts.push_back(*agreement);
      results[m].entries_kept += entries;
      results[m].entries_full += text->cache.TotalEntries();
      absl::StrAppend(
          &line, absl::StrFormat(" %s@%g kl=%.4f top1=%.3f", results[m].method, results[m].budget,
                                 agreement->mean_kl(), agreement->top1()));
    }
    if (progress) progress(line);
  }
  return results;
}

}  // namespace centroidkv::worker::quality
