// Tests of worker/tokenizer.cc on tok512.bin: llama2.c encoding (BOS, dummy prefix,
// score-ordered merges, byte fallback), decoding, and errors for malformed files.
#include "worker/tokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

TEST(TokenizerTest, EncodesOnceUponATimeAsTheReference) {
  const Tokenizer* tokenizer = testutil::Tok512();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->Encode("Once upon a time", /*add_bos=*/false),
            (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->piece(403), " Once");
  EXPECT_EQ(tokenizer->Lookup(" "), 410);
  EXPECT_EQ(tokenizer->max_token_length(), 7);
}

TEST(TokenizerTest, EmptyTextIsBosOnly) {
  EXPECT_EQ(testutil::Tok512()->Encode(""), std::vector<int32_t>{kBosToken});
}

TEST(TokenizerTest, CharactersWithoutAPieceFallBackToBytes) {
  const Tokenizer* tokenizer = testutil::Tok512();
  // U+00F6 has no piece; its two UTF-8 bytes 0xC3 0xB6 become byte tokens 0xC3 + 3, 0xB6 + 3.
  // (U+00E9 has one: id 485.)
  const std::vector<int32_t> tokens = tokenizer->Encode("\xC3\xB6", /*add_bos=*/false);
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_EQ(tokens[0], 410);
  EXPECT_EQ(tokens[1], 0xC3 + 3);
  EXPECT_EQ(tokens[2], 0xB6 + 3);
  EXPECT_EQ(tokenizer->Decode(tokens), "\xC3\xB6");
  EXPECT_EQ(tokenizer->Encode("\xC3\xA9", /*add_bos=*/false), (std::vector<int32_t>{410, 485}));
}

TEST(TokenizerTest, DecodeDropsTheDummyPrefixAndRoundTrips) {
  const Tokenizer* tokenizer = testutil::Tok512();
  const std::string text = "Lily saw a big, red ball. She was happy!\nThe end.";
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text)), text);
  EXPECT_EQ(tokenizer->DecodeToken(kBosToken, 403), "Once");
  EXPECT_EQ(tokenizer->DecodeToken(403, 407), " upon");
  EXPECT_EQ(tokenizer->DecodeToken(403, kEosToken), "");
  EXPECT_EQ(tokenizer->DecodeToken(403, 13), "\n");  // <0x0A>
}

TEST(TokenizerTest, MalformedFilesAreInvalidArgument) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(testutil::TokenizerPath());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(ParseTokenizer(*bytes, 512, "tok").ok());
  absl::StatusOr<Tokenizer> cut = ParseTokenizer(bytes->substr(0, 1000), 512, "tok");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos) << cut.status();
  absl::StatusOr<Tokenizer> small = ParseTokenizer(*bytes, 500, "tok");
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("vocabulary size"), std::string::npos) << small.status();
  EXPECT_EQ(LoadTokenizer("/nonexistent/tok.bin", 512).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace centroidkv::worker
