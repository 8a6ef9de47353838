// The bearer tokens the server accepts (--auth-tokens-file): one `token caller-name` pair a
// line, '#' comments and blank lines ignored. Loaded at start and again on SIGHUP
// (Reload); a reload that fails keeps the previous table, so a bad edit never locks every
// caller out. Thread-safe: lookups read an immutable snapshot swapped in under a lock.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace centroidkv::service {

class TokenTable {
 public:
  // Reads `path`; fails (naming the file and line) if it cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<TokenTable>> Load(const std::string& path);
  // Parses the text of a tokens file into SHA-256(token) -> caller; `source` names it in
  // errors (which never quote a token).
  static absl::StatusOr<std::map<std::string, std::string>> Parse(const std::string& text,
                                                                  const std::string& source);

  // Re-reads the file. On error the table is unchanged and the error is returned.
  absl::Status Reload();
  // The caller name of `token`, or nullopt when the token is unknown.
  std::optional<std::string> Lookup(const std::string& token) const;
  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  explicit TokenTable(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const std::map<std::string, std::string>> tokens_;  // SHA-256(token) -> caller
};

}  // namespace centroidkv::service
