// FieldError: the field, head and token travel with the status (and survive WithPrefix);
// statuses without them report none.
#include "centroidkv/common/field_status.h"

#include <gtest/gtest.h>

namespace centroidkv {
namespace {

TEST(FieldStatusTest, LocationTravelsWithTheStatus) {
  const absl::Status status = InvalidFieldError({"keys", 3, 17}, "keys hold a NaN");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "keys hold a NaN");
  auto location = GetFieldLocation(status);
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "keys");
  EXPECT_EQ(location->head, 3);
  EXPECT_EQ(location->token, 17);

  const absl::Status prefixed = WithPrefix(status, "job 4: ");
  EXPECT_EQ(prefixed.message(), "job 4: keys hold a NaN");
  EXPECT_EQ(prefixed.code(), status.code());
  EXPECT_EQ(GetFieldLocation(prefixed)->token, 17);
}

TEST(FieldStatusTest, HeadAndTokenAreOptionalAndPlainStatusesHaveNoLocation) {
  auto location = GetFieldLocation(
      FieldError(absl::StatusCode::kResourceExhausted, {"slab.data"}, "too large"));
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "slab.data");
  EXPECT_FALSE(location->head.has_value());
  EXPECT_FALSE(location->token.has_value());
  EXPECT_FALSE(GetFieldLocation(absl::InternalError("no field")).has_value());
  EXPECT_FALSE(GetFieldLocation(absl::OkStatus()).has_value());
}

}  // namespace
}  // namespace centroidkv
