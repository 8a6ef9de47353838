// The fast CPU backend: SPEC.md section 2 with oneTBB over heads x chunks and SIMD kernels
// chosen at run time (simd_dispatch.h), taking exactly the reference engine's decisions.
//
// How it stays exact while matching in float32: the O(n * C * d) similarity search runs in
// float32 (soft_match.h) and every decision that float rounding could change is re-taken
// with the reference's float64 cosine (edge_decisions.h); everything O(n * d) (merging,
// rows carried between passes) is float64 in the reference's operation order
// (kernel_table.h). So counts and assignment equal the reference's, and keys and values
// are bit-identical to it.
//
// Parallelism: each pass runs its chunks as oneTBB tasks in the caller's task arena (the
// server runs every job inside one shared arena, so there is no oversubscription). When the
// merges of a pass are known in advance (no similarity floor, and every candidate edge is
// kept) matching and merging a chunk are one task, so its keys are read once; otherwise a
// pass is match, select (per head), merge. Scratch buffers are per thread, grow to the
// largest chunk seen and are reused across chunks and jobs; per-head job state comes from a
// pool (HeadPool), and CompressInto() overwrites the caller's result in place.
//
// Memory: a chunk task checks its input rows for Inf/NaN (EngineCaps::checks_layer_data: no separate
// sweep over the job; in a fused last pass the values are checked in the float rows it
// writes, see LayerJob::RunChunks) and, while its match kernel runs, prefetches the next
// task's rows into L2, so the input is read from memory once and mostly overlapped with
// arithmetic. Result rows go out a few at a time with non-temporal stores (BlockWriter), in
// float32 or already rounded to the options' result_dtype (fp16 / bf16: half the bytes; fp8
// in static scales, a quarter). fp8 input rows are read as they are, widened with their
// scales by the kernels (kernel_table.h's RowBlock).
//
// Thread-safe: Compress() may run concurrently from many threads.
#pragma once

#include <memory>
#include <optional>

#include "centroidkv/kernels/engine.h"
#include "kernels/cpu/simd_dispatch.h"

namespace centroidkv::cpu {

struct CpuEngineOptions {
  // The kernels to use; unset: the best this CPU supports. A level the CPU lacks falls back
  // to the best it has (tests force each level this way).
  std::optional<SimdLevel> simd_level;
  // Tests: match in 16-bit integers at every chunk length where the level has
  // KernelTable::match_int16, also below its int16_min_chunk (the conformance suite forces
  // the int16 path this way; the results are the same either way).
  bool int16_every_chunk = false;
};

class CpuEngine final : public ClusterEngine {
 public:
  explicit CpuEngine(EngineLimits limits = {}, CpuEngineOptions options = {});
  ~CpuEngine() override;

  std::string_view name() const override { return "cpu"; }
  SimdLevel simd_level() const { return level_; }
  // The last pass rounds fp16 / bf16 rows, and fp8 rows in static scales, as it streams
  // them out (BlockWriter); fp8 rows with a dynamic scale are narrowed once each head's
  // largest magnitude is known, which the writers note on the way. fp8 input rows are
  // widened (codes times their scale) inside the kernels, as fp16 rows are: no float32 copy
  // of the input. The result writer streams rows to any memory, a client's shared memory
  // region included. LayerJob checks every input row for Inf / NaN (and the counts) before
  // it uses them. Fitted jobs run in float32 with this level's exp (KernelTable).
  EngineCaps caps() const override {
    return {.writes_half_rows = true, .writes_fp8_rows = true, .reads_fp8_input = true,
            .writes_rows_in_place = true, .checks_layer_data = true,
            .fit_kernels = &fit_kernels_};
  }
  // oneTBB tasks in the caller's arena, like the engine's own.
  void ForEachIndependent(int32_t count, const std::function<void(int32_t)>& fn) const override;

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;
  // Overwrites the arrays of an earlier result in place (see LayerJob::AllocateOutput).
  absl::Status CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                   const CompressControl& control,
                                   CompressResult* out) const override;

 private:
  struct ScratchPool;  // per-thread buffers (oneTBB stays out of this header)

  SimdLevel level_;
  KernelTable kernels_;  // KernelsFor(level_), with int16_min_chunk lowered if asked
  FitKernels fit_kernels_;
  std::unique_ptr<ScratchPool> scratch_;
};

}  // namespace centroidkv::cpu
