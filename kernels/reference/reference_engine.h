// The scalar reference backend: SPEC.md section 2 implemented literally, in float64,
// clarity over speed. It is the yardstick every faster backend is tested against.
// Thread-safe and stateless.
#pragma once

#include <memory>

#include "centroidkv/kernels/engine.h"

namespace centroidkv {

class ReferenceEngine final : public ClusterEngine {
 public:
  explicit ReferenceEngine(EngineLimits limits = {}) : ClusterEngine(limits) {}
  std::string_view name() const override { return "reference"; }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;
};

}  // namespace centroidkv
