// Agreement of an engine with the reference engine on one job, for the conformance suite
// (engine_conformance_test.cc). A backend that searches in float32 may take a different
// decision than the float64 reference where two scores are within float rounding of each
// other; such a divergence is allowed, but never silently: it is traced back to the decision
// that caused it, checked to be a genuine near tie of the reference's own float64 scores, and
// reported. Anything else fails. (The CPU engine re-decides near ties in float64, so it never
// diverges; the check keeps holding backends to the same standard.)
// Thread-compatible: plain functions that run engines and EXPECT.
#pragma once

#include <cstdint>
#include <string>

#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

// Two float64 scores within this of each other (or of the floor) are a near tie: twice the
// rounding error of a float32 cosine over key_dim elements, (key_dim + 8) * 2^-23 each, plus
// 1e-6 for the float32 rounding of rows carried between passes (the analysis of a later pass
// starts from the reference's float32 output).
double NearTieTolerance(int32_t key_dim);

struct Agreement {
  int32_t divergent_pass = -1;  // the first pass whose decisions differ; -1: none
  int32_t near_ties = 0;        // differing decisions explained as near ties in that pass
  std::string explanation;      // one line per explained decision (a few at most)
};

// Runs `engine` and `reference` on the job. When counts and assignment agree: EXPECTs the
// same offsets, counts, assignment and passes_run, and keys and values within rel_tolerance
// (test::ExpectResultsNear). When they do not: finds the first diverging pass (reruns with
// max_passes = 1, 2, ...), EXPECTs everything before it to agree as above, and EXPECTs every
// row whose merge differs in that pass to be explained by a near tie of the reference's scores
// (recomputed here in float64 from the state before the pass):
//   - both merged it, into different destinations whose scores are within the tolerance of
//     the row's best score (argmax tie);
//   - one merged it, and its best edge scores within the tolerance of the pass's floor
//     (candidate tie) or of the last edge the reference kept in that head (top-r tie);
//   - a head merged a different number of edges, and some best edge of the layer scores
//     within the tolerance of the floor (the candidate counts, hence r, differ).
// Explained divergences are printed and recorded as test properties.
Agreement ExpectAgreesWithReference(const ClusterEngine& engine, const ClusterEngine& reference,
                                    const LayerView& layer, const CompressOptions& options,
                                    double rel_tolerance);

}  // namespace centroidkv::test
