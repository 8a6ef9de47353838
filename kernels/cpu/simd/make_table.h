// The kernel table of one vector traits class, from the templates of soft_match_simd.h and
// merge_simd.h. Internal linkage (see vec_avx512.h).
#pragma once

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/rows_finite.h"
#include "kernels/cpu/simd/exp_simd.h"
#include "kernels/cpu/simd/merge_simd.h"
#include "kernels/cpu/simd/soft_match_simd.h"

namespace centroidkv::cpu {
namespace {  // NOLINT(build/namespaces): one copy per SIMD translation unit, by design

template <class V>
constexpr KernelTable MakeKernelTable() {
  return KernelTable{V::kName,
                     V::kW,
                     V::kRowBlock,
                     WidenRows<V>,
                     PackPanels<V>,
                     MatchRows<V>,
                     ScoreRow<V>,
                     MergeRow<V, float>,
                     MergeRow<V, double>,
                     ConvertRow<V, float>,
                     ConvertRow<V, double>,
                     ConvertRows<V>,
                     RowsFinite,
                     V::StreamFloats,
                     V::StreamHalves,
                     nullptr,
                     nullptr,
                     0,
                     AddMax<V>,
                     ExpSubSum<V>};
}

}  // namespace
}  // namespace centroidkv::cpu
