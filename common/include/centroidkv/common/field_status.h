// Errors that say which request field is at fault: an absl::Status whose payload carries the
// field's name and, where they apply, the head and the entry (token) within that head. The
// engine and the service attach them where they detect the error; the service copies them
// into the wire's JobError (field, head, token). Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace centroidkv {

struct FieldLocation {
  FieldLocation(std::string field_name, std::optional<int64_t> head_index = std::nullopt,
                std::optional<int64_t> token_index = std::nullopt)
      : field(std::move(field_name)), head(head_index), token(token_index) {}

  std::string field;             // e.g. "passthrough_heads", "keys", "slab.data"
  std::optional<int64_t> head;   // the head at fault, where one is
  std::optional<int64_t> token;  // the entry within that head, where one is
};

// A status of `code` with `message`, locating the error at `location`.
absl::Status FieldError(absl::StatusCode code, const FieldLocation& location,
                        absl::string_view message);
absl::Status InvalidFieldError(const FieldLocation& location, absl::string_view message);

// The location attached by FieldError; nullopt for any other status.
std::optional<FieldLocation> GetFieldLocation(const absl::Status& status);

// `status` with its message prefixed by `prefix`, its location (if any) kept.
absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix);

}  // namespace centroidkv
