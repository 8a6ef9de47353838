// The JSON line and the markdown report of the quality command.
#include "worker/quality/report.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace centroidkv::worker::quality {
namespace {

// Eviction and k-means, with or without outlier heads kept whole.
bool IsBaseline(const std::string& method) {
  const std::string base = BaseMethod(method);
  return base == kStreamingLlm || base == kH2o || base == kSnapKv || base == kKMeans;
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100.0 * fraction); }

void AppendTable(const std::vector<MethodResult>& results, std::string* out) {
  absl::StrAppend(out,
                  "| budget | method | KV kept | mean KL(full \\|\\| compressed) | top-1 "
                  "agreement | worst text top-1 | layers missing the target |\n",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const MethodResult& r : results) {
    double worst = 1.0;
    for (const Agreement& text : r.texts) worst = std::min(worst, text.top1());
    const std::string missed =
        r.targets.layers == 0
            ? "-"
            : absl::StrFormat("%d of %d", r.targets.layers_missed, r.targets.layers);
    absl::StrAppend(out, absl::StrFormat("| %s | %s | %s | %.5f | %.4f | %.3f | %s |\n",
                                         Percent(r.budget), r.method, Percent(r.kv_fraction()),
                                         r.agreement.mean_kl(), r.agreement.top1(), worst,
                                         missed));
  }
}

void AppendTargets(const std::vector<MethodResult>& results, const RunSettings& settings,
                   std::string* out) {
  if (std::find(settings.budgets.begin(), settings.budgets.end(), 0.25) == settings.budgets.end()) {
    return;
  }
  absl::StrAppend(out, "\n## Targets at a 25% budget\n\n",
                  "Top-1 agreement at least 0.98, and a mean KL below every baseline.\n\n");
  for (const TargetCheck& check : CheckTargets(results, 0.25)) {
    absl::StrAppend(
        out, absl::StrFormat("- `%s`: top-1 %.4f (%s); mean KL %.5f vs best baseline %s %.5f "
                             "(%s).\n",
                             check.method, check.top1, check.top1_met ? "met" : "**missed**",
                             check.mean_kl, check.best_baseline, check.best_baseline_kl,
                             check.kl_met ? "met" : "**missed**"));
  }
}

void AppendHeadScores(const ReportContext& context, std::string* out) {
  if (context.head_scores.empty()) return;
  absl::StrAppend(out, "\n## Outlier-head calibration\n\n", context.outlier_source, "\n\n",
                  "| rank | layer | KV head | mean KL, this head alone compressed | top-1 |\n",
                  "| ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < context.head_scores.size(); ++i) {
    const HeadScore& s = context.head_scores[i];
    absl::StrAppend(out, absl::StrFormat("| %d | %d | %d | %.5f | %.4f |\n", i + 1, s.layer, s.head,
                                         s.agreement.mean_kl(), s.agreement.top1()));
  }
}

}  // namespace

std::vector<TargetCheck> CheckTargets(const std::vector<MethodResult>& results, double budget) {
  double best_kl = std::numeric_limits<double>::infinity();
  std::string best;
  for (const MethodResult& r : results) {
    if (r.budget == budget && IsBaseline(r.method) && r.agreement.mean_kl() < best_kl) {
      best_kl = r.agreement.mean_kl();
      best = r.method;
    }
  }
  std::vector<TargetCheck> checks;
  for (const MethodResult& r : results) {
    if (r.budget != budget || IsBaseline(r.method)) continue;
    TargetCheck check;
    check.method = r.method;
    check.budget = budget;
    check.top1 = r.agreement.top1();
    check.mean_kl = r.agreement.mean_kl();
    check.best_baseline = best.empty() ? "(none run)" : best;
    check.best_baseline_kl = best_kl;
    check.top1_met = check.top1 >= 0.98;
    check.kl_met = check.mean_kl < best_kl;
    checks.push_back(check);
  }
  return checks;
}

std::string JsonLine(const std::vector<MethodResult>& results) {
  std::vector<std::string> objects;
  for (const MethodResult& r : results) {
    // The service's account, for the methods that went through it.
    const std::string account =
        r.targets.layers == 0
            ? ""
            : absl::StrFormat(", \"target_reached\": %s, \"layers_target_missed\": %d, "
                              "\"padding_rows\": %d",
                              r.targets.layers_missed == 0 ? "true" : "false",
                              r.targets.layers_missed, r.targets.padding_rows);
    objects.push_back(absl::StrFormat(
        "{\"method\": \"%s\", \"budget\": %g, \"mean_kl\": %.6g, \"top1\": %.6g, "
        "\"kv_fraction\": %.6g%s}",
        r.method, r.budget, r.agreement.mean_kl(), r.agreement.top1(), r.kv_fraction(), account));
  }
  return absl::StrCat("[", absl::StrJoin(objects, ", "), "]");
}

std::string MarkdownReport(const std::vector<MethodResult>& results, const ReportContext& context) {
  const RunSettings& s = context.settings;
  const CompressOptions& c = s.method_settings.centroidkv.compression;
  std::string out = "# Quality on a real model: CentroidKV against eviction and k-means\n\n";
  absl::StrAppend(
      &out,
      "Generated by `centroidkv-quality` (worker/quality/); the plot is `quality.png`. "
      "Protocol of SPEC section 4: prefill ",
      s.prefill,
      " tokens, compress every layer's KV "
      "cache to the budget (CentroidKV through the running server; the baselines in-process), "
      "then teacher-force the next ",
      s.continuation,
      " tokens, new tokens appended "
      "uncompressed at their true positions, and compare each next-token distribution with "
      "the uncompressed run.\n\n",
      "- model: ", context.model, "\n- texts: ", context.texts,
      context.sample.empty() ? "" : absl::StrCat("; the first begins \"", context.sample, "…\""),
      context.preset.empty() ? "" : absl::StrCat("\n- preset: ", context.preset),
      "\n- CentroidKV: chunk ", c.chunk_size, ", sinks ", c.sink_tokens, ", recent ",
      c.recent_tokens, ", min similarity ",
      c.min_similarity ? absl::StrFormat("%g", *c.min_similarity) : "off", ", tighten per pass ",
      c.tighten_per_pass, ", max passes ", c.max_passes, ", uniform heads ",
      c.uniform_heads ? "on" : "off", c.exact_target ? ", exact target" : "",
      c.pad_to > 0 ? absl::StrCat(", heads padded to ", c.pad_to, " rows")
      : c.pad_heads ? ", heads padded to equal lengths" : "",
      ", backend `", context.backend, "`\n",
      "- baselines protect the same ", c.sink_tokens, " sinks and ", c.recent_tokens,
      " recent entries (StreamingLLM keeps its whole budget as sinks + most recent); k-means: ",
      s.method_settings.kmeans_iterations, " count-weighted Lloyd iterations on keys\n",
      "- outlier heads (`centroidkv+outliers`): ",
      context.outlier_heads.empty() ? "none" : absl::StrCat("`", context.outlier_heads, "`"),
      context.outlier_heads.empty() ? ""
      : s.method_settings.outliers_share_budget
          ? " (they count against the budget: the other heads shrink to keep the total)"
          : " (on top of the budget: see KV kept)",
      "\n\nCommand (the script named above builds, starts a server and runs it):\n\n```sh\n",
      context.command, "\n```\n\n");
  AppendTable(results, &out);
  AppendTargets(results, s, &out);
  AppendHeadScores(context, &out);
  absl::StrAppend(&out,
                  "\nDefaults (chunk size, recent window, similarity floor, outlier heads) were "
                  "tuned on calibration texts only (seeds 5000+), never on these evaluation texts: "
                  "see `quality_tuning.md` (`scripts/tune_quality.sh`).\n");
  absl::StrAppend(&out,
                  "\nKV kept is measured (entries after compression / entries before, over all "
                  "layers, heads and texts; count-0 padding rows are not entries).");
  if (context.head_size > 0 && context.head_size < 64) {
    absl::StrAppend(&out, " Caveat from `../shared/models/README.md`: this model's head size is ",
                    context.head_size, ", far below production models (64-128).");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

}  // namespace centroidkv::worker::quality
