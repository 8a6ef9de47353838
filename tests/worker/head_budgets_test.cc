// Tests of worker/head_budgets.cc: the global budget over layers x heads on the cases that
// tests/python/test_scored_press.py gives the Python twin (centroidkv.budgets), so that both
// allocate alike, and the budgets that cannot be met name the option.
#include "worker/head_budgets.h"

#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

int64_t Sum(const std::vector<std::vector<int32_t>>& budgets) {
  int64_t total = 0;
  for (const std::vector<int32_t>& layer : budgets) {
    total += std::accumulate(layer.begin(), layer.end(), int64_t{0});
  }
  return total;
}

const std::vector<std::vector<std::vector<double>>> kScores = {
    {{9.0, 1.0, 1.0, 8.0}, {0.0, 0.0, 0.0, 0.0}},
    {{5.0, 6.0, 7.0, 0.5}, {3.0, 2.0, 9.5, 1.0}}};

TEST(GlobalHeadBudgetsTest, TakeTheBestEntriesOverAllHeads) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> budgets =
      GlobalHeadBudgets(kScores, 5, /*sinks=*/0, /*recent=*/0);
  ASSERT_TRUE(budgets.ok()) << budgets.status();
  EXPECT_EQ(*budgets, (std::vector<std::vector<int32_t>>{{2, 0}, {2, 1}}));
}

TEST(GlobalHeadBudgetsTest, SinksFirstAndWholeHeadsOutOfTheCompetition) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> budgets =
      GlobalHeadBudgets(kScores, 9, /*sinks=*/1, /*recent=*/0, {{}, {1}});
  ASSERT_TRUE(budgets.ok()) << budgets.status();
  EXPECT_EQ((*budgets)[1][1], 4);
  for (const std::vector<int32_t>& layer : *budgets) {
    for (int32_t b : layer) EXPECT_GE(b, 1);
  }
  EXPECT_EQ(Sum(*budgets), 9);
  // Ties go to the earlier layer, head and entry: all-equal scores fill layer 0 first.
  const std::vector<std::vector<std::vector<double>>> flat(2, {{1, 1, 1, 1}, {1, 1, 1, 1}});
  budgets = GlobalHeadBudgets(flat, 6, 0, 0);
  ASSERT_TRUE(budgets.ok());
  EXPECT_EQ(*budgets, (std::vector<std::vector<int32_t>>{{4, 2}, {0, 0}}));
}

TEST(GlobalHeadBudgetsTest, BudgetsThatCannotBeMetNameTheOption) {
  const std::vector<std::vector<std::vector<double>>> ones(3, {std::vector<double>(10, 1.0),
                                                             std::vector<double>(10, 1.0)});
  absl::Status whole = GlobalHeadBudgets(ones, 15, 0, 0, {{0, 1}}).status();
  EXPECT_EQ(whole.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(whole.message().find("passthrough_heads"), std::string::npos) << whole;
  absl::Status protected_entries = GlobalHeadBudgets(ones, 10, 2, 1).status();  // 6 x 3 = 18
  EXPECT_EQ(protected_entries.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(protected_entries.message().find("target_ratio"), std::string::npos)
      << protected_entries;
  EXPECT_NE(protected_entries.message().find("18"), std::string::npos) << protected_entries;
}

}  // namespace
}  // namespace centroidkv::worker
