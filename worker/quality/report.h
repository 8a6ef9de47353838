// Output of the quality command: the JSON line printed last (one object per method and
// budget: method, budget, mean_kl, top1, plus kv_fraction), and the markdown report
// written to docs/ (settings, the command, the table, the target check, outlier heads).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/quality/calibration.h"
#include "worker/quality/quality_run.h"

namespace centroidkv::worker::quality {

// What the report says about how the numbers were made.
struct ReportContext {
  std::string command;                 // the exact command line
  std::string model;                   // model path and shape
  std::string texts;                   // where the texts came from
  std::string sample;                  // the start of the first text, decoded
  std::string outlier_heads;           // FormatHeads() of the outlier heads, "" for none
  std::string outlier_source;          // how they were found
  std::vector<HeadScore> head_scores;  // calibration scores, most harmful first
  std::string backend;                 // the server's engine
  std::string preset;                  // the parameter preset and its overrides
  int32_t head_size = 0;               // the model's head size (a caveat below 64)
  RunSettings settings;
};

// The SPEC targets at one budget: CentroidKV top-1 >= 0.98 and mean KL below every
// baseline that was run.
struct TargetCheck {
  std::string method;
  double budget = 0.0;
  double top1 = 0.0;
  double mean_kl = 0.0;
  double best_baseline_kl = 0.0;
  std::string best_baseline;
  bool top1_met = false;
  bool kl_met = false;
};
std::vector<TargetCheck> CheckTargets(const std::vector<MethodResult>& results, double budget);

// [{"method": ..., "budget": ..., "mean_kl": ..., "top1": ..., "kv_fraction": ...}, ...]
std::string JsonLine(const std::vector<MethodResult>& results);

// The markdown report.
std::string MarkdownReport(const std::vector<MethodResult>& results, const ReportContext& context);

}  // namespace centroidkv::worker::quality
