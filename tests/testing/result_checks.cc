// GoogleTest checks on CompressResult shared by the engine test suites.
#include "tests/testing/result_checks.h"

#include <cstring>

#include "gtest/gtest.h"

namespace centroidkv::test {

void ExpectBitIdentical(const CompressResult& expected, const CompressResult& actual) {
  EXPECT_EQ(actual.offsets, expected.offsets);
  EXPECT_EQ(actual.counts, expected.counts);
  EXPECT_EQ(actual.assignment, expected.assignment);
  EXPECT_EQ(actual.passes_run, expected.passes_run);
  EXPECT_EQ(actual.dtype, expected.dtype);
  EXPECT_EQ(actual.half_keys, expected.half_keys);
  EXPECT_EQ(actual.half_values, expected.half_values);
  ASSERT_EQ(actual.keys.size(), expected.keys.size());
  ASSERT_EQ(actual.values.size(), expected.values.size());
  for (size_t i = 0; i < expected.keys.size(); ++i) {
    ASSERT_EQ(std::memcmp(&actual.keys[i], &expected.keys[i], sizeof(float)), 0)
        << "key element " << i << ": " << actual.keys[i] << " vs " << expected.keys[i];
  }
  for (size_t i = 0; i < expected.values.size(); ++i) {
    ASSERT_EQ(std::memcmp(&actual.values[i], &expected.values[i], sizeof(float)), 0)
        << "value element " << i << ": " << actual.values[i] << " vs " << expected.values[i];
  }
}

}  // namespace centroidkv::test
