// fp8 in and out of a layer job, done above the backends (ClusterEngine::Compress), so that
// every backend gives the same bits: the input widened to float32 with its scales, and a
// float32 result quantised to fp8 with static or per-head dynamic scales.
#pragma once

#include <vector>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/compress_result.h"
#include "centroidkv/types/layer_view.h"

namespace centroidkv {

// `layer` (fp8, its scales checked) as float32: element e of head h becomes
// float(e) x scale(h), one correctly rounded float multiply, into `scratch` (keys, then
// values; grown when too small, never shrunk). The view borrows `scratch` and `layer`'s
// counts and head offsets; it has no scales. A head per task of `engine`
// (ClusterEngine::ForEachIndependent).
LayerView WidenFp8Layer(const ClusterEngine& engine, const LayerView& layer,
                        std::vector<float>* scratch);

// A float32 `result` (any layout, padded or not) in options.result_dtype (fp8): each element
// divided by its head's scale and rounded once, to nearest even, saturating. The scales are
// options.result_key_scales / result_value_scales (one entry, or one per head), or when
// empty each head's largest magnitude / the format's maximum (1 for an all-zero head; never
// below FLT_MIN). The codes go to
// `target` when it is given and holds them (then rows_in_target), else to fp8_keys /
// fp8_values; the float rows are emptied and the scales set.
// A head per task of `engine`.
void QuantiseResultToFp8(const ClusterEngine& engine, const CompressOptions& options,
                         const ResultRowTarget* target, CompressResult* result);

}  // namespace centroidkv
