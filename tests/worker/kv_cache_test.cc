// Tests of worker/kv_cache.cc: appending, the [H, n, d] exchange layout, ragged
// export, count-0 padding rows, replacing heads, malformed replacements, and splicing rows
// (online compression).
#include "worker/kv_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace centroidkv::worker {
namespace {

// A cache of 2 layers x 2 heads x head size 2 holding `tokens` tokens; entry t of head h of
// layer l has key (100l + 10h + t, -t) and value (t, 100l + 10h).
KvCache MakeCache(int tokens) {
  KvCache cache(2, 2, 2);
  for (int t = 0; t < tokens; ++t) {
    for (int l = 0; l < 2; ++l) {
      std::vector<float> keys, values;
      for (int h = 0; h < 2; ++h) {
        keys.insert(keys.end(), {static_cast<float>(100 * l + 10 * h + t), static_cast<float>(-t)});
        values.insert(values.end(), {static_cast<float>(t), static_cast<float>(100 * l + 10 * h)});
      }
      cache.Append(l, keys.data(), values.data());
    }
    cache.AdvancePosition();
  }
  return cache;
}

TEST(KvCacheTest, ExportIsHeadMajor) {
  KvCache cache = MakeCache(3);
  EXPECT_EQ(cache.position(), 3);
  EXPECT_EQ(cache.TotalEntries(), 12);
  EXPECT_EQ(cache.UncompressedEntries(), 12);
  absl::StatusOr<LayerTensors> layer = cache.ExportLayer(1);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->num_heads, 2);
  EXPECT_EQ(layer->num_tokens, 3);
  EXPECT_EQ(layer->head_size, 2);
  EXPECT_EQ(layer->keys, (std::vector<float>{100, 0, 101, -1, 102, -2, 110, 0, 111, -1, 112, -2}));
  EXPECT_EQ(layer->values, (std::vector<float>{0, 100, 1, 100, 2, 100, 0, 110, 1, 110, 2, 110}));
  EXPECT_EQ(layer->counts, std::vector<uint32_t>(6, 1u));
}

TEST(KvCacheTest, ReplaceHeadKeepsThePosition) {
  KvCache cache = MakeCache(3);
  ASSERT_TRUE(cache.ReplaceHead(0, 1, {1, 2, 3, 4}, {5, 6, 7, 8}, {2, 1}).ok());
  EXPECT_EQ(cache.position(), 3);
  EXPECT_EQ(cache.head(0, 1).size(), 2);
  EXPECT_EQ(cache.TotalEntries(), 11);
  // The layer's heads now differ in length: it is sent ragged, head after head.
  absl::StatusOr<LayerTensors> ragged = cache.ExportLayer(0);
  ASSERT_TRUE(ragged.ok()) << ragged.status();
  EXPECT_EQ(ragged->num_tokens, 3);
  EXPECT_EQ(ragged->head_offsets, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(ragged->counts, (std::vector<uint32_t>{1, 1, 1, 2, 1}));
  EXPECT_EQ(ragged->keys, (std::vector<float>{0, 0, 1, -1, 2, -2, 1, 2, 3, 4}));
  absl::StatusOr<LayerTensors> regular = cache.ExportLayer(1);
  ASSERT_TRUE(regular.ok());
  EXPECT_TRUE(regular->head_offsets.empty());
}

// Count-0 rows (a padded result) stand for no token: not entries, and not sent again.
TEST(KvCacheTest, PaddingRowsAreNotEntriesAndAreNotExported) {
  KvCache cache = MakeCache(3);
  ASSERT_TRUE(cache.ReplaceHead(0, 0, {1, 2, 3, 4, 0, 0}, {5, 6, 7, 8, 0, 0}, {2, 1, 0}).ok());
  ASSERT_TRUE(cache.ReplaceHead(0, 1, {9, 9, 0, 0, 0, 0}, {9, 9, 0, 0, 0, 0}, {3, 0, 0}).ok());
  EXPECT_EQ(cache.head(0, 0).size(), 3);
  EXPECT_EQ(cache.head(0, 0).real_entries(), 2);
  EXPECT_EQ(cache.TotalEntries(), 2 + 1 + 6);
  EXPECT_EQ(cache.TotalRows(), 12);
  // Decoding appends after the padding.
  std::vector<float> kv(4, 7.0f);
  cache.Append(0, kv.data(), kv.data());
  absl::StatusOr<LayerTensors> layer = cache.ExportLayer(0);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->head_offsets, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(layer->counts, (std::vector<uint32_t>{2, 1, 1, 3, 1}));
  EXPECT_EQ(layer->keys, (std::vector<float>{1, 2, 3, 4, 7, 7, 9, 9, 7, 7}));
}

TEST(KvCacheTest, MalformedReplacementsAreRejected) {
  KvCache cache = MakeCache(2);
  EXPECT_EQ(cache.ReplaceHead(0, 0, {1, 2, 3}, {1, 2, 3, 4}, {1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.head(0, 0).size(), 2);
}

TEST(KvCacheTest, TrackAttentionSizesTheStatistic) {
  KvCache cache = MakeCache(2);
  cache.TrackAttention(true);
  EXPECT_EQ(cache.head(1, 1).attention, std::vector<double>(2, 0.0));
  std::vector<float> kv(4, 1.0f);
  cache.Append(1, kv.data(), kv.data());
  EXPECT_EQ(cache.head(1, 1).attention.size(), 3u);
  cache.TrackAttention(false);
  EXPECT_TRUE(cache.head(1, 1).attention.empty());
}

TEST(KvCacheSpliceRowsTest, ReplacesExactlyTheRowsNamed) {
  KvCache cache(1, 1, 2);
  for (float x : {1.f, 2.f, 3.f, 4.f}) {
    const float k[2] = {x, -x};
    cache.Append(0, k, k);
  }
  const std::vector<float> keys = {9, 9}, values = {8, 8};
  const std::vector<uint32_t> counts = {2};
  ASSERT_TRUE(cache.SpliceRows(0, 0, 1, 3, keys, values, counts).ok());
  const HeadCache& head = cache.head(0, 0);
  EXPECT_EQ(head.keys, (std::vector<float>{1, -1, 9, 9, 4, -4}));
  EXPECT_EQ(head.values, (std::vector<float>{1, -1, 8, 8, 4, -4}));
  EXPECT_EQ(head.counts, (std::vector<uint32_t>{1, 2, 1}));
  EXPECT_EQ(cache.SpliceRows(0, 0, 2, 5, keys, values, counts).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(cache.SpliceRows(0, 0, 0, 1, keys, {}, counts).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace centroidkv::worker
