// The stage decisions of one job (stage_plan.h).
#include "kernels/stage_plan.h"

#include "kernels/ragged_layer.h"
#include "kernels/result_shape.h"

namespace centroidkv {

StagePlan PlanStages(const LayerPlan& plan, const EngineCaps& caps, bool has_row_target,
                     StageAttempt attempt) {
  const CompressOptions& options = plan.options;
  const DType result = options.result_dtype;
  StagePlan stages;
  // Budgeted heads are each their own job (ragged ones included); they reach their budget
  // without exact_target's stages.
  stages.budgeted_heads = plan.budgeted();
  stages.split_heads = !plan.regular && !stages.budgeted_heads;
  stages.fit = plan.fitted;
  stages.internal_assignment = (stages.fit || stages.budgeted_heads) && !options.compute_assignment;
  stages.reshape_rows = ReshapesRows(options);
  // Budgeted heads gather their rows above the backend, in float32.
  stages.widen_fp8_input = IsFp8(plan.input_dtype) &&
                           (!caps.ReadsInputDType(plan.input_dtype) || stages.split_heads ||
                            stages.budgeted_heads);
  const bool exact_target = options.exact_target && !stages.budgeted_heads;
  stages.check_target_reached = exact_target && plan.regular && attempt == StageAttempt::kFirst &&
                                PassesReachTarget(plan);
  stages.second_stage = exact_target && !stages.check_target_reached;
  // Split heads, budgeted heads, the second stage and the fit work on float32 rows.
  const bool staged = stages.split_heads || stages.budgeted_heads || stages.second_stage ||
                      stages.fit;
  // fp8 rows are written by the backend only where nothing above it works on its rows.
  stages.quantise_fp8 = IsFp8(result) &&
                        (!caps.WritesResultDType(result) || stages.reshape_rows ||
                         options.exact_target || staged || stages.widen_fp8_input);
  // The rows the stages before rounding and quantising end with.
  const DType rows = stages.quantise_fp8 ? DType::kFloat32 : result;
  stages.backend_dtype =
      !staged && caps.WritesResultDType(rows) ? rows : DType::kFloat32;
  stages.round_rows = rows != stages.backend_dtype;
  stages.rows_in_place = has_row_target && caps.writes_rows_in_place && !staged &&
                         !stages.reshape_rows && !stages.quantise_fp8 &&
                         stages.backend_dtype == result;
  return stages;
}

}  // namespace centroidkv
