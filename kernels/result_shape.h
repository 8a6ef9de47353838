// The honest account of a result (target, entries, input tokens and stop reason per head)
// and its final shape (padding to equal lengths, token-major rows), computed the same way
// above every backend. Internal to kernels/; thread-safe: pure functions on one result.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv {

// Empties a result that is about to be overwritten (shape, rows, counts, assignment,
// passes and account), keeping its vectors' capacity for reuse.
void ClearResult(CompressResult* result);

// Why heads [first_head, first_head + count) of `result` stopped, from their entries and
// the passes their job ran (result->stop_reasons is sized to the result's heads).
void FillStopReasons(const LayerPlan& plan, int32_t passes_run, int32_t first_head,
                     int32_t count, CompressResult* result);
StopReason StopReasonFor(const LayerPlan& plan, bool passthrough, int64_t entries,
                         int32_t passes_run);

// Target, entries, input tokens and target_reached (each head within t, or within its
// budget for a budgeted job) of a head-major, unpadded result (stop_reasons already filled).
void FillAccount(const LayerPlan& plan, const LayerView& layer, CompressResult* result);

// Whether ShapeRows rearranges the rows of a job with `options` (pad_heads, pad_to,
// token-major output); a backend's rows are then not the result's final rows.
bool ReshapesRows(const CompressOptions& options);

// Pads every head to the same length (pad_heads, pad_to, token-major output) and lays the
// rows out token-major when asked. FailedPrecondition naming pad_to when a head is longer.
absl::Status ShapeRows(const CompressOptions& options, CompressResult* result);

}  // namespace centroidkv
