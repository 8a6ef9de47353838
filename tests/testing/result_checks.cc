// GoogleTest checks on CompressResult shared by the engine test suites.
#include "tests/testing/result_checks.h"

#include <cstring>

#include "gtest/gtest.h"

namespace centroidkv::test {

void ExpectOptionsEqual(const CompressOptions& expected, const CompressOptions& actual) {
  EXPECT_EQ(actual.target_ratio, expected.target_ratio);
  EXPECT_EQ(actual.target_tokens, expected.target_tokens);
  EXPECT_EQ(actual.chunk_size, expected.chunk_size);
  EXPECT_EQ(actual.sink_tokens, expected.sink_tokens);
  EXPECT_EQ(actual.recent_tokens, expected.recent_tokens);
  EXPECT_EQ(actual.min_similarity, expected.min_similarity);
  EXPECT_EQ(actual.tighten_per_pass, expected.tighten_per_pass);
  EXPECT_EQ(actual.max_passes, expected.max_passes);
  EXPECT_EQ(actual.uniform_heads, expected.uniform_heads);
  EXPECT_EQ(actual.passthrough_heads, expected.passthrough_heads);
  EXPECT_EQ(actual.compute_assignment, expected.compute_assignment);
  EXPECT_EQ(actual.result_dtype, expected.result_dtype);
  EXPECT_EQ(actual.result_key_scales, expected.result_key_scales);
  EXPECT_EQ(actual.result_value_scales, expected.result_value_scales);
  EXPECT_EQ(actual.exact_target, expected.exact_target);
  EXPECT_EQ(actual.pad_heads, expected.pad_heads);
  EXPECT_EQ(actual.pad_to, expected.pad_to);
  EXPECT_EQ(actual.output_layout, expected.output_layout);
  EXPECT_EQ(actual.head_budgets, expected.head_budgets);
  EXPECT_EQ(actual.centroid_share, expected.centroid_share);
  EXPECT_EQ(actual.max_cluster_size, expected.max_cluster_size);
  EXPECT_EQ(actual.fit.log_weight_bound, expected.fit.log_weight_bound);
  EXPECT_EQ(actual.fit.block_tokens, expected.fit.block_tokens);
  EXPECT_EQ(actual.fit.fit_values, expected.fit.fit_values);
  EXPECT_EQ(actual.fit.query_scale, expected.fit.query_scale);
}

void ExpectBitIdentical(const CompressResult& expected, const CompressResult& actual) {
  EXPECT_EQ(actual.offsets, expected.offsets);
  EXPECT_EQ(actual.counts, expected.counts);
  EXPECT_EQ(actual.assignment, expected.assignment);
  EXPECT_EQ(actual.passes_run, expected.passes_run);
  EXPECT_EQ(actual.dtype, expected.dtype);
  EXPECT_EQ(actual.half_keys, expected.half_keys);
  EXPECT_EQ(actual.half_values, expected.half_values);
  EXPECT_EQ(actual.fp8_keys, expected.fp8_keys);
  EXPECT_EQ(actual.fp8_values, expected.fp8_values);
  EXPECT_EQ(actual.key_scales, expected.key_scales);
  EXPECT_EQ(actual.value_scales, expected.value_scales);
  EXPECT_EQ(actual.head_budgets, expected.head_budgets);
  EXPECT_EQ(actual.head_exact_entries, expected.head_exact_entries);
  ASSERT_EQ(actual.log_weights.size(), expected.log_weights.size());
  for (size_t i = 0; i < expected.log_weights.size(); ++i) {
    ASSERT_EQ(std::memcmp(&actual.log_weights[i], &expected.log_weights[i], sizeof(float)), 0)
        << "log-weight " << i << ": " << actual.log_weights[i] << " vs "
        << expected.log_weights[i];
  }
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
