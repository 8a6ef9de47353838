// One budget over every layer and head (docs/scored-jobs.md, "Budgets"), as KVzip allocates
// it: how many entries each head keeps when the whole cache must fit in `total` entries,
// everything counted (heads kept whole, sinks, recent entries, exact entries, centroids).
// The C++ twin of the Python package's centroidkv.budgets.global_budgets: one top-k over all
// layers x heads x entries of the importance scores, every head's sink and recent entries
// first, heads kept whole out of the competition; ties go to the earlier layer, head and
// entry. tests/worker/head_budgets_test.cc checks it on the Python tests' cases.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace centroidkv::worker {

// scores[layer][head][entry] (higher kept first); whole[layer]: the heads of that layer kept
// whole (layers past its end keep none whole). Returns budgets[layer][head]. InvalidArgument
// naming the option that makes the budget impossible: `passthrough_heads` when the heads
// kept whole alone exceed it, else `target_ratio` when the sink and recent entries do.
absl::StatusOr<std::vector<std::vector<int32_t>>> GlobalHeadBudgets(
    const std::vector<std::vector<std::vector<double>>>& scores, int64_t total, int32_t sinks,
    int32_t recent, const std::vector<std::vector<int32_t>>& whole = {});

}  // namespace centroidkv::worker
