// Tests of kernels/identity/: the transport floor's engine answers with exactly the shape of
// a real job (the cpu engine's offsets), its first rows unchanged, counts that keep their
// sum and a valid assignment; with target ratio 1 it returns its input unchanged.
#include "kernels/identity/identity_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <numeric>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"

namespace centroidkv {
namespace {

constexpr int32_t kHeads = 3, kTokens = 100, kDk = 4, kDv = 3;

struct Layer {
  std::vector<uint16_t> keys = std::vector<uint16_t>(kHeads * kTokens * kDk);
  std::vector<uint16_t> values = std::vector<uint16_t>(kHeads * kTokens * kDv);
  std::vector<uint32_t> counts = std::vector<uint32_t>(kHeads * kTokens);
  LayerView view;
  Layer() {
    for (size_t i = 0; i < keys.size(); ++i) {
      keys[i] = FloatToHalf(0.25f * static_cast<float>(i % 37) - 3.0f);
    }
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = FloatToHalf(0.5f * static_cast<float>(i % 11));
    }
    for (size_t i = 0; i < counts.size(); ++i) counts[i] = 1 + static_cast<uint32_t>(i % 5);
    view.dtype = DType::kFloat16;
    view.num_heads = kHeads;
    view.num_tokens = kTokens;
    view.key_dim = kDk;
    view.value_dim = kDv;
    view.keys = keys.data();
    view.values = values.data();
    view.counts = counts.data();
  }
};

TEST(IdentityEngineTest, RatioOneReturnsTheInputUnchanged) {
  const Layer layer;
  CompressOptions options;
  options.target_ratio = 1.0;
  const IdentityEngine engine;
  absl::StatusOr<CompressResult> result = engine.Compress(layer.view, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->total_entries(), kHeads * kTokens);
  for (int32_t h = 0; h <= kHeads; ++h) EXPECT_EQ(result->offsets[h], int64_t{h} * kTokens);
  ASSERT_EQ(result->keys.size(), layer.keys.size());
  ASSERT_EQ(result->values.size(), layer.values.size());
  for (size_t i = 0; i < layer.keys.size(); ++i) {
    EXPECT_EQ(result->keys[i], HalfToFloat(layer.keys[i])) << i;
  }
  for (size_t i = 0; i < layer.values.size(); ++i) {
    EXPECT_EQ(result->values[i], HalfToFloat(layer.values[i])) << i;
  }
  EXPECT_EQ(result->counts, layer.counts);
  ASSERT_EQ(result->assignment.size(), static_cast<size_t>(kHeads * kTokens));
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t t = 0; t < kTokens; ++t) EXPECT_EQ(result->assignment[h * kTokens + t], t);
  }
}

TEST(IdentityEngineTest, AnswersWithTheShapeOfARealJob) {
  const Layer layer;
  CompressOptions options;  // target ratio 0.25: t = 25
  options.sink_tokens = 4;
  options.recent_tokens = 8;
  options.passthrough_heads = {1};
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> cpu = engines->Select(BackendKind::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<CompressResult> real = (*cpu)->Compress(layer.view, options);
  ASSERT_TRUE(real.ok()) << real.status();
  const IdentityEngine engine;
  absl::StatusOr<CompressResult> result = engine.Compress(layer.view, options);
  ASSERT_TRUE(result.ok()) << result.status();

  // The same rows per head as the real job: t for compressed heads, n for passthrough.
  EXPECT_EQ(result->offsets, real->offsets);
  EXPECT_EQ(result->offsets, (std::vector<int64_t>{0, 25, 125, 150}));
  EXPECT_EQ(result->keys.size(), real->keys.size());
  EXPECT_EQ(result->values.size(), real->values.size());
  EXPECT_EQ(result->counts.size(), real->counts.size());
  EXPECT_EQ(result->assignment.size(), real->assignment.size());

  for (int32_t h = 0; h < kHeads; ++h) {
    const int64_t first = result->offsets[h];
    const int64_t kept = result->offsets[h + 1] - first;
    // The kept rows are the head's first input rows, unchanged.
    for (int64_t t = 0; t < kept; ++t) {
      for (int32_t j = 0; j < kDk; ++j) {
        EXPECT_EQ(result->keys[(first + t) * kDk + j],
                  HalfToFloat(layer.keys[(h * kTokens + t) * kDk + j]));
      }
      for (int32_t j = 0; j < kDv; ++j) {
        EXPECT_EQ(result->values[(first + t) * kDv + j],
                  HalfToFloat(layer.values[(h * kTokens + t) * kDv + j]));
      }
    }
    // Counts keep their sum; the assignment is a valid head-local row that holds the entry.
    const auto in = layer.counts.begin() + h * kTokens;
    const auto out = result->counts.begin() + first;
    EXPECT_EQ(std::accumulate(out, out + kept, uint64_t{0}),
              std::accumulate(in, in + kTokens, uint64_t{0}))
        << "head " << h;
    std::vector<uint64_t> mass(static_cast<size_t>(kept), 0);
    for (int32_t t = 0; t < kTokens; ++t) {
      const int32_t row = result->assignment[h * kTokens + t];
      ASSERT_GE(row, 0);
      ASSERT_LT(row, kept);
      mass[static_cast<size_t>(row)] += layer.counts[h * kTokens + t];
    }
    for (int64_t r = 0; r < kept; ++r) EXPECT_EQ(mass[r], out[r]) << "head " << h << " row " << r;
  }
}

TEST(IdentityEngineTest, WithoutCountsEveryKeptRowButTheLastCountsOne) {
  Layer layer;
  layer.view.counts = nullptr;
  CompressOptions options;
  options.target_tokens = 10;
  options.compute_assignment = false;
  absl::StatusOr<CompressResult> result = IdentityEngine().Compress(layer.view, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->total_entries(), kHeads * 10);
  EXPECT_TRUE(result->assignment.empty());
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t r = 0; r < 9; ++r) EXPECT_EQ(result->counts[h * 10 + r], 1u);
    EXPECT_EQ(result->counts[h * 10 + 9], static_cast<uint32_t>(kTokens - 9));
  }
}

// Rows in any result dtype are the float32 rows rounded once (the fp16 input's bytes when
// the dtypes agree), from head-major and token-major input, into the result's arrays or
// straight into caller memory (CompressControl::row_target).
TEST(IdentityEngineTest, RowsInEveryDTypeAndInPlaceAreTheFloatRowsRoundedOnce) {
  Layer head_major;
  Layer token_major;  // the same tokens, stored token-major
  token_major.view.layout = TensorLayout::kTokenMajor;
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t t = 0; t < kTokens; ++t) {
      std::copy_n(&head_major.keys[(h * kTokens + t) * kDk], kDk,
                  &token_major.keys[(t * kHeads + h) * kDk]);
      std::copy_n(&head_major.values[(h * kTokens + t) * kDv], kDv,
                  &token_major.values[(t * kHeads + h) * kDv]);
      token_major.counts[t * kHeads + h] = head_major.counts[h * kTokens + t];
    }
  }
  CompressOptions options;
  options.passthrough_heads = {2};
  const IdentityEngine engine;
  absl::StatusOr<CompressResult> floats = engine.Compress(head_major.view, options);
  ASSERT_TRUE(floats.ok()) << floats.status();
  for (const Layer* layer : {&head_major, &token_major}) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) +
                   (layer == &token_major ? ", token-major input" : ""));
      CompressResult expected = *floats;
      RoundResultRows(dtype, &expected);
      options.result_dtype = dtype;
      absl::StatusOr<CompressResult> rows = engine.Compress(layer->view, options);
      ASSERT_TRUE(rows.ok()) << rows.status();
      EXPECT_EQ(rows->keys, expected.keys);
      EXPECT_EQ(rows->half_keys, expected.half_keys);
      EXPECT_EQ(rows->values, expected.values);
      EXPECT_EQ(rows->half_values, expected.half_values);
      // In place: the same bytes in the caller's memory, nothing in the arrays.
      const size_t element = DTypeSize(dtype);
      std::vector<uint8_t> keys(kHeads * kTokens * kDk * element, 0xee);
      std::vector<uint8_t> values(kHeads * kTokens * kDv * element, 0xee);
      const ResultRowTarget target{keys.data(), keys.size(), values.data(), values.size()};
      CompressControl control;
      control.row_target = &target;
      CompressResult in_place;
      ASSERT_TRUE(engine.CompressInto(layer->view, options, &in_place, control).ok());
      ASSERT_TRUE(in_place.rows_in_target);
      EXPECT_TRUE(in_place.keys.empty() && in_place.half_keys.empty());
      EXPECT_EQ(in_place.counts, expected.counts);
      const void* want_keys = dtype == DType::kFloat32
                                  ? static_cast<const void*>(expected.keys.data())
                                  : expected.half_keys.data();
      const void* want_values = dtype == DType::kFloat32
                                    ? static_cast<const void*>(expected.values.data())
                                    : expected.half_values.data();
      EXPECT_EQ(std::memcmp(keys.data(), want_keys, expected.key_elements() * element), 0);
      EXPECT_EQ(std::memcmp(values.data(), want_values, expected.value_elements() * element), 0);
      EXPECT_EQ(keys[expected.key_elements() * element], 0xee);  // nothing past the rows
    }
  }
}

}  // namespace
}  // namespace centroidkv
