// Builds the set of engines. Only this file knows which backends were compiled in.
#include "centroidkv/kernels/engine_factory.h"

#include "kernels/cpu/cpu_engine.h"
#include "kernels/identity/identity_engine.h"
#include "kernels/reference/reference_engine.h"

#ifdef CKV_HAVE_CUDA
#include "centroidkv/kernels/cuda/cuda_engine.h"
#endif

namespace centroidkv {

std::unique_ptr<EngineSet> EngineSet::CreateAvailable(const EngineLimits& limits) {
  std::unique_ptr<EngineSet> set(new EngineSet(limits));
  set->reference_ = std::make_unique<ReferenceEngine>(limits);
  // Measurement only (the transport floor); never what auto or cpu select.
  set->identity_ = std::make_unique<IdentityEngine>(limits);
  // The fast CPU backend (its kernels for the best SIMD level this CPU has).
  set->cpu_ = std::make_unique<cpu::CpuEngine>(limits);
#ifdef CKV_HAVE_CUDA
  // The first CUDA device, when there is one the driver lets us use.
  absl::StatusOr<std::unique_ptr<cuda::CudaEngine>> cuda = cuda::CudaEngine::Create(limits);
  if (cuda.ok()) {
    set->devices_.push_back((*cuda)->device());
    set->cuda_ = *std::move(cuda);
  } else {
    set->cuda_missing_ = std::string(cuda.status().message());
  }
#else
  set->cuda_missing_ = "this server was built without CUDA";
#endif
  return set;
}

absl::StatusOr<const ClusterEngine*> EngineSet::Select(BackendKind kind) const {
  switch (kind) {
    case BackendKind::kAuto:
      if (cuda_ != nullptr) return cuda_.get();
      return cpu_.get();
    case BackendKind::kCpu:
      return cpu_.get();
    case BackendKind::kReference:
      return reference_.get();
    case BackendKind::kIdentity:
      return identity_.get();
    case BackendKind::kCuda:
      if (cuda_ == nullptr) {
        return absl::FailedPreconditionError(
            "backend: gpu was requested but this server has no GPU backend (" + cuda_missing_ +
            "); use backend auto or cpu");
      }
      return cuda_.get();
  }
  return absl::InvalidArgumentError("backend: unknown backend kind");
}

std::vector<std::string> EngineSet::EngineNames() const {
  std::vector<std::string> names;
  names.emplace_back(reference_->name());
  names.emplace_back(cpu_->name());
  if (cuda_ != nullptr) names.emplace_back(cuda_->name());
  names.emplace_back(identity_->name());
  return names;
}

}  // namespace centroidkv
