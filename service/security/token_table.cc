// TokenTable: parsing and reloading the tokens file.
#include "service/security/token_table.h"

#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace centroidkv::service {
namespace {

// Tokens are kept and compared as SHA-256 digests: a lookup's timing can then reveal at
// most a prefix of a digest, never of a token.
std::string Digest(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> TokenTable::Parse(const std::string& text,
                                                                    const std::string& source) {
  std::map<std::string, std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth_tokens_file: ", source, " line ", line_number,
          ": expected 'token caller-name', got ", fields.size(), " fields"));
    }
    const std::string caller(fields[1]);
    for (char c : caller) {
      // Caller names become /metrics label values and log fields: keep them plain.
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' &&
          c != '.' && c != ':' && c != '@') {
        return absl::InvalidArgumentError(absl::StrCat(
            "auth_tokens_file: ", source, " line ", line_number, ": caller name '", caller,
            "' may hold only letters, digits and - _ . : @"));
      }
    }
    if (!tokens.emplace(Digest(fields[0]), caller).second) {
      return absl::InvalidArgumentError(absl::StrCat("auth_tokens_file: ", source, " line ",
                                                     line_number, ": duplicate token"));
    }
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::Load(const std::string& path) {
  std::unique_ptr<TokenTable> table(new TokenTable(path));
  if (absl::Status status = table->Reload(); !status.ok()) return status;
  return table;
}

absl::Status TokenTable::Reload() {
  std::ifstream in(path_);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("auth_tokens_file: cannot read '", path_, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::map<std::string, std::string>> parsed = Parse(text.str(), path_);
  if (!parsed.ok()) return parsed.status();
  auto snapshot = std::make_shared<const std::map<std::string, std::string>>(*std::move(parsed));
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(snapshot);
  return absl::OkStatus();
}

std::optional<std::string> TokenTable::Lookup(const std::string& token) const {
  std::shared_ptr<const std::map<std::string, std::string>> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens = tokens_;
  }
  auto it = tokens->find(Digest(token));
  if (it == tokens->end()) return std::nullopt;
  return it->second;
}

size_t TokenTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_->size();
}

}  // namespace centroidkv::service
