// Which backends this build and machine offer, and the choice among them per request
// (ggml's "ask, then fall back": auto takes the GPU when one is present, else the CPU).
// Thread-safe after construction: Select() only reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"
#include "centroidkv/types/kinds.h"

namespace centroidkv {

class EngineSet {
 public:
  // Creates every backend this build supports and this machine can run.
  static std::unique_ptr<EngineSet> CreateAvailable(const EngineLimits& limits = {});

  // The engine that serves `kind`, or FailedPrecondition when this server has none.
  absl::StatusOr<const ClusterEngine*> Select(BackendKind kind) const;

  // Names of the engines held, e.g. {"reference", "cpu", "identity"} (plus "cuda:0" where
  // a CUDA device is used).
  std::vector<std::string> EngineNames() const;
  // The accelerators the engines run on (GetInfo lists them); empty without a GPU backend.
  const std::vector<DeviceInfo>& Devices() const { return devices_; }
  const EngineLimits& limits() const { return limits_; }

 private:
  explicit EngineSet(const EngineLimits& limits) : limits_(limits) {}

  EngineLimits limits_;
  std::unique_ptr<ClusterEngine> reference_;
  std::unique_ptr<ClusterEngine> identity_;  // measurement only, never auto/cpu
  std::unique_ptr<ClusterEngine> cpu_;   // the CPU backend: kCpu, and kAuto without a device
  std::unique_ptr<ClusterEngine> cuda_;  // the CUDA backend when built in and a device works
  std::string cuda_missing_;             // why there is no CUDA backend
  std::vector<DeviceInfo> devices_;
};

}  // namespace centroidkv
