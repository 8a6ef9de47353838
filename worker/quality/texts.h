// The texts of the quality report: sampled from the model (SPEC section 4: temperature
// 0.8, fixed seeds, BOS/EOS suppressed) or read from a file of token ids (one text per
// line, ids separated by spaces, BOS first).
//
// Thread-safety: functions only; the Transformer is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {

// `count` texts of `length` tokens; text i uses seed first_seed + i.
absl::StatusOr<std::vector<std::vector<int32_t>>> SampleTexts(Transformer& transformer,
                                                              int32_t count, int32_t length,
                                                              float temperature,
                                                              uint64_t first_seed);

// Reads a tokens file. InvalidArgument (naming the line) for a non-integer, an id outside
// [0, vocab_size), a line not starting with BOS, or a text shorter than `min_length`;
// blank lines are skipped.
absl::StatusOr<std::vector<std::vector<int32_t>>> ReadTokensFile(const std::string& path,
                                                                 int32_t vocab_size,
                                                                 int32_t min_length);

}  // namespace centroidkv::worker::quality
