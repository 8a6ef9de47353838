// Jobs the backends do not run as they are, run through them as regular jobs, above every
// backend (so every backend gives the same bits as the reference):
//  - ragged or count-0-padded input: heads of different real lengths. Heads are independent
//    except for uniform_heads, so each head is its own job, or, with uniform_heads, the
//    compressed heads (which must then have one length) are one job and each passthrough
//    head another; the results are stitched back in head order.
//  - exact_target: a second stage on the result, each compressed head still above t on its
//    own (floor off, uniform_heads off, up to kExactTargetPasses passes), its assignment
//    composed with the first stage's (merging twice equals merging once over the originals,
//    SPEC section 2). Where the passes reach t anyway (PassesReachTarget), the job runs as a
//    plain one.
// Internal to kernels/ (ClusterEngine::Compress). Thread-safe like the engine.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv {

inline constexpr int32_t kExactTargetPasses = 64;

// Runs one regular job (its data already checked, float32 rows, no stage above the
// backend) through the backend into `out`, its stop reasons filled: how the stages here
// reach the backend (ClusterEngine::Run gives it).
using RegularJobRunner = absl::FunctionRef<absl::Status(
    const LayerView& layer, const CompressOptions& options, CompressResult* out)>;

// A regular head-major layer of `heads` of `layer`, `length` entries each, borrowing the
// input's rows where they are contiguous (one head of a head-major layer) and copying them
// otherwise. No scores or queries.
class GroupInput {
 public:
  GroupInput(const LayerView& layer, const std::vector<int32_t>& heads, int32_t length);
  const LayerView& view() const { return view_; }

 private:
  LayerView view_;
  std::vector<uint8_t> keys_, values_;
  std::vector<uint32_t> counts_;
};

// First assignment row of head h: the layer's entries in head order ([H, n] or ragged).
int64_t AssignmentBase(const LayerView& layer, int32_t h);

// The options of a regular job of `plan`'s: the same SPEC parameters with t fixed, float32
// rows, nothing of what the stages above the backends do.
CompressOptions SubJobOptions(const LayerPlan& plan);

// `plan` is of the whole (validated, not regular) layer; `out` gets a float32, head-major,
// unpadded result with stop_reasons filled.
absl::Status RunRagged(RegularJobRunner run, const LayerPlan& plan, const LayerView& layer,
                       CompressResult* out);

// Whether the passes of a regular `plan` bring every compressed head to t on their own, so
// that an exact_target job needs no second stage: with the similarity floor off every edge
// is a candidate, and each pass's merges follow from the heads' lengths alone (SPEC section
// 2, steps 1-5). A floor makes them depend on the data: false.
bool PassesReachTarget(const LayerPlan& plan);

// Whether every compressed head of `result` holds at most t entries.
bool HeadsWithinTarget(const LayerPlan& plan, const CompressResult& result);

// Merges every compressed head of `out` (float32 rows, head-major, unpadded) that is
// longer than t down to t where sink and recent entries allow, updating its assignment
// (laid out as `layer`'s entries), stop reasons and passes_run.
absl::Status ReachExactTarget(RegularJobRunner run, const LayerPlan& plan,
                              const LayerView& layer, CompressResult* out);

}  // namespace centroidkv
