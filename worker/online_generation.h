// Long generation with online compression: feed a short prompt, then
// teacher-force the rest of a text token by token while a method keeps every layer's cache
// at a fixed budget of rows per head, and record each step's next-token logits and how long
// the worker's step took (the forward pass plus the method's own work).
//   full          nothing is compressed (the reference)
//   centroidkv    a client::Sequence (fixed-budget policy) through a running server; its
//                 splices are applied when they have arrived (pipelined) or, with
//                 `pipelined` off, each step waits for every job in flight
//   streamingllm  sinks + the newest rows, evicted the moment a head is over budget
//   h2o           sinks + recent + the most attended rows, attention accumulated while decoding
//
// Thread-safety: one call per Transformer at a time; the Client may be shared.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/types/presets.h"
#include "worker/transformer.h"

namespace centroidkv::worker {

enum class OnlineMethod { kFull, kCentroidKv, kStreamingLlm, kH2o };

std::string_view OnlineMethodName(OnlineMethod method);

struct OnlineSettings {
  int32_t prompt_tokens = 16;
  int64_t budget_entries = 0;  // rows per head
  int32_t sink_tokens = kSmallModelPreset.sink_tokens;
  int32_t recent_tokens = kSmallModelPreset.recent_tokens;
  int32_t chunk_tokens = kSmallModelPreset.chunk_size;  // CentroidKV: positions per chunk
  CompressOptions compression;  // CentroidKV: engine parameters of its jobs
  BackendKind backend = BackendKind::kAuto;
  bool pipelined = true;
};

struct OnlineRun {
  // After each teacher-forced token tokens[prompt_tokens + i]: the next-token logits, and
  // the step's time (forward pass + the method's work), in seconds.
  std::vector<std::vector<float>> logits;
  std::vector<double> step_seconds;
  double mean_rows = 0.0;  // rows per head attended, mean over those steps and all heads
  int64_t max_rows = 0;    // the most rows any head held after a step
  int64_t final_rows = 0;  // the most rows of a head at the end, every splice applied
  int64_t splices_applied = 0;
  int64_t splices_stale = 0;
};

// Runs `tokens` (prompt first) with `method`. `client` is needed by kCentroidKv only.
absl::StatusOr<OnlineRun> RunOnline(Transformer& transformer, std::span<const int32_t> tokens,
                                    OnlineMethod method, const OnlineSettings& settings,
                                    client::Client* client);

}  // namespace centroidkv::worker
