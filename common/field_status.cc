// FieldError: the location travels as three payloads of the status (field, head, token).
#include "centroidkv/common/field_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace centroidkv {
namespace {

constexpr absl::string_view kFieldUrl = "type.centroidkv.v1/field";
constexpr absl::string_view kHeadUrl = "type.centroidkv.v1/field.head";
constexpr absl::string_view kTokenUrl = "type.centroidkv.v1/field.token";

std::optional<int64_t> ReadNumber(const absl::Status& status, absl::string_view url) {
  auto payload = status.GetPayload(url);
  int64_t value = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

absl::Status FieldError(absl::StatusCode code, const FieldLocation& location,
                        absl::string_view message) {
  absl::Status status(code, message);
  status.SetPayload(kFieldUrl, absl::Cord(location.field));
  if (location.head.has_value()) status.SetPayload(kHeadUrl, absl::Cord(absl::StrCat(*location.head)));
  if (location.token.has_value()) {
    status.SetPayload(kTokenUrl, absl::Cord(absl::StrCat(*location.token)));
  }
  return status;
}

absl::Status InvalidFieldError(const FieldLocation& location, absl::string_view message) {
  return FieldError(absl::StatusCode::kInvalidArgument, location, message);
}

std::optional<FieldLocation> GetFieldLocation(const absl::Status& status) {
  auto field = status.GetPayload(kFieldUrl);
  if (!field.has_value()) return std::nullopt;
  FieldLocation location{std::string(*field)};
  location.head = ReadNumber(status, kHeadUrl);
  location.token = ReadNumber(status, kTokenUrl);
  return location;
}

absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status prefixed(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&prefixed](absl::string_view url, const absl::Cord& payload) {
    prefixed.SetPayload(url, payload);
  });
  return prefixed;
}

}  // namespace centroidkv
