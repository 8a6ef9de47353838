// The long-generation report: runs, sums and the page.
#include "worker/quality/online_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "centroidkv/common/status_macros.h"

namespace centroidkv::worker::quality {

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

namespace {

struct Variant {
  std::string name;
  OnlineMethod method;
  bool pipelined;
};

const std::vector<Variant>& Variants() {
  static const std::vector<Variant> variants = {
      {"centroidkv (pipelined)", OnlineMethod::kCentroidKv, true},
      {"centroidkv (waits every step)", OnlineMethod::kCentroidKv, false},
      {"streamingllm", OnlineMethod::kStreamingLlm, true},
      {"h2o", OnlineMethod::kH2o, true},
  };
  return variants;
}

void AddRun(const OnlineRun& run, const std::vector<std::vector<float>>* reference,
            OnlineMethodResult* into, double texts) {
  if (reference != nullptr) {
    for (size_t i = 0; i < run.logits.size(); ++i) {
      into->agreement.Add(CompareStep((*reference)[i], run.logits[i]));
    }
  }
  into->mean_rows += run.mean_rows / texts;
  into->max_rows = std::max(into->max_rows, run.max_rows);
  into->final_rows = std::max(into->final_rows, run.final_rows);
  into->splices_stale += run.splices_stale;
  into->step_seconds.insert(into->step_seconds.end(), run.step_seconds.begin(),
                            run.step_seconds.end());
}

}  // namespace

absl::StatusOr<std::vector<OnlineMethodResult>> RunOnlineReport(
    Transformer& transformer, client::Client* client,
    const std::vector<std::vector<int32_t>>& texts, const OnlineReportSettings& settings,
    const Progress& progress) {
  if (texts.empty()) return absl::InvalidArgumentError("no texts");
  const int64_t length = static_cast<int64_t>(texts.front().size());
  std::vector<OnlineMethodResult> results;
  OnlineMethodResult full_run;
  full_run.method = "full";
  full_run.budget = 1.0;
  full_run.budget_entries = length;
  results.push_back(full_run);
  for (double budget : settings.budgets) {
    for (const Variant& v : Variants()) {
      OnlineMethodResult r;
      r.method = v.name;
      r.budget = budget;
      r.budget_entries = static_cast<int64_t>(std::ceil(budget * static_cast<double>(length)));
      results.push_back(r);
    }
  }
  const double count = static_cast<double>(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    OnlineSettings s = settings.online;
    CKV_ASSIGN_OR_RETURN(const OnlineRun full,
                         RunOnline(transformer, texts[i], OnlineMethod::kFull, s, nullptr));
    AddRun(full, nullptr, &results[0], count);
    size_t k = 1;
    for (double budget : settings.budgets) {
      (void)budget;
      for (const Variant& v : Variants()) {
        OnlineMethodResult& r = results[k++];
        s.budget_entries = r.budget_entries;
        s.pipelined = v.pipelined;
        CKV_ASSIGN_OR_RETURN(const OnlineRun run,
                             RunOnline(transformer, texts[i], v.method, s, client));
        AddRun(run, &full.logits, &r, count);
      }
    }
    if (progress) progress(absl::StrCat("text ", i + 1, " of ", texts.size()));
  }
  return results;
}

std::string OnlineMarkdownReport(const std::vector<OnlineMethodResult>& results,
                                 const std::string& context) {
  const double full_p50 = Quantile(results.front().step_seconds, 0.5);
  std::string md = absl::StrCat(
      "# Quality and decode latency of online compression (long generation)\n\n", context,
      "\n\n| budget | method | rows per head (mean / max during / end) | mean KL(full \\|\\| "
      "method) | top-1 agreement | step mean | step p50 | step p99 | p50 vs full |\n"
      "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const OnlineMethodResult& r : results) {
    const double p50 = Quantile(r.step_seconds, 0.5);
    const double p99 = Quantile(r.step_seconds, 0.99);
    double mean = 0.0;
    for (double x : r.step_seconds) mean += x / static_cast<double>(r.step_seconds.size());
    const bool full = r.method == "full";
    absl::StrAppend(
        &md, absl::StrFormat(
                 "| %s | %s | %.1f / %d / %d | %s | %s | %.1f us | %.1f us | %.1f us | %.2f |\n",
                 full ? "-" : absl::StrFormat("%.0f%% (%d)", 100.0 * r.budget, r.budget_entries),
                 r.method, r.mean_rows, r.max_rows, r.final_rows,
                 full ? "-" : absl::StrFormat("%.5f", r.agreement.mean_kl()),
                 full ? "-" : absl::StrFormat("%.4f", r.agreement.top1()), 1e6 * mean, 1e6 * p50,
                 1e6 * p99, full_p50 > 0 ? p50 / full_p50 : 0.0));
  }
  // Which method is closest to the uncompressed run at each budget (computed, not written).
  absl::StrAppend(&md, "\nLowest mean KL at each budget (the rest in order):\n\n");
  std::vector<double> budgets;
  for (const OnlineMethodResult& r : results) {
    if (r.method != "full" &&
        std::find(budgets.begin(), budgets.end(), r.budget) == budgets.end()) {
      budgets.push_back(r.budget);
    }
  }
  for (double budget : budgets) {
    std::vector<const OnlineMethodResult*> at;
    for (const OnlineMethodResult& r : results) {
      if (r.method != "full" && r.budget == budget) at.push_back(&r);
    }
    std::stable_sort(at.begin(), at.end(), [](const auto* a, const auto* b) {
      return a->agreement.mean_kl() < b->agreement.mean_kl();
    });
    std::string order;
    for (const OnlineMethodResult* r : at) {
      absl::StrAppend(&order, order.empty() ? "" : ", ",
                      absl::StrFormat("%s %.5f", r->method, r->agreement.mean_kl()));
    }
    absl::StrAppend(&md, absl::StrFormat("- %.0f%%: %s\n", 100.0 * budget, order));
  }
  return md;
}

std::string OnlineJsonLine(const std::vector<OnlineMethodResult>& results) {
  std::string json = "[";
  for (size_t i = 0; i < results.size(); ++i) {
    const OnlineMethodResult& r = results[i];
    absl::StrAppend(
        &json, i == 0 ? "" : ",",
        absl::StrFormat("{\"method\":\"%s\",\"budget\":%g,\"budget_entries\":%d,\"mean_kl\":%.6g,"
                        "\"top1\":%.6g,\"mean_rows\":%.3f,\"p50_ms\":%.6g,\"p99_ms\":%.6g}",
                        r.method, r.budget, r.budget_entries, r.agreement.mean_kl(),
                        r.agreement.top1(), r.mean_rows, 1e3 * Quantile(r.step_seconds, 0.5),
                        1e3 * Quantile(r.step_seconds, 0.99)));
  }
  return json + "]";
}

}  // namespace centroidkv::worker::quality
