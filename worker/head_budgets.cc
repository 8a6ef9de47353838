// GlobalHeadBudgets: the protected entries of every head, then one top-k over the rest.
#include "worker/head_budgets.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace centroidkv::worker {

absl::StatusOr<std::vector<std::vector<int32_t>>> GlobalHeadBudgets(
    const std::vector<std::vector<std::vector<double>>>& scores, int64_t total, int32_t sinks,
    int32_t recent, const std::vector<std::vector<int32_t>>& whole) {
  struct Candidate {
    double score;
    int32_t layer, head;
  };
  std::vector<std::vector<int32_t>> budgets(scores.size());
  std::vector<Candidate> rest;  // the entries that compete, in (layer, head, entry) order
  int64_t kept_whole = 0, protected_entries = 0, competing_heads = 0;
  for (size_t layer = 0; layer < scores.size(); ++layer) {
    const std::vector<int32_t>& whole_heads =
        layer < whole.size() ? whole[layer] : std::vector<int32_t>{};
    budgets[layer].assign(scores[layer].size(), 0);
    for (size_t h = 0; h < scores[layer].size(); ++h) {
      const int64_t n = static_cast<int64_t>(scores[layer][h].size());
      if (std::find(whole_heads.begin(), whole_heads.end(), static_cast<int32_t>(h)) !=
          whole_heads.end()) {
        budgets[layer][h] = static_cast<int32_t>(n);
        kept_whole += n;
        continue;
      }
      ++competing_heads;
      const int64_t first_recent = std::max<int64_t>(0, n - recent);
      for (int64_t i = 0; i < n; ++i) {
        if (i < sinks || i >= first_recent) {
          ++budgets[layer][h];
          ++protected_entries;
        } else {
          rest.push_back({scores[layer][h][static_cast<size_t>(i)], static_cast<int32_t>(layer),
                          static_cast<int32_t>(h)});
        }
      }
    }
  }
  if (total < kept_whole) {
    return absl::InvalidArgumentError(absl::StrCat("passthrough_heads: heads kept whole take ",
                                                   kept_whole, " entries, the budget is ",
                                                   total));
  }
  if (total - kept_whole < protected_entries) {
    return absl::InvalidArgumentError(absl::StrCat(
        kept_whole > 0 ? "passthrough_heads" : "target_ratio", ": ", total - kept_whole,
        " entries for ", competing_heads, " heads, below their ", protected_entries,
        " sink and recent entries"));
  }
  const int64_t take =
      std::min<int64_t>(total - kept_whole - protected_entries, static_cast<int64_t>(rest.size()));
  std::vector<size_t> order(rest.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Highest first; stable, so ties stay in (layer, head, entry) order.
  std::stable_sort(order.begin(), order.end(),
                   [&rest](size_t a, size_t b) { return rest[a].score > rest[b].score; });
  for (int64_t k = 0; k < take; ++k) {
    const Candidate& c = rest[order[static_cast<size_t>(k)]];
    ++budgets[static_cast<size_t>(c.layer)][static_cast<size_t>(c.head)];
  }
  return budgets;
}

}  // namespace centroidkv::worker
