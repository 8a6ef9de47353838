// Which of the engine's stages a job runs, decided once, from the job's plan and what its
// backend does itself (EngineCaps): the one place these decisions are made. PlanStages is
// pure; ClusterEngine::Run (engine.cc) executes its answer in a straight line:
//
//   validate -> widen fp8 input -> backend, the ragged split into regular jobs, or the
//   budgeted heads (scored selection and tail centroids) -> exact_target's second stage ->
//   fit log-weights and values -> account -> round to fp16 / bf16 -> pad / token-major ->
//   quantise to fp8
//
// Every stage above the backend works on float32 rows and rounds once at the end, so a job
// gives the same bits on every backend. Internal to kernels/.
#pragma once

#include "centroidkv/kernels/engine.h"

namespace centroidkv {

struct StagePlan {
  // fp8 input codes x scales widened to a float32 copy before the backend (kernels/fp8_rows.h):
  // the backend does not read fp8, or the heads are regrouped above it.
  bool widen_fp8_input = false;
  // Ragged or count-0-padded heads run as regular jobs and stitched back (RunRagged).
  bool split_heads = false;
  // Each head brought to its own budget (RunBudgeted: with scores, the top-scored entries
  // kept exact and the tail clustered among itself), instead of the backend on the job.
  bool budgeted_heads = false;
  // The element type the backend is asked to write its rows in.
  DType backend_dtype = DType::kFloat32;
  // The backend writes its rows into the caller's memory (CompressControl::row_target).
  bool rows_in_place = false;
  // exact_target's second stage on the heads still above t (ReachExactTarget).
  bool second_stage = false;
  // exact_target whose passes reach t on their own (PassesReachTarget) runs as a plain job;
  // should a head still end above t, it runs again with the plan for kAfterMissedTarget.
  bool check_target_reached = false;
  // Log-weights (and merged rows' values) fitted to the reference queries (FitResult).
  bool fit = false;
  // The stages need the assignment though the caller did not ask for it: computed, then
  // dropped from the result.
  bool internal_assignment = false;
  // The float32 rows rounded to the result's fp16 / bf16 (RoundResultRows).
  bool round_rows = false;
  // Rows padded to equal lengths or laid out token-major (ShapeRows).
  bool reshape_rows = false;
  // The float32 rows quantised to the result's fp8 dtype, last (QuantiseResultToFp8), into
  // the caller's memory where it holds them.
  bool quantise_fp8 = false;

  bool operator==(const StagePlan&) const = default;
};

enum class StageAttempt {
  kFirst,
  // An exact_target job ran plain (check_target_reached) and a head ended above t.
  kAfterMissedTarget,
};

// `plan` is the job's validated plan (its options as the caller gave them); `has_row_target`:
// the caller offered memory for the rows (CompressControl::row_target).
StagePlan PlanStages(const LayerPlan& plan, const EngineCaps& caps, bool has_row_target,
                     StageAttempt attempt = StageAttempt::kFirst);

}  // namespace centroidkv
