// Finding the paper's outlier heads: on calibration texts (seeds distinct from the
// evaluation texts), each KV head of each layer is compressed alone through the server
// (every other head kept whole) at the calibration budget, and the heads whose
// compression raises KL(full || compressed) the most are the ones to pass through.
// Also the text form of passthrough heads per layer used by the flags and reports:
// "LAYER:HEAD[,HEAD...]" items joined by ';', e.g. "0:1;3:0,2"; a plain "1,3" (no layer)
// means those heads in every layer.
//
// Thread-safety: functions only; the Transformer is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "worker/evaluation.h"
#include "worker/quality/methods.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {

struct HeadScore {
  int32_t layer = 0;
  int32_t head = 0;
  Agreement agreement;  // over the calibration texts, only this head compressed
};

// Scores every (layer, KV head) on the prefilled calibration texts, most harmful first.
absl::StatusOr<std::vector<HeadScore>> ScoreHeads(Transformer& transformer, client::Client& client,
                                                  const std::vector<PrefilledText>& texts,
                                                  const MethodSettings& settings, double budget);

// Passthrough heads per layer that leave only (layer, head) compressed.
std::vector<std::vector<int32_t>> AllHeadsBut(int32_t layer, int32_t head, int32_t num_layers,
                                              int32_t num_heads);

// The first `count` (layer, head) of `ranked` (most harmful first) as heads per layer.
std::vector<std::vector<int32_t>> PickRankedHeads(
    const std::vector<std::pair<int32_t, int32_t>>& ranked, int32_t count, int32_t num_layers);

// The first `count` heads of `scores` (sorted, most harmful first) as heads per layer.
std::vector<std::vector<int32_t>> PickOutlierHeads(const std::vector<HeadScore>& scores,
                                                   int32_t count, int32_t num_layers);

// "0:1;3:0,2" (layers without heads omitted); "" when there are none.
std::string FormatHeads(const std::vector<std::vector<int32_t>>& per_layer);

// Parses FormatHeads' form (or "1,3" for every layer), checking layers and heads.
absl::StatusOr<std::vector<std::vector<int32_t>>> ParseHeads(const std::string& text,
                                                             int32_t num_layers, int32_t num_heads);

}  // namespace centroidkv::worker::quality
