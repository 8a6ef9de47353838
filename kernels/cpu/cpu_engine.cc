#include "kernels/cpu/cpu_engine.h"

#include <tbb/parallel_for.h>

#include "kernels/cpu/layer_job.h"

namespace centroidkv::cpu {
namespace {

SimdLevel ChooseLevel(const CpuEngineOptions& options) {
  const SimdLevel best = DetectSimdLevel();
  if (!options.simd_level.has_value()) return best;
  return SimdLevelSupported(*options.simd_level) ? *options.simd_level : best;
}

KernelTable ChooseKernels(SimdLevel level, const CpuEngineOptions& options) {
  KernelTable kernels = KernelsFor(level);
  if (options.int16_every_chunk && kernels.match_int16 != nullptr) kernels.int16_min_chunk = 2;
  return kernels;
}

}  // namespace

struct CpuEngine::ScratchPool {
  cpu::ScratchPool per_thread;
  HeadPool heads;
};

CpuEngine::CpuEngine(EngineLimits limits, CpuEngineOptions options)
    : ClusterEngine(limits),
      level_(ChooseLevel(options)),
      kernels_(ChooseKernels(level_, options)),
      fit_kernels_{.add_max = kernels_.fit_add_max, .exp_sub_sum = kernels_.fit_exp_sub_sum},
      scratch_(std::make_unique<ScratchPool>()) {}

CpuEngine::~CpuEngine() = default;

void CpuEngine::ForEachIndependent(int32_t count,
                                   const std::function<void(int32_t)>& fn) const {
  tbb::parallel_for(int32_t{0}, count, [&fn](int32_t i) { fn(i); });
}

absl::Status CpuEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                     const CompressControl& control, CompressResult* out) const {
  LayerJob job(kernels_, &scratch_->per_thread, plan, layer, control, out, &scratch_->heads);
  return job.Run();
}

absl::Status CpuEngine::CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                            const CompressControl& control,
                                            CompressResult* out) const {
  // LayerJob sizes every array of `out` and writes each of its elements.
  return CompressImpl(plan, layer, control, out);
}

}  // namespace centroidkv::cpu
