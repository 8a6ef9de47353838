// The identity backend: no clustering at all, only the shape of a real job's answer. Each
// head keeps its first t input rows unchanged (t = the job's target length; all n rows for
// a passthrough head), the dropped tail is counted in the last kept row (counts keep their
// sum; the assignment maps the tail to that row). So a job's request and response bytes are
// those of a real job that reaches its target, and the service's run with it measures the
// transport floor: the same bytes through the same server with the compute taken out. With
// target ratio 1 it returns its input unchanged. Measurement only; never chosen by auto/cpu.
// Thread-safe and stateless.
#pragma once

#include "centroidkv/kernels/engine.h"

namespace centroidkv {

class IdentityEngine final : public ClusterEngine {
 public:
  explicit IdentityEngine(EngineLimits limits = {}) : ClusterEngine(limits) {}
  std::string_view name() const override { return "identity"; }
  // Rows in the result dtype (copied as they are when the input has that dtype), and into
  // caller memory: the floor pays for the copies a real backend pays for, and no more. fp8
  // rows are quantised above it (kernels/fp8_rows.h).
  EngineCaps caps() const override {
    return {.writes_half_rows = true, .writes_rows_in_place = true};
  }

 protected:
  absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                            const CompressControl& control, CompressResult* out) const override;
};

}  // namespace centroidkv
