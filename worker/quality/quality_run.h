// One quality measurement (SPEC section 4): for every text, prefill, then for every budget
// and method compress a copy of the prefilled cache, teacher-force the continuation and
// compare with the uncompressed run. Results are summed over texts per (method, budget).
//
// Thread-safety: uses one Transformer on the calling thread; the Client is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "worker/evaluation.h"
#include "worker/quality/methods.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {

struct RunSettings {
  int32_t prefill = 384;
  int32_t continuation = 96;
  std::vector<double> budgets = {0.5, 0.25};
  std::vector<std::string> methods;  // names from AllMethods()
  MethodSettings method_settings;
};

struct MethodResult {
  std::string method;
  double budget = 0.0;
  Agreement agreement;           // over all texts
  std::vector<Agreement> texts;  // per text
  int64_t entries_kept = 0;      // cache entries after compression, over all texts
  int64_t entries_full = 0;      // the same uncompressed
  TargetTally targets;           // the service's account (CentroidKV methods)

  double kv_fraction() const {
    return entries_full == 0
               ? 0.0
               : static_cast<double>(entries_kept) / static_cast<double>(entries_full);
  }
};

// Called with a line of progress after each text.
using Progress = std::function<void(const std::string&)>;

// Runs every (budget, method) on every text. Texts must hold at least prefill +
// continuation tokens (extra tokens are ignored). `client` may be null when no method
// needs the server.
absl::StatusOr<std::vector<MethodResult>> RunQuality(Transformer& transformer,
                                                     client::Client* client,
                                                     const std::vector<std::vector<int32_t>>& texts,
                                                     const RunSettings& settings,
                                                     const Progress& progress = nullptr);

}  // namespace centroidkv::worker::quality
