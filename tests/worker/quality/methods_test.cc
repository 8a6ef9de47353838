// Tests of worker/quality/methods.cc: CentroidKV's budget with and without outlier
// heads, and every method meeting the budget through a live server (the window-scored
// centroidkv+snapkv with one budget over every head too).
#include "worker/quality/methods.h"

#include <algorithm>
#include <string>
#include <vector>

#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker::quality {
namespace {

TEST(MethodsTest, OutlierHeadsShareTheBudgetOfTheWholeModel) {
  MethodSettings settings;
  const CompressCacheOptions plain = CentroidKvOptions(settings, 0.25, {}, true, 5, 4, 384);
  EXPECT_EQ(plain.compression.target_ratio, 0.25);
  EXPECT_FALSE(plain.compression.target_tokens.has_value());
  // 2 outlier heads keep 384 each: the other 18 share 20 * 96 - 2 * 384 = 1152 -> 64 each.
  const std::vector<std::vector<int32_t>> outliers = {{1}, {}, {0}};
  const CompressCacheOptions shared = CentroidKvOptions(settings, 0.25, outliers, true, 5, 4, 384);
  EXPECT_EQ(shared.compression.target_tokens, 64);
  EXPECT_FALSE(shared.compression.target_ratio.has_value());
  ASSERT_EQ(shared.passthrough_per_layer.size(), 5u);
  EXPECT_EQ(shared.passthrough_per_layer[2], std::vector<int32_t>{0});
  const CompressCacheOptions extra = CentroidKvOptions(settings, 0.25, outliers, false, 5, 4, 384);
  EXPECT_EQ(extra.compression.target_ratio, 0.25);
  EXPECT_EQ(CountHeads(outliers), 2);
}

TEST(MethodsTest, SharedOutlierHeadsLeaveTheOthersAtLeastSinksPlusRecent) {
  // 25% of 384 over 20 heads: 3 outliers leave (1920 - 1152) / 17 = 45 >= 4 + 32 each,
  // a 4th would leave 24.
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 384, 0.25, 4, 32), 3);
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 384, 0.25, 4, 48), 2);  // t' = 64; 3 -> 45 < 52
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 384, 0.25, 4, 92), 0);
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 384, 0.5, 4, 32), 8);  // (3840 - 3072) / 12 = 64; 9: 34
}

TEST(MethodsTest, UnknownMethodAndMissingServerAreErrors) {
  EXPECT_EQ(MakeCompressor("tova", 0.5, {}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCompressor(kCentroidKv, 0.5, {}, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // "+merge" goes with an eviction that keeps entries between its windows.
  for (const char* method : {"centroidkv+merge", "kmeans+merge", "streamingllm+merge+outliers"}) {
    const absl::Status status = MakeCompressor(method, 0.5, {}, nullptr).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << method;
    EXPECT_NE(status.message().find(method), std::string::npos) << status;
  }
  EXPECT_EQ(MakeCompressor("centroidkv+snapkv", 0.5, {}, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsWindowScored("centroidkv+snapkv@0.2"));
  EXPECT_TRUE(UsesObservationWindow("centroidkv+snapkv"));
  EXPECT_FALSE(IsWindowScored("centroidkv+snapkvx"));
  EXPECT_TRUE(MakeCompressor("snapkv+merge+outliers", 0.5, {}, nullptr).ok());
  EXPECT_EQ(BaseMethod("snapkv+merge+outliers"), kSnapKv);
  EXPECT_TRUE(MergesEvicted("h2o+merge"));
  EXPECT_FALSE(MergesEvicted("h2o+outliers"));
}

TEST(MethodsTest, EvictionControlsKeepTheOutlierHeadsWholeAndEvictTheRestToTheSharedTarget) {
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 201, 0.8f, 90);
  ASSERT_TRUE(tokens.ok());
  MethodSettings settings;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 32;
  settings.outlier_ranking = {{3, 1}, {0, 2}};
  const std::vector<std::string> controls = {"streamingllm+outliers", "h2o+outliers",
                                             "snapkv+outliers"};
  absl::StatusOr<PrefilledText> text =
      PrefillText(transformer, *tokens, 200, TrackingFor(controls, settings));
  ASSERT_TRUE(text.ok());
  for (const std::string& method : controls) {
    SCOPED_TRACE(method);
    const KvCache& original =
        UsesObservationWindow(method) ? *text->window_cache : text->cache;
    // 25% of 200 over 20 heads: one ranked head fits; the 19 others share
    // 20 * 50 - 200 = 800 entries: 42 each.
    absl::StatusOr<CacheCompressor> control = MakeCompressor(method, 0.25, settings, nullptr);
    ASSERT_TRUE(control.ok()) << control.status();
    KvCache cache = original;
    ASSERT_TRUE((*control)(&cache).ok());
    for (int32_t layer = 0; layer < cache.num_layers(); ++layer) {
      for (int32_t h = 0; h < cache.num_kv_heads(); ++h) {
        if (layer == 3 && h == 1) {
          EXPECT_EQ(cache.head(layer, h).keys, original.head(layer, h).keys);
          EXPECT_EQ(cache.head(layer, h).counts, original.head(layer, h).counts);
        } else {
          EXPECT_EQ(cache.head(layer, h).size(), 42) << layer << ":" << h;
        }
      }
    }
    // At 10% no head fits: the control is the plain method, entry for entry.
    absl::StatusOr<CacheCompressor> plain =
        MakeCompressor(BaseMethod(method), 0.1, settings, nullptr);
    control = MakeCompressor(method, 0.1, settings, nullptr);
    ASSERT_TRUE(plain.ok() && control.ok());
    KvCache a = original, b = original;
    ASSERT_TRUE((*plain)(&a).ok());
    ASSERT_TRUE((*control)(&b).ok());
    for (int32_t layer = 0; layer < a.num_layers(); ++layer) {
      for (int32_t h = 0; h < a.num_kv_heads(); ++h) {
        EXPECT_EQ(a.head(layer, h).keys, b.head(layer, h).keys) << layer << ":" << h;
      }
    }
  }
  EXPECT_EQ(MakeCompressor("kmeans+outliers", 0.25, settings, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BaseMethod(kCentroidKvOutliers), kCentroidKv);
  EXPECT_TRUE(KeepsOutlierHeads("snapkv+outliers"));
  EXPECT_FALSE(KeepsOutlierHeads(kSnapKv));
}

class MethodsServerTest : public testutil::LiveServerTest {};

TEST_F(MethodsServerTest, EveryMethodKeepsTheBudget) {
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 201, 0.8f, 88);
  ASSERT_TRUE(tokens.ok());
  MethodSettings settings;
  settings.centroidkv.compression.chunk_size = 64;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 32;
  settings.outlier_heads = {{}, {2}};
  absl::StatusOr<PrefilledText> text =
      PrefillText(transformer, *tokens, 200, TrackingFor(AllMethods(), settings));
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(text->window_cache.has_value());
  std::vector<std::string> methods = AllMethods();
  methods.insert(methods.end(), {"h2o+merge", "snapkv+merge", "snapkv+merge+outliers",
                                 "centroidkv+snapkv", "centroidkv+snapkv@0"});
  for (const std::string& method : methods) {
    absl::StatusOr<CacheCompressor> compress = MakeCompressor(method, 0.25, settings, client_);
    ASSERT_TRUE(compress.ok()) << compress.status();
    int64_t entries = 0;
    absl::StatusOr<Agreement> agreement =
        EvaluateCompressed(transformer, *text, *compress, &entries,
                           UsesObservationWindow(method));
    ASSERT_TRUE(agreement.ok()) << method << ": " << agreement.status();
    EXPECT_LE(entries, 20 * 50) << method;
    EXPECT_GE(entries, 20 * 50 - 19) << method;  // outliers: the others round down
    EXPECT_EQ(agreement->steps, 1);
  }
}

// centroidkv+snapkv@0 is SnapKV's selection under one budget over all heads: every head
// keeps entries of the input unchanged (count 1), the heads' shares are uneven, and the
// whole cache keeps the total; with a centroid share the unkept tail comes back as centroids.
TEST_F(MethodsServerTest, WindowScoredJobsSplitOneBudgetOverEveryHead) {
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 201, 0.8f, 90);
  ASSERT_TRUE(tokens.ok());
  MethodSettings settings;
  settings.centroidkv.compression.chunk_size = 32;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 32;
  absl::StatusOr<PrefilledText> text =
      PrefillText(transformer, *tokens, 200, TrackingFor({"centroidkv+snapkv"}, settings));
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(text->window_cache.has_value());
  for (const char* method : {"centroidkv+snapkv@0", "centroidkv+snapkv@0.5"}) {
    SCOPED_TRACE(method);
    absl::StatusOr<CacheCompressor> compress = MakeCompressor(method, 0.25, settings, client_);
    ASSERT_TRUE(compress.ok()) << compress.status();
    KvCache cache = *text->window_cache;
    ASSERT_TRUE((*compress)(&cache).ok());
    int64_t total = 0, merged = 0, tokens = 0;
    std::vector<int64_t> sizes;
    for (int32_t layer = 0; layer < cache.num_layers(); ++layer) {
      for (int32_t h = 0; h < cache.num_kv_heads(); ++h) {
        const HeadCache& head = cache.head(layer, h);
        sizes.push_back(head.size());
        total += head.size();
        for (uint32_t c : head.counts) {
          merged += c > 1;
          tokens += c;
        }
      }
    }
    EXPECT_LE(total, int64_t{20} * 50);
    EXPECT_GE(total, int64_t{20} * 50 - 20);
    EXPECT_NE(*std::min_element(sizes.begin(), sizes.end()),
              *std::max_element(sizes.begin(), sizes.end()));
    if (std::string(method) == "centroidkv+snapkv@0") {
      EXPECT_EQ(merged, 0);
      EXPECT_EQ(total, int64_t{20} * 50);
    } else {
      EXPECT_GT(merged, 0);
      EXPECT_GT(tokens, total);  // the tail's centroids stand for entries no eviction keeps
    }
  }
  EXPECT_EQ(MakeCompressor("centroidkv+snapkv@1.5", 0.25, settings, client_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // 10% of 200 is 20 entries a head, below the 36 sink and recent ones: the windows shrink
  // (4 sinks, 16 recent) and the budget holds.
  absl::StatusOr<CacheCompressor> small = MakeCompressor("centroidkv+snapkv", 0.1, settings, client_);
  ASSERT_TRUE(small.ok()) << small.status();
  KvCache cache = *text->window_cache;
  ASSERT_TRUE((*small)(&cache).ok());
  EXPECT_LE(cache.TotalEntries(), int64_t{20} * 20);
}

TEST_F(MethodsServerTest, RankedOutlierHeadsPassThroughAsManyAsEachBudgetAffords) {
  Transformer transformer(*testutil::Stories260K());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer, 201, 0.8f, 89);
  ASSERT_TRUE(tokens.ok());
  MethodSettings settings;
  settings.centroidkv.compression.chunk_size = 64;
  settings.centroidkv.compression.sink_tokens = 4;
  settings.centroidkv.compression.recent_tokens = 32;
  settings.outlier_ranking = {{3, 1}, {0, 2}, {4, 0}};
  absl::StatusOr<PrefilledText> text = PrefillText(transformer, *tokens, 200, {});
  ASSERT_TRUE(text.ok());
  const KvCache& original = text->cache;
  // 200 entries, 20 heads: whole heads keep 200 each, and the others must keep at least
  // sinks + recent = 36. At 50% every ranked head fits, at 25% one ((1000 - 200) / 19 = 42;
  // two leave 33), at 10% none: exactly the ranking's first that many come back whole.
  for (const double budget : {0.5, 0.25, 0.1}) {
    const int32_t fit = MaxSharedOutlierHeads(original.num_layers(), original.num_kv_heads(), 200,
                                              budget, 4, 32);
    absl::StatusOr<CacheCompressor> compress =
        MakeCompressor(kCentroidKvOutliers, budget, settings, client_);
    ASSERT_TRUE(compress.ok()) << compress.status();
    KvCache cache = original;
    ASSERT_TRUE((*compress)(&cache).ok());
    for (size_t i = 0; i < settings.outlier_ranking.size(); ++i) {
      const auto [layer, head] = settings.outlier_ranking[i];
      const HeadCache& got = cache.head(layer, head);
      const HeadCache& was = original.head(layer, head);
      if (static_cast<int32_t>(i) < fit) {
        EXPECT_EQ(got.keys, was.keys) << "budget " << budget << " head " << i;
        EXPECT_EQ(got.values, was.values) << "budget " << budget << " head " << i;
      } else {
        EXPECT_LT(got.size(), was.size()) << "budget " << budget << " head " << i;
      }
    }
  }
  EXPECT_GE(MaxSharedOutlierHeads(5, 4, 200, 0.5, 4, 32), 3);
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 200, 0.25, 4, 32), 1);
  EXPECT_EQ(MaxSharedOutlierHeads(5, 4, 200, 0.1, 4, 32), 0);
}

}  // namespace
}  // namespace centroidkv::worker::quality
