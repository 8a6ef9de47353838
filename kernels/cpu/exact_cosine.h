// The reference engine's cosine similarity, bit for bit: dot, |x|^2 and |y|^2 accumulated in
// one loop over j = 0 .. dim-1 in float64 (separate products and sums, no FMA: this target
// compiles with -ffp-contract=off), then dot / (max(sqrt, 1e-6) * max(sqrt, 1e-6)).
// The CPU engine computes it only where the float32 scores cannot decide (edge_decisions.h).
// Thread-safe: a pure function.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

// cos(row a, row b) of `rows`, each `dim` elements widened exactly to double.
double ExactCosine(const RowBlock& rows, int64_t a, int64_t b, int32_t dim);

// The same cosine of rows already widened to double: x against each of ys[0 .. count-1]
// into out[k]. The pairs' loops run interleaved (independent accumulators, so the additions'
// latency overlaps); each result is bit for bit the reference's.
void CosinesOfWidened(const double* x, const double* const* ys, int32_t count, int32_t dim,
                      double* out);

}  // namespace centroidkv::cpu
