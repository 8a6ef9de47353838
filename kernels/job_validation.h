// Validation and planning of a layer job (job_validation.cc); the public half is declared
// in engine.h (ValidateJobShape, PlanLayer, CheckLayerData). Internal to kernels/.
#pragma once

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv {

// PlanLayer, with the sweep over the data only where `check_data` (a backend that checks
// the data itself runs a regular job without it; ragged and padded jobs are always checked,
// since the backends never see their padding).
absl::StatusOr<LayerPlan> PlanJob(const LayerView& layer, const CompressOptions& options,
                                  const EngineLimits& limits, bool check_data);

}  // namespace centroidkv
