// The llama2.c tokenizer (tokenizer.bin / tok512.bin format): a vocabulary of byte-string
// pieces with merge scores, byte-fallback tokens <0x00>..<0xFF>, BOS = 1 and EOS = 2.
//
// File format: int32 max_token_length, then for each id 0..vocab_size-1: float32 score,
// int32 byte length, the raw bytes. The vocabulary size comes from the model header.
//
// Encoding (llama2.c style): BOS, then (for non-empty text) the single-space piece as
// SentencePiece's dummy prefix, then one piece per UTF-8 character (its bytes as byte
// tokens when the character has no piece), then repeatedly the adjacent pair whose
// concatenation is a piece with the highest score is merged (the leftmost on ties) until
// no pair merges.
//
// Thread-safety: immutable after LoadTokenizer(); Encode/Decode are const.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace centroidkv::worker {

inline constexpr int32_t kBosToken = 1;
inline constexpr int32_t kEosToken = 2;

class Tokenizer {
 public:
  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  float score(int32_t id) const { return scores_[static_cast<size_t>(id)]; }
  int32_t max_token_length() const { return max_token_length_; }

  // Token ids of `text`, starting with BOS when `add_bos`.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos = true) const;

  // The text of `token` following `previous`: a leading space is dropped right after BOS,
  // <0xNN> becomes the raw byte, BOS and EOS become "".
  std::string DecodeToken(int32_t previous, int32_t token) const;
  // The text of a whole sequence (ids out of range are skipped).
  std::string Decode(const std::vector<int32_t>& tokens) const;

  // The id of an exact piece, or -1.
  int32_t Lookup(std::string_view piece) const;

 private:
  friend absl::StatusOr<Tokenizer> ParseTokenizer(const std::string& bytes, int32_t vocab_size,
                                                  const std::string& name);

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;  // piece -> lowest id with that piece
  int32_t max_token_length_ = 0;
};

// Parses a tokenizer of `vocab_size` pieces held in `bytes` (InvalidArgument when the file
// is truncated, has trailing bytes, or a negative length); `name` labels errors.
absl::StatusOr<Tokenizer> ParseTokenizer(const std::string& bytes, int32_t vocab_size,
                                         const std::string& name);

// Reads and parses the tokenizer at `path` (NotFound when it cannot be opened).
absl::StatusOr<Tokenizer> LoadTokenizer(const std::string& path, int32_t vocab_size);

}  // namespace centroidkv::worker
