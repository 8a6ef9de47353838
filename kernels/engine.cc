// ClusterEngine's non-virtual half, shared by every backend (as FAISS's Index::search wraps
// searchImpl_): a job is validated (job_validation.cc), its stages are decided once
// (PlanStages, stage_plan.h) and run in one straight line around the backend.
#include "centroidkv/kernels/engine.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"
#include "kernels/budgeted_heads.h"
#include "kernels/fit/fit_stage.h"
#include "kernels/fp8_rows.h"
#include "kernels/job_validation.h"
#include "kernels/ragged_layer.h"
#include "kernels/result_shape.h"
#include "kernels/stage_plan.h"

namespace centroidkv {
namespace {

// INTERNAL unless `target` holds H * n rows of keys and of values in `dtype` (the most any
// job returns; the service sizes a client's output spans so).
absl::Status CheckRowTarget(const ResultRowTarget& target, const LayerView& layer, DType dtype) {
  const auto rows = static_cast<uint64_t>(layer.num_heads) * static_cast<uint64_t>(layer.num_tokens);
  const auto element = static_cast<uint64_t>(DTypeSize(dtype));
  if (target.keys == nullptr || target.values == nullptr ||
      rows * static_cast<uint64_t>(layer.key_dim) * element > target.key_bytes ||
      rows * static_cast<uint64_t>(layer.value_dim) * element > target.value_bytes) {
    return absl::InternalError(absl::StrCat(
        "the caller's memory for the result rows (", target.key_bytes, " + ", target.value_bytes,
        " bytes) cannot hold ", rows, " rows of keys and values"));
  }
  return absl::OkStatus();
}

// A reused result may hold an earlier job's rounding check and fp8 codes and scales, which
// this job's backend may not write: they must not travel with this job's result.
void ForgetEarlierJob(CompressResult* result) {
  result->key_rounding = CompressResult::RoundingCheck::kNotChecked;
  result->value_rounding = CompressResult::RoundingCheck::kNotChecked;
  result->fp8_keys.clear();
  result->fp8_values.clear();
  result->key_scales.clear();
  result->value_scales.clear();
}

}  // namespace

absl::StatusOr<CompressResult> ClusterEngine::Compress(const LayerView& layer,
                                                       const CompressOptions& options,
                                                       const CompressControl& control) const {
  CompressResult result;
  CKV_RETURN_IF_ERROR(Run(layer, options, control, /*reuse=*/false, &result));
  return result;
}

absl::Status ClusterEngine::CompressInto(const LayerView& layer, const CompressOptions& options,
                                         CompressResult* result,
                                         const CompressControl& control) const {
  return Run(layer, options, control, /*reuse=*/true, result);
}

// validate -> plan the stages -> widen -> backend, split or budgeted heads -> second stage
// -> fit -> account -> round -> reshape -> quantise. A job that asks for none of the stages
// is plan, backend.
absl::Status ClusterEngine::Run(const LayerView& layer, const CompressOptions& options,
                                const CompressControl& control, bool reuse,
                                CompressResult* result) const {
  ForgetEarlierJob(result);
  const EngineCaps caps = this->caps();
  CKV_ASSIGN_OR_RETURN(LayerPlan plan,
                       PlanJob(layer, options, limits_, /*check_data=*/!caps.checks_layer_data));
  StagePlan stages = PlanStages(plan, caps, control.row_target != nullptr);
  // A backend that checks the data itself does so on what it reads: a widened copy or
  // rows the budgeted heads keep without the backend are checked here, on what the caller
  // sent (PlanJob already checked ragged and padded jobs).
  if (caps.checks_layer_data && plan.regular &&
      (stages.widen_fp8_input || stages.budgeted_heads)) {
    CKV_RETURN_IF_ERROR(CheckLayerData(layer));
  }
  if (control.IsCancelled()) return absl::CancelledError("job cancelled before it started");

  // The widened input's scratch leaves the result while the job runs (the stages below may
  // clear it), and goes back only to a result that is reused (CompressInto).
  std::vector<float> scratch = std::move(result->fp8_input_scratch);
  // Only the stages above the backend write these, and a backend that reuses the result's
  // arrays leaves them: a reused result must not keep an earlier fitted or budgeted job's.
  result->log_weights.clear();
  result->head_budgets.clear();
  result->head_exact_entries.clear();
  const LayerView input = stages.widen_fp8_input ? WidenFp8Layer(*this, layer, &scratch) : layer;

  // The stages below the row target see it through the plan only; the regular jobs that
  // split heads and the second stage run write the result's own arrays.
  CompressControl stage_control = control;
  stage_control.row_target = nullptr;
  const auto run_regular = [&](const LayerView& job, const CompressOptions& job_options,
                               CompressResult* out) -> absl::Status {
    CKV_ASSIGN_OR_RETURN(LayerPlan job_plan,
                         PlanJob(job, job_options, limits_, /*check_data=*/false));
    if (stage_control.IsCancelled()) return absl::CancelledError("job cancelled");
    return RunBackend(job_plan, job, stage_control, /*reuse=*/true, out);
  };
  const auto run_body = [&](const StagePlan& body) -> absl::Status {
    LayerPlan backend_plan = plan;
    backend_plan.input_dtype = input.dtype;
    backend_plan.options.result_dtype = body.backend_dtype;
    if (!IsFp8(body.backend_dtype)) {
      backend_plan.options.result_key_scales.clear();
      backend_plan.options.result_value_scales.clear();
    }
    if (body.internal_assignment) backend_plan.options.compute_assignment = true;
    if (body.budgeted_heads) {
      return RunBudgeted(*this, run_regular, backend_plan, input, result);
    }
    if (body.split_heads) return RunRagged(run_regular, backend_plan, input, result);
    if (body.rows_in_place) {
      CKV_RETURN_IF_ERROR(CheckRowTarget(*control.row_target, input, body.backend_dtype));
      backend_plan.row_target = control.row_target;
    }
    return RunBackend(backend_plan, input, stage_control, reuse, result);
  };

  absl::Status status = run_body(stages);
  if (status.ok() && stages.check_target_reached && !HeadsWithinTarget(plan, *result)) {
    stages = PlanStages(plan, caps, control.row_target != nullptr,
                        StageAttempt::kAfterMissedTarget);
    status = run_body(stages);
  }
  if (status.ok() && stages.second_stage) {
    status = ReachExactTarget(run_regular, plan, input, result);
  }
  if (status.ok() && stages.fit) status = FitResult(*this, plan, input, result);
  if (reuse) result->fp8_input_scratch = std::move(scratch);
  CKV_RETURN_IF_ERROR(status);
  if (stages.internal_assignment) result->assignment.clear();

  FillAccount(plan, layer, result);
  if (stages.round_rows) RoundResultRows(options.result_dtype, result);
  if (stages.reshape_rows) CKV_RETURN_IF_ERROR(ShapeRows(options, result));
  if (stages.quantise_fp8) QuantiseResultToFp8(*this, options, control.row_target, result);
  return absl::OkStatus();
}

absl::Status ClusterEngine::RunBackend(const LayerPlan& plan, const LayerView& layer,
                                       const CompressControl& control, bool reuse,
                                       CompressResult* result) const {
  if (reuse) {
    CKV_RETURN_IF_ERROR(CompressReusingImpl(plan, layer, control, result));
  } else {
    CKV_RETURN_IF_ERROR(CompressImpl(plan, layer, control, result));
  }
  FillStopReasons(plan, result->passes_run, /*first_head=*/0, layer.num_heads, result);
  return absl::OkStatus();
}

absl::Status ClusterEngine::CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                                const CompressControl& control,
                                                CompressResult* out) const {
  ClearResult(out);
  return CompressImpl(plan, layer, control, out);
}

void RoundResultRows(DType dtype, CompressResult* result) {
  if (result->dtype == dtype || result->rows_in_target) return;
  auto round = [dtype](std::vector<float>& from, std::vector<uint16_t>& to) {
    to.resize(from.size());
    StoreFromFloats(to.data(), dtype, 0, static_cast<int64_t>(from.size()), from.data());
    from.clear();
  };
  round(result->keys, result->half_keys);
  round(result->values, result->half_values);
  result->dtype = dtype;
}

}  // namespace centroidkv
