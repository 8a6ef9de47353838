// Budgeted jobs, above every backend (docs/scored-jobs.md): each head brought to at most its
// own budget (LayerPlan::head_budgets), every kept row counted in it.
//  - Without scores: the head is its own SPEC job with t = its budget, then exact_target's
//    second stage where the passes stop short of it.
//  - With scores (LayerView::scores): the head's sink and recent entries and, of the
//    entries between them, the e top-scored (ties: the earlier entry) stay exact, counts
//    unchanged; the rest, the tail, is clustered among itself into c count-weighted centroids
//    with the SPEC's chunked soft matching (nothing protected, floor as asked, then the
//    second stage), so nothing is ever merged into a kept entry. c is centroid_share of the
//    budget after the sink and recent entries, e the rest; a head whose centroids would each
//    stand for more than max_cluster_size entries on average keeps all of it exact. With
//    c = 0 the tail is dropped (assignment -1): score top-k eviction.
// The rows of a head are ordered by the position of each row's earliest entry. Since the
// backends cluster the tails and every other step is shared, every backend gives the same
// bits. Internal to kernels/ (ClusterEngine::Compress). Thread-safe like the engine.
#pragma once

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"
#include "kernels/ragged_layer.h"

namespace centroidkv {

// `plan` is of the whole validated layer (budgeted()); `layer` holds float32 rows (an fp8
// input is widened before). `out` gets a float32, head-major, unpadded result with its
// stop reasons, head_budgets, head_exact_entries and the assignment. The heads run as
// tasks of `engine` (ForEachIndependent).
absl::Status RunBudgeted(const ClusterEngine& engine, RegularJobRunner run,
                         const LayerPlan& plan, const LayerView& layer, CompressResult* out);

}  // namespace centroidkv
