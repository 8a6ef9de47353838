// The llama2.c tokenizer: parsing, greedy score-ordered pair merging, decoding.
#include "worker/tokenizer.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/model.h"

namespace centroidkv::worker {
namespace {

constexpr int32_t kByteTokenOffset = 3;  // <0x00> is id 3

// Length of the UTF-8 character starting at text[i]: the lead byte plus the continuation
// bytes (10xxxxxx) that follow it, at most 4 in all.
size_t Utf8CharLength(std::string_view text, size_t i) {
  size_t length = 1;
  while (i + length < text.size() && length < 4 &&
         (static_cast<uint8_t>(text[i + length]) & 0xC0) == 0x80) {
    ++length;
  }
  return length;
}

// Reads a little-endian scalar at `*offset`, advancing it; false when truncated.
template <typename T>
bool ReadScalar(const std::string& bytes, size_t* offset, T* out) {
  if (bytes.size() - *offset < sizeof(T)) return false;
  std::memcpy(out, bytes.data() + *offset, sizeof(T));
  *offset += sizeof(T);
  return true;
}

}  // namespace

int32_t Tokenizer::Lookup(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> tokens;
  if (add_bos) tokens.push_back(kBosToken);
  if (text.empty()) return tokens;
  const size_t first = tokens.size();
  if (int32_t space = Lookup(" "); space >= 0) tokens.push_back(space);
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8CharLength(text, i);
    if (int32_t id = Lookup(text.substr(i, length)); id >= 0) {
      tokens.push_back(id);
    } else {
      for (size_t b = 0; b < length; ++b) {
        tokens.push_back(static_cast<uint8_t>(text[i + b]) + kByteTokenOffset);
      }
    }
    i += length;
  }
  // Merge the best-scoring adjacent pair until none merges (BOS never takes part).
  std::string merged;
  while (true) {
    float best_score = 0.0f;
    int32_t best_id = -1;
    size_t best_index = 0;
    for (size_t i = first; i + 1 < tokens.size(); ++i) {
      merged = piece(tokens[i]);
      merged += piece(tokens[i + 1]);
      const int32_t id = Lookup(merged);
      if (id >= 0 && (best_id < 0 || score(id) > best_score)) {
        best_score = score(id);
        best_id = id;
        best_index = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_index) + 1);
  }
  return tokens;
}

std::string Tokenizer::DecodeToken(int32_t previous, int32_t token) const {
  if (token < 0 || token >= vocab_size() || token == kBosToken || token == kEosToken) return "";
  std::string_view text = piece(token);
  if (previous == kBosToken && !text.empty() && text.front() == ' ') text.remove_prefix(1);
  unsigned int byte = 0;
  if (text.size() == 6 && text.substr(0, 3) == "<0x" && text.back() == '>' &&
      std::sscanf(std::string(text).c_str(), "<0x%02X>", &byte) == 1) {
    return std::string(1, static_cast<char>(byte));
  }
  return std::string(text);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  int32_t previous = kBosToken;  // a text without BOS still loses its dummy-prefix space
  for (int32_t token : tokens) {
    text += DecodeToken(previous, token);
    previous = token;
  }
  return text;
}

absl::StatusOr<Tokenizer> ParseTokenizer(const std::string& bytes, int32_t vocab_size,
                                         const std::string& name) {
  if (vocab_size <= kEosToken) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": vocab_size ", vocab_size, " leaves no room for BOS and EOS"));
  }
  Tokenizer tokenizer;
  size_t offset = 0;
  if (!ReadScalar(bytes, &offset, &tokenizer.max_token_length_)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": too short for a tokenizer"));
  }
  tokenizer.pieces_.resize(static_cast<size_t>(vocab_size));
  tokenizer.scores_.resize(static_cast<size_t>(vocab_size));
  for (int32_t id = 0; id < vocab_size; ++id) {
    int32_t length = 0;
    if (!ReadScalar(bytes, &offset, &tokenizer.scores_[static_cast<size_t>(id)]) ||
        !ReadScalar(bytes, &offset, &length)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": truncated at token ", id, " of ", vocab_size));
    }
    if (length < 0 || static_cast<size_t>(length) > bytes.size() - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": token ", id, " has a bad byte length ", length));
    }
    tokenizer.pieces_[static_cast<size_t>(id)] = bytes.substr(offset, static_cast<size_t>(length));
    offset += static_cast<size_t>(length);
    tokenizer.ids_.emplace(tokenizer.pieces_[static_cast<size_t>(id)], id);
  }
  if (offset != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", bytes.size() - offset, " bytes left after ", vocab_size,
                     " tokens; is the vocabulary size of the model right?"));
  }
  return tokenizer;
}

absl::StatusOr<Tokenizer> LoadTokenizer(const std::string& path, int32_t vocab_size) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  return ParseTokenizer(*bytes, vocab_size, path);
}

}  // namespace centroidkv::worker
