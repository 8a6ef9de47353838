// The long-generation report (docs/results/quality-online.md): for each text, the
// uncompressed run is the reference; CentroidKV online (pipelined, and waiting for its
// splices every step), StreamingLLM and H2O keep every head at the same budget of rows; per
// method and budget, the mean KL(full || method) and top-1 agreement over the generated
// positions, the rows attended, and the decode-step latency next to the uncompressed run's.
//
// Thread-safety: one call at a time per Transformer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "worker/evaluation.h"
#include "worker/online_generation.h"
#include "worker/quality/quality_run.h"

namespace centroidkv::worker::quality {

struct OnlineReportSettings {
  OnlineSettings online;        // budget_entries is set per budget
  std::vector<double> budgets;  // fractions of the text length
};

struct OnlineMethodResult {
  std::string method;   // "centroidkv (pipelined)", ...
  double budget = 0.0;  // fraction of the text length
  int64_t budget_entries = 0;
  Agreement agreement;
  double mean_rows = 0.0;  // mean over texts of OnlineRun::mean_rows
  int64_t max_rows = 0;    // over texts
  int64_t final_rows = 0;  // over texts
  int64_t splices_stale = 0;
  std::vector<double> step_seconds;  // every generated step of every text
};

// Runs every text through every method at every budget (methods alternate within a text, so
// latencies are taken side by side). The first result is the uncompressed run (budget 1).
absl::StatusOr<std::vector<OnlineMethodResult>> RunOnlineReport(
    Transformer& transformer, client::Client* client,
    const std::vector<std::vector<int32_t>>& texts, const OnlineReportSettings& settings,
    const Progress& progress = nullptr);

// The markdown page (context: the command, model, texts and settings, already formatted).
std::string OnlineMarkdownReport(const std::vector<OnlineMethodResult>& results,
                                 const std::string& context);
// One JSON line: [{method, budget, budget_entries, mean_kl, top1, mean_rows, p50_ms, p99_ms}].
std::string OnlineJsonLine(const std::vector<OnlineMethodResult>& results);

// The q-quantile (nearest rank) of `values`; 0 when empty.
double Quantile(std::vector<double> values, double q);

}  // namespace centroidkv::worker::quality
