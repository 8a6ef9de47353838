// Sampling the report's texts and reading them from a file.
#include "worker/quality/texts.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/sampler.h"
#include "worker/tokenizer.h"

namespace centroidkv::worker::quality {

absl::StatusOr<std::vector<std::vector<int32_t>>> SampleTexts(Transformer& transformer,
                                                              int32_t count, int32_t length,
                                                              float temperature,
                                                              uint64_t first_seed) {
  std::vector<std::vector<int32_t>> texts;
  for (int32_t i = 0; i < count; ++i) {
    absl::StatusOr<std::vector<int32_t>> text =
        SampleText(transformer, length, temperature, first_seed + static_cast<uint64_t>(i));
    if (!text.ok()) return text.status();
    texts.push_back(*std::move(text));
  }
  return texts;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadTokensFile(const std::string& path,
                                                                 int32_t vocab_size,
                                                                 int32_t min_length) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::vector<int32_t>> texts;
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    std::vector<int32_t> text;
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(field, &id) || id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": \"", field,
                                                       "\" is not a token id in [0, ", vocab_size,
                                                       ")"));
      }
      text.push_back(id);
    }
    if (text.empty()) continue;
    if (text.front() != kBosToken) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": a text must start with BOS (", kBosToken, ")"));
    }
    if (static_cast<int32_t>(text.size()) < min_length) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": ", text.size(),
                       " tokens, fewer than prefill + continuation = ", min_length));
    }
    texts.push_back(std::move(text));
  }
  if (texts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no texts"));
  return texts;
}

}  // namespace centroidkv::worker::quality
