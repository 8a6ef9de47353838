// The per-stage profile of centroidkv-cpu-bench (--profile_seconds): `perf record`
// attached to this process while it runs one job again and again, then `perf report`'s
// symbols grouped into the stages of the cpu backend's pipeline (match kernel, rescoring,
// widening and packing, input check, merges, result streaming, fp8 conversions, kernel,
// other). Sampling (cpu-clock) works where the VM exposes no PMU; the samples of every
// thread of the process count, and nothing but the job runs while perf is attached.
//
// Memory stalls land on the first code that touches a line (the widening, or the merges for
// the value rows), so a stage's share moves when another one prefetches.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace centroidkv::bench {

struct StageShare {
  std::string stage;
  double share = 0.0;  // of the samples in the process while the job ran
};

struct StageProfile {
  std::vector<StageShare> stages;  // in the fixed order of StageNames(), zeros included
  int64_t samples = 0;
  int64_t jobs = 0;        // jobs run while perf was attached
  std::string perf_data;   // where the raw samples are (perf report -i)
};

// The stage names, in the order profiles list them.
const std::vector<std::string>& StageNames();

// The stage a `perf report --sort sym` symbol belongs to ("[k] ..." for kernel symbols).
const std::string& StageOf(const std::string& symbol);

// Runs `job` for `seconds` under `perf record -F frequency -p <this pid> -o perf_data` and
// groups the samples by stage. An error when perf is missing or cannot attach (perf's
// message), or when a job fails.
absl::StatusOr<StageProfile> ProfileStages(const std::function<absl::Status()>& job,
                                           double seconds, int frequency,
                                           const std::string& perf_data);

}  // namespace centroidkv::bench
