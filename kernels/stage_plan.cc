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
  stages.split_heads = !plan.regular;
  stages.reshape_rows = ReshapesRows(options);
  stages.widen_fp8_input =
      IsFp8(plan.input_dtype) && (!caps.ReadsInputDType(plan.input_dtype) || stages.split_heads);
  // fp8 rows are written by the backend only where nothing above it works on its rows.
  stages.quantise_fp8 = IsFp8(result) &&
                        (!caps.WritesResultDType(result) || stages.reshape_rows ||
                         options.exact_target || stages.split_heads || stages.widen_fp8_input);
  // The rows the stages before rounding and quantising end with.
  const DType rows = stages.quantise_fp8 ? DType::kFloat32 : result;
  stages.check_target_reached = options.exact_target && plan.regular &&
                                attempt == StageAttempt::kFirst && PassesReachTarget(plan);
  stages.second_stage = options.exact_target && !stages.check_target_reached;
  // Split heads and the second stage work on float32 rows.
  const bool staged = stages.split_heads || stages.second_stage;
  stages.backend_dtype =
      !staged && caps.WritesResultDType(rows) ? rows : DType::kFloat32;
  stages.round_rows = rows != stages.backend_dtype;
  stages.rows_in_place = has_row_target && caps.writes_rows_in_place && !staged &&
                         !stages.reshape_rows && !stages.quantise_fp8 &&
                         stages.backend_dtype == result;
  return stages;
}

}  // namespace centroidkv
