// Fitted jobs, above every backend (docs/scored-jobs.md, "Fitted jobs"): after a job's rows
// are chosen (by the backend, the ragged split or the budgeted heads), each KV head's rows
// get real-valued log-weights, and its merged rows refitted values, so that attention on the
// job's reference queries (LayerView::queries) matches the full cache's (head_fit.h). In
// float32 with the backend's kernels where it lends them (EngineCaps::fit_kernels), else in
// float64. Internal to kernels/ (ClusterEngine::Compress).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"
#include "kernels/fit/head_fit.h"

namespace centroidkv {

// `out` is the job's float32, head-major, unpadded result with its assignment; `layer` the
// input it was computed from (float32, fp16 or bf16 rows; an fp8 input widened before).
// Fills out->log_weights and refits the merged rows' values. `stats` (may be null) gets one
// entry per head (zeros for a head left as it was: passthrough, or nothing merged or dropped).
absl::Status FitResult(const ClusterEngine& engine, const LayerPlan& plan,
                       const LayerView& layer, CompressResult* out,
                       std::vector<fit::HeadFitStats>* stats = nullptr);

}  // namespace centroidkv
