// Tests of kernels/stage_plan.h: the stages a job runs, over input and result dtypes x
// ragged x padded x exact_target x output layout x backend capabilities. The table states
// each decision outright; the sweep checks the rules every plan must keep.
#include "kernels/stage_plan.h"

#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv {
namespace {

constexpr DType kF32 = DType::kFloat32;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kBF16 = DType::kBFloat16;
constexpr DType kE4M3 = DType::kFp8E4M3;
constexpr DType kE5M2 = DType::kFp8E5M2;

// The capabilities of the backends built here (kernels/*: caps()).
const EngineCaps kReferenceCaps{};
const EngineCaps kCpuCaps{.writes_half_rows = true, .writes_fp8_rows = true,
                          .reads_fp8_input = true, .writes_rows_in_place = true,
                          .checks_layer_data = true};
const EngineCaps kCudaCaps{.writes_half_rows = true};
const EngineCaps kIdentityCaps{.writes_half_rows = true, .writes_rows_in_place = true};

struct Job {
  DType in = kF32;
  DType out = kF32;
  bool ragged = false;         // ragged or count-0-padded heads: not regular
  bool padded_out = false;     // pad_heads
  bool token_major = false;    // output_layout
  bool exact_target = false;
  bool floor = false;          // a similarity floor: the passes may stop short of t
  bool budgeted = false;       // head_budgets or scores
  bool fitted = false;         // reference queries
  bool assignment = true;      // compute_assignment
};

// Two heads of 64 entries, t = 16, chunks of 8, nothing protected: without a floor the
// passes reach t on their own (64 -> 32 -> 16).
LayerPlan PlanOf(const Job& job) {
  LayerPlan plan;
  plan.target_length = 16;
  plan.passthrough = {false, false};
  plan.compressed_heads = 2;
  plan.head_lengths = {64, 64};
  plan.regular = !job.ragged;
  plan.input_dtype = job.in;
  plan.options.target_tokens = 16;
  plan.options.chunk_size = 8;
  plan.options.sink_tokens = 0;
  plan.options.recent_tokens = 0;
  if (job.floor) plan.options.min_similarity = 0.5;
  plan.options.result_dtype = job.out;
  plan.options.exact_target = job.exact_target;
  plan.options.pad_heads = job.padded_out;
  plan.options.output_layout = job.token_major ? TensorLayout::kTokenMajor
                                               : TensorLayout::kHeadMajor;
  plan.options.compute_assignment = job.assignment;
  if (job.budgeted) plan.head_budgets = {16, 16};
  plan.scored = job.budgeted;
  plan.fitted = job.fitted;
  return plan;
}

std::string Describe(const StagePlan& s) {
  return std::string("widen=") + (s.widen_fp8_input ? "1" : "0") +
         " split=" + (s.split_heads ? "1" : "0") +
         " budgeted=" + (s.budgeted_heads ? "1" : "0") +
         " fit=" + (s.fit ? "1" : "0") +
         " internal_assignment=" + (s.internal_assignment ? "1" : "0") +
         " backend=" + std::string(DTypeName(s.backend_dtype)) +
         " in_place=" + (s.rows_in_place ? "1" : "0") +
         " second=" + (s.second_stage ? "1" : "0") +
         " check=" + (s.check_target_reached ? "1" : "0") +
         " round=" + (s.round_rows ? "1" : "0") +
         " reshape=" + (s.reshape_rows ? "1" : "0") +
         " quantise=" + (s.quantise_fp8 ? "1" : "0");
}

struct Row {
  const char* name;
  Job job;
  EngineCaps caps;
  bool row_target;
  StagePlan want;
};

void PrintTo(const Row& row, std::ostream* os) { *os << row.name; }

class StagePlanTableTest : public ::testing::TestWithParam<Row> {};

TEST_P(StagePlanTableTest, DecidesEveryStage) {
  const Row& row = GetParam();
  const StagePlan got = PlanStages(PlanOf(row.job), row.caps, row.row_target);
  EXPECT_EQ(got, row.want) << "got  " << Describe(got) << "\nwant " << Describe(row.want);
}

// Shorthands for the expected plans.
StagePlan Backend(DType dtype) { return {.backend_dtype = dtype}; }

INSTANTIATE_TEST_SUITE_P(
    Table, StagePlanTableTest,
    ::testing::Values(
        // A plain job: the backend alone, in the result dtype where it writes it.
        Row{"plain_f32_reference", {}, kReferenceCaps, false, Backend(kF32)},
        Row{"plain_f16_cpu", {.out = kF16}, kCpuCaps, false, Backend(kF16)},
        Row{"plain_f16_reference_rounds_above", {.out = kF16}, kReferenceCaps, false,
            {.backend_dtype = kF32, .round_rows = true}},
        Row{"plain_bf16_cuda", {.in = kF16, .out = kBF16}, kCudaCaps, false, Backend(kBF16)},
        // Rows into the caller's memory only where the backend writes them there as they end.
        Row{"in_place_cpu", {.out = kF16}, kCpuCaps, true,
            {.backend_dtype = kF16, .rows_in_place = true}},
        Row{"in_place_identity", {.out = kBF16}, kIdentityCaps, true,
            {.backend_dtype = kBF16, .rows_in_place = true}},
        Row{"no_in_place_reference", {}, kReferenceCaps, true, Backend(kF32)},
        Row{"no_in_place_when_padded", {.out = kF16, .padded_out = true}, kCpuCaps, true,
            {.backend_dtype = kF16, .reshape_rows = true}},
        Row{"no_in_place_token_major", {.token_major = true}, kIdentityCaps, true,
            {.backend_dtype = kF32, .reshape_rows = true}},
        // Ragged or padded input: regular jobs above the backend, float32 rows, rounded once.
        Row{"ragged_f16_cpu", {.out = kF16, .ragged = true}, kCpuCaps, true,
            {.split_heads = true, .backend_dtype = kF32, .round_rows = true}},
        Row{"ragged_f32_reference", {.ragged = true}, kReferenceCaps, false,
            {.split_heads = true, .backend_dtype = kF32}},
        // exact_target: plain where the passes reach t, the second stage where they may not.
        Row{"exact_reaches_t_cpu", {.out = kF16, .exact_target = true}, kCpuCaps, true,
            {.backend_dtype = kF16, .rows_in_place = true, .check_target_reached = true}},
        Row{"exact_with_floor_cpu", {.out = kF16, .exact_target = true, .floor = true}, kCpuCaps,
            true, {.backend_dtype = kF32, .second_stage = true, .round_rows = true}},
        Row{"exact_ragged_cpu", {.out = kF16, .ragged = true, .exact_target = true}, kCpuCaps,
            false,
            {.split_heads = true, .backend_dtype = kF32, .second_stage = true,
             .round_rows = true}},
        // fp8 in: read by the cpu backend, widened above for the others and for split heads.
        Row{"fp8_in_cpu", {.in = kE4M3, .out = kF16}, kCpuCaps, false, Backend(kF16)},
        Row{"fp8_in_reference", {.in = kE5M2}, kReferenceCaps, false,
            {.widen_fp8_input = true, .backend_dtype = kF32}},
        Row{"fp8_in_ragged_cpu", {.in = kE4M3, .ragged = true}, kCpuCaps, false,
            {.widen_fp8_input = true, .split_heads = true, .backend_dtype = kF32}},
        Row{"fp8_in_cuda_f16_out", {.in = kE4M3, .out = kF16}, kCudaCaps, false,
            {.widen_fp8_input = true, .backend_dtype = kF16}},
        // fp8 out: written by the cpu backend (in place too), quantised above otherwise.
        Row{"fp8_out_cpu", {.out = kE4M3}, kCpuCaps, true,
            {.backend_dtype = kE4M3, .rows_in_place = true}},
        Row{"fp8_out_reference", {.out = kE4M3}, kReferenceCaps, true,
            {.backend_dtype = kF32, .quantise_fp8 = true}},
        Row{"fp8_out_cuda", {.in = kF16, .out = kE5M2}, kCudaCaps, true,
            {.backend_dtype = kF32, .quantise_fp8 = true}},
        Row{"fp8_out_padded_cpu", {.out = kE4M3, .padded_out = true}, kCpuCaps, true,
            {.backend_dtype = kF32, .reshape_rows = true, .quantise_fp8 = true}},
        Row{"fp8_out_exact_cpu", {.out = kE4M3, .exact_target = true}, kCpuCaps, true,
            {.backend_dtype = kF32, .check_target_reached = true, .quantise_fp8 = true}},
        Row{"fp8_in_out_ragged_cpu", {.in = kE4M3, .out = kE4M3, .ragged = true}, kCpuCaps, true,
            {.widen_fp8_input = true, .split_heads = true, .backend_dtype = kF32,
             .quantise_fp8 = true}},
        Row{"fp8_in_out_cpu_token_major", {.in = kE5M2, .out = kE5M2, .token_major = true},
            kCpuCaps, false,
            {.backend_dtype = kF32, .reshape_rows = true, .quantise_fp8 = true}},
        // Budgeted heads: each head its own job above the backend, ragged ones included,
        // float32 rows gathered there (fp8 widened), exact_target's stages not needed.
        Row{"budgeted_f16_cpu", {.out = kF16, .budgeted = true}, kCpuCaps, true,
            {.budgeted_heads = true, .backend_dtype = kF32, .round_rows = true}},
        Row{"budgeted_ragged_exact_fp8_cpu",
            {.in = kE4M3, .out = kE4M3, .ragged = true, .exact_target = true, .budgeted = true,
             .assignment = false},
            kCpuCaps, true,
            {.widen_fp8_input = true, .budgeted_heads = true, .backend_dtype = kF32,
             .internal_assignment = true, .quantise_fp8 = true}},
        // Fitted: the fit on the float32 rows, the assignment kept for it.
        Row{"fitted_cpu", {.out = kF16, .fitted = true, .assignment = false}, kCpuCaps, true,
            {.backend_dtype = kF32, .fit = true, .internal_assignment = true,
             .round_rows = true}},
        Row{"fitted_exact_reference", {.exact_target = true, .floor = true, .fitted = true},
            kReferenceCaps, false,
            {.backend_dtype = kF32, .second_stage = true, .fit = true}},
        Row{"fitted_budgeted_token_major", {.token_major = true, .budgeted = true,
                                            .fitted = true},
            kCudaCaps, false,
            {.budgeted_heads = true, .backend_dtype = kF32, .fit = true,
             .reshape_rows = true}}),
    [](const ::testing::TestParamInfo<Row>& info) { return std::string(info.param.name); });

TEST(StagePlanTest, MissedTargetRunsTheSecondStage) {
  const LayerPlan plan = PlanOf({.out = kF16, .exact_target = true});
  const StagePlan first = PlanStages(plan, kCpuCaps, true);
  ASSERT_TRUE(first.check_target_reached);
  const StagePlan again = PlanStages(plan, kCpuCaps, true, StageAttempt::kAfterMissedTarget);
  EXPECT_EQ(again, (StagePlan{.backend_dtype = kF32, .second_stage = true, .round_rows = true}))
      << Describe(again);
}

// The rules every plan keeps, over every combination.
TEST(StagePlanTest, EveryCombinationKeepsTheRules) {
  const std::vector<DType> dtypes = {kF32, kF16, kBF16, kE4M3, kE5M2};
  const std::vector<EngineCaps> all_caps = {kReferenceCaps, kCpuCaps, kCudaCaps, kIdentityCaps};
  int plans = 0;
  for (DType in : dtypes) {
    for (DType out : dtypes) {
      for (int bits = 0; bits < 32; ++bits) {
      for (int extra = 0; extra < 4; ++extra) {
        const Job job{.in = in, .out = out, .ragged = (bits & 1) != 0,
                      .padded_out = (bits & 2) != 0, .token_major = (bits & 4) != 0,
                      .exact_target = (bits & 8) != 0, .floor = (bits & 16) != 0,
                      .budgeted = (extra & 1) != 0, .fitted = (extra & 2) != 0};
        for (const EngineCaps& caps : all_caps) {
          for (bool row_target : {false, true}) {
            const StagePlan s = PlanStages(PlanOf(job), caps, row_target);
            SCOPED_TRACE(Describe(s));
            ++plans;
            // The backend is only asked for what it writes and never reads what it cannot.
            EXPECT_TRUE(caps.WritesResultDType(s.backend_dtype));
            EXPECT_EQ(s.widen_fp8_input,
                      IsFp8(in) && (!caps.ReadsInputDType(in) || job.ragged || job.budgeted));
            // Split heads, budgeted heads, the second stage and the fit work on float32 rows.
            if (s.split_heads || s.budgeted_heads || s.second_stage || s.fit) {
              EXPECT_EQ(s.backend_dtype, kF32);
            }
            // The rows end in the result dtype: written so, rounded, or quantised.
            const DType ends = s.quantise_fp8 ? out : s.round_rows ? out : s.backend_dtype;
            EXPECT_EQ(ends, out);
            EXPECT_EQ(s.quantise_fp8, IsFp8(out) && s.backend_dtype != out);
            EXPECT_FALSE(s.round_rows && IsFp8(out));
            // Rows in place only when nothing moves them afterwards.
            if (s.rows_in_place) {
              EXPECT_TRUE(row_target && caps.writes_rows_in_place);
              EXPECT_FALSE(s.split_heads || s.second_stage || s.reshape_rows || s.round_rows ||
                           s.quantise_fp8);
            }
            EXPECT_EQ(s.reshape_rows, job.padded_out || job.token_major);
            // exact_target has one of its two stages (budgeted heads need neither); other
            // jobs neither.
            EXPECT_EQ(s.second_stage || s.check_target_reached,
                      job.exact_target && !job.budgeted);
            EXPECT_EQ(s.budgeted_heads, job.budgeted);
            EXPECT_FALSE(s.budgeted_heads && s.split_heads);
            EXPECT_EQ(s.fit, job.fitted);
            EXPECT_FALSE(s.second_stage && s.check_target_reached);
            if (s.check_target_reached) {
              EXPECT_FALSE(job.ragged || job.floor);
            }
          }
        }
      }
      }
    }
  }
  EXPECT_EQ(plans, 5 * 5 * 32 * 4 * 4 * 2);
}

}  // namespace
}  // namespace centroidkv
