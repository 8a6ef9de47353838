// The clustering engine: one interface, several backends (reference, CPU, CUDA), in the
// manner of FAISS's Index or ggml's backend interface. The unit of work is one layer job:
// all H KV heads of one layer of one sequence (SPEC.md section 2), because uniform_heads
// couples the heads and top-r selection is global across the chunks of a head.
//
// The job's types (LayerView, CompressOptions, CompressResult, EngineLimits) live in types/,
// shared with the wire codec and the client. No CUDA, TBB or gRPC types appear here. Engines are thread-safe: Compress() may be
// called concurrently from many threads (backends keep per-thread scratch themselves).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/compress_result.h"
#include "centroidkv/types/device_info.h"
#include "centroidkv/types/engine_limits.h"
#include "centroidkv/types/layer_view.h"

namespace centroidkv {

// Per-call control that is not part of the job: cooperative cancellation, and where the
// result's rows may go.
struct CompressControl {
  // When set and it becomes true, the engine stops within one chunk's work (the cpu and
  // reference backends check it inside their matching and merging loops) and returns
  // absl::CancelledError. Borrowed; must outlive the call.
  const std::atomic<bool>* cancelled = nullptr;
  // The job's deadline: past it the engine stops the same way (CancelledError); the caller
  // tells the two apart (Expired()). max() = none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Caller memory for the result's key and value rows (the service passes a client's output
  // region). Used when the backend writes rows in place in the job's result_dtype
  // (EngineCaps) and the job needs no stage above the backend that moves rows (regular
  // heads, no exact_target second stage, head-major rows without padding), or for fp8 rows
  // quantised above the backend; the result's rows_in_target says whether it was. Its capacities must hold H * n rows of each;
  // borrowed.
  const ResultRowTarget* row_target = nullptr;

  bool IsCancelled() const {
    return (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) || Expired();
  }
  bool Expired() const {
    return deadline != std::chrono::steady_clock::time_point::max() &&
           std::chrono::steady_clock::now() >= deadline;
  }
};

// Kernels a backend lends to the fit stage above it (kernels/fit/; EngineCaps::fit_kernels).
struct FitKernels {
  // x[i] += bias[i] for i < count, returning the largest x[i].
  float (*add_max)(float* x, const float* bias, int64_t count) = nullptr;
  // x[i] = e^(x[i] - shift) for i < count (float32, within a few ulp), returning their sum.
  float (*exp_sub_sum)(float* x, float shift, int64_t count) = nullptr;
};

// What a backend does itself, as one struct (in the manner of ggml's
// ggml_backend_dev_caps). Whatever a backend does not do, the engine's stages do above it,
// the same for every backend (kernels/stage_plan.h decides which, once per job).
struct EngineCaps {
  // Result rows in fp16 / bf16 (each the float32 result rounded once); otherwise the
  // backend writes float32 and the rows are rounded above it.
  bool writes_half_rows = false;
  // Result rows in fp8 with static or dynamic scales, exactly as kernels/fp8_rows.h
  // quantises them; otherwise that runs above the backend, on its float32 rows.
  bool writes_fp8_rows = false;
  // fp8 input codes read with their scales (LayerView::key_scales), widened exactly as
  // kernels/fp8_rows.h widens them; otherwise an fp8 input is widened to float32 above.
  bool reads_fp8_input = false;
  // Rows written into caller memory (LayerPlan::row_target) instead of the result's arrays:
  // the service then writes a job's rows straight into the client's shared memory.
  bool writes_rows_in_place = false;
  // The backend checks the job's data (what CheckLayerData checks) before it acts on any
  // element and returns CheckLayerData's error, so the engine skips its own sweep over the
  // data. Such a job cancelled before it starts reports CANCELLED even when its data is bad.
  bool checks_layer_data = false;
  // Fitted jobs run in float32 with these kernels; null: in float64 (kernels/fit/).
  const FitKernels* fit_kernels = nullptr;

  bool WritesResultDType(DType dtype) const {
    if (dtype == DType::kFloat32) return true;
    return IsFp8(dtype) ? writes_fp8_rows : writes_half_rows;
  }
  bool ReadsInputDType(DType dtype) const { return !IsFp8(dtype) || reads_fp8_input; }
};

// Validated, resolved parameters of one job, shared by every backend.
struct LayerPlan {
  int64_t target_length = 0;           // t, the same for every head
  std::vector<bool> passthrough;       // [H]
  int32_t compressed_heads = 0;        // heads that are not passthrough
  std::vector<int32_t> head_lengths;   // [H] real entries per head (without count-0 padding)
  bool regular = true;                 // not ragged and no padding: the backend runs it as is
  DType input_dtype = DType::kFloat32; // of the layer's keys and values
  // Budgeted jobs (CompressOptions::head_budgets, or scores): [H] the most entries each head
  // keeps, resolved (t for a compressed head, its length for a passthrough head, unless
  // head_budgets says otherwise); empty for other jobs.
  std::vector<int64_t> head_budgets;
  bool scored = false;  // the layer carries scores
  bool fitted = false;  // the layer carries reference queries
  CompressOptions options;
  // Where the backend writes the rows, when CompressControl::row_target may be used (set
  // only for a backend that writes rows in place, and checked to hold H * n rows of each
  // tensor); the backend then sets out->rows_in_target.
  const ResultRowTarget* row_target = nullptr;

  // The similarity floor of pass p, or -infinity when the floor is off.
  double FloorForPass(int32_t pass) const;
  bool budgeted() const { return !head_budgets.empty(); }
};

class ClusterEngine {
 public:
  virtual ~ClusterEngine() = default;

  // "reference", "cpu", "cuda:0", ...
  virtual std::string_view name() const = 0;

  // Validates `layer` and `options` (InvalidArgument / ResourceExhausted naming the
  // field), plans the job, then runs the backend. Thread-safe.
  absl::StatusOr<CompressResult> Compress(const LayerView& layer, const CompressOptions& options,
                                          const CompressControl& control = {}) const;

  // The same job into `result`, reusing its buffers: a caller that runs many jobs (a server
  // thread, a benchmark) keeps one CompressResult per thread and pays for its memory once
  // instead of faulting in and zero-filling fresh pages every job. `result` may hold any
  // earlier result; on success it holds exactly what Compress() would return, on error its
  // contents are unspecified. Thread-safe for distinct `result`s.
  absl::Status CompressInto(const LayerView& layer, const CompressOptions& options,
                            CompressResult* result, const CompressControl& control = {}) const;

  // What the backend does itself (EngineCaps); the stages above it do the rest.
  virtual EngineCaps caps() const { return {}; }

  // Runs fn(0) .. fn(count - 1), each call independent of the others: the per-head work the
  // stages above the backends do (fp8 widening and quantisation). The default runs them in
  // order on the caller's thread; a backend with a thread pool runs them on it.
  virtual void ForEachIndependent(int32_t count, const std::function<void(int32_t)>& fn) const {
    for (int32_t i = 0; i < count; ++i) fn(i);
  }

  const EngineLimits& limits() const { return limits_; }

 protected:
  explicit ClusterEngine(EngineLimits limits = {}) : limits_(limits) {}

  // Runs SPEC section 2 on a validated job. `out` arrives empty. The rows may be written in
  // plan.options.result_dtype (setting out->dtype) or in float32, which the caller then
  // rounds (RoundResultRows).
  virtual absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                    const CompressControl& control,
                                    CompressResult* out) const = 0;

  // CompressInto()'s backend half: `out` holds an earlier result (any shape). The default
  // empties its arrays (keeping their capacity) and runs CompressImpl. A backend that
  // overwrites every element it sizes may override it to size the arrays without emptying
  // them first, so a job of the same shape as the last one writes no element twice.
  virtual absl::Status CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                           const CompressControl& control,
                                           CompressResult* out) const;

 private:
  absl::Status Run(const LayerView& layer, const CompressOptions& options,
                   const CompressControl& control, bool reuse, CompressResult* result) const;
  // The backend on one regular job with a resolved plan, then its stop reasons.
  absl::Status RunBackend(const LayerPlan& plan, const LayerView& layer,
                          const CompressControl& control, bool reuse,
                          CompressResult* result) const;

  EngineLimits limits_;
};

// Rounds a float32 result's rows to `dtype` (fp16 / bf16, nearest even) into half_keys /
// half_values and empties keys / values (keeping their capacity); nothing when the result
// is already in `dtype`.
void RoundResultRows(DType dtype, CompressResult* result);

// Checks the shape and parameters of a job without its data (keys and values may be null):
// what a server can reject as soon as a job is announced, before its bytes arrive.
absl::Status ValidateJobShape(const LayerView& layer, const CompressOptions& options,
                              const EngineLimits& limits);

// Checks every field of a job, the data included (NaN/Inf in keys or values, zero counts),
// and resolves it into a plan. Errors name the field as the wire API spells it.
absl::StatusOr<LayerPlan> PlanLayer(const LayerView& layer, const CompressOptions& options,
                                    const EngineLimits& limits);

// PlanLayer's check of the data alone: every key and value finite (an fp8 element times its
// scale), every count at least 1 and each head's counts summing within uint32. The error
// names the first offending element in (head, token, dim) order.
absl::Status CheckLayerData(const LayerView& layer);

}  // namespace centroidkv
