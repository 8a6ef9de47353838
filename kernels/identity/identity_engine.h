// The identity backend: returns its input unchanged (every entry its own centroid). It does
// no clustering at all and exists only to measure the transport floor of the service: the
// same bytes through the same server, with the compute taken out. Never chosen by auto/cpu.
// Thread-safe and stateless.
#pragma once

#include "centroidkv/kernels/engine.h"

namespace centroidkv {

class IdentityEngine final : public ClusterEngine {
 public:
  explicit IdentityEngine(EngineLimits limits = {}) : ClusterEngine(limits) {}
  std::string_view name() const override { return "identity"; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;
};

}  // namespace centroidkv
