// Tests of worker/compress_cache.cc through a live in-process server on loopback:
// ratio 1.0 leaves the worker's continuation bit-identical, a 50% budget with the SPEC
// section 4 settings keeps top-1 agreement >= 0.95, per-layer passthrough heads come back
// unchanged (and a ragged layer goes back for a second round), errors leave the cache as
// it was, a ReplicaPool gives the same cache; padded results (pad_heads / pad_to) leave
// the model's outputs bit-identical to the unpadded ones, exact_target gives every head
// of every layer t entries, and the service's per-layer account is reported.
#include "worker/compress_cache.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <vector>

#include "centroidkv/client/replica_pool.h"
#include "worker/evaluation.h"
#include "worker/sampler.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/worker/worker_testing.h"

namespace centroidkv::worker {
namespace {

// SPEC section 4: sinks 4, recent 32, chunk 64.
CompressCacheOptions Section4Options(double ratio) {
  CompressCacheOptions options;
  options.compression.target_ratio = ratio;
  options.compression.chunk_size = 64;
  options.compression.sink_tokens = 4;
  options.compression.recent_tokens = 32;
  return options;
}

class CompressCacheTest : public testutil::LiveServerTest {
 protected:
  // A text sampled at temperature 0.8 (seed `seed`), prefilled to `prefill` tokens.
  absl::StatusOr<PrefilledText> Prefilled(uint64_t seed, int32_t length, int32_t prefill) {
    absl::StatusOr<std::vector<int32_t>> tokens = SampleText(transformer_, length, 0.8f, seed);
    if (!tokens.ok()) return tokens.status();
    return PrefillText(transformer_, *tokens, prefill, {});
  }
  CacheCompressor ThroughServer(const CompressCacheOptions& options) {
    return [options](KvCache* cache) { return CompressCache(*client_, options, cache).status(); };
  }

  Transformer transformer_{*testutil::Stories260K()};
};

TEST_F(CompressCacheTest, RatioOneLeavesTheContinuationBitIdentical) {
  absl::StatusOr<PrefilledText> prefilled = Prefilled(101, 200, 150);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  const PrefilledText& text = *prefilled;
  KvCache cache = text.cache;
  absl::StatusOr<CompressCacheStats> stats = CompressCache(*client_, Section4Options(1.0), &cache);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->entries_before, 150 * 5 * 4);
  EXPECT_EQ(stats->entries_after, stats->entries_before);
  for (int32_t layer = 0; layer < 5; ++layer) {
    for (int32_t h = 0; h < 4; ++h) {
      EXPECT_EQ(cache.head(layer, h).keys, text.cache.head(layer, h).keys);
      EXPECT_EQ(cache.head(layer, h).values, text.cache.head(layer, h).values);
    }
  }
  absl::StatusOr<Agreement> agreement =
      EvaluateCompressed(transformer_, text, ThroughServer(Section4Options(1.0)));
  ASSERT_TRUE(agreement.ok()) << agreement.status();
  EXPECT_EQ(agreement->steps, 50);
  EXPECT_EQ(agreement->exact_matches, 50);
  EXPECT_EQ(agreement->kl_sum, 0.0);
}

// The worker takes any Client: through a ReplicaPool over two servers, the cache comes out
// exactly as through one server.
TEST_F(CompressCacheTest, ThroughAReplicaPoolTheCacheIsTheSame) {
  service::ServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  server_options.worker_threads = 1;
  absl::StatusOr<std::unique_ptr<service::Server>> second = service::Server::Start(server_options);
  ASSERT_TRUE(second.ok()) << second.status();
  client::PoolOptions pool_options;
  pool_options.client.target = server_->target() + "," + (*second)->target();
  pool_options.client.connect_timeout = std::chrono::seconds(5);
  pool_options.stream_job_limit = 1;  // each layer on a freshly placed stream
  absl::StatusOr<std::unique_ptr<client::ReplicaPool>> pool =
      client::ReplicaPool::Connect(pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<PrefilledText> prefilled = Prefilled(105, 200, 150);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  KvCache direct = prefilled->cache;
  KvCache pooled = prefilled->cache;
  ASSERT_TRUE(CompressCache(*client_, Section4Options(0.5), &direct).ok());
  ASSERT_TRUE(CompressCache(**pool, Section4Options(0.5), &pooled).ok());
  for (int32_t layer = 0; layer < 5; ++layer) {
    for (int32_t h = 0; h < 4; ++h) {
      EXPECT_EQ(pooled.head(layer, h).keys, direct.head(layer, h).keys);
      EXPECT_EQ(pooled.head(layer, h).values, direct.head(layer, h).values);
      EXPECT_EQ(pooled.head(layer, h).counts, direct.head(layer, h).counts);
    }
  }
  EXPECT_EQ((*pool)->stats().returned_ok, 5);
  EXPECT_EQ((*pool)->stats().retries, 0);
}

TEST_F(CompressCacheTest, HalfBudgetKeepsTopOneAgreementAbove95Percent) {
  Agreement total;
  for (uint64_t seed : {201u, 202u}) {
    absl::StatusOr<PrefilledText> prefilled = Prefilled(seed, 384 + 96, 384);
    ASSERT_TRUE(prefilled.ok()) << prefilled.status();
    const PrefilledText& text = *prefilled;
    int64_t entries = 0;
    absl::StatusOr<Agreement> agreement =
        EvaluateCompressed(transformer_, text, ThroughServer(Section4Options(0.5)), &entries);
    ASSERT_TRUE(agreement.ok()) << agreement.status();
    EXPECT_EQ(entries, 192 * 5 * 4);
    total.Add(*agreement);
  }
  EXPECT_EQ(total.steps, 192);
  EXPECT_GE(total.top1(), 0.95) << "mean KL " << total.mean_kl();
  RecordProperty("top1", std::to_string(total.top1()));
  RecordProperty("mean_kl", std::to_string(total.mean_kl()));
}

TEST_F(CompressCacheTest, CentroidsConserveCountsAndSinksStayBitIdentical) {
  absl::StatusOr<PrefilledText> prefilled = Prefilled(301, 301, 300);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  const PrefilledText& text = *prefilled;
  KvCache cache = text.cache;
  ASSERT_TRUE(CompressCache(*client_, Section4Options(0.25), &cache).ok());
  EXPECT_EQ(cache.position(), 300);
  const int32_t hs = cache.head_size();
  for (int32_t layer = 0; layer < 5; ++layer) {
    for (int32_t h = 0; h < 4; ++h) {
      const HeadCache& head = cache.head(layer, h);
      const HeadCache& original = text.cache.head(layer, h);
      EXPECT_EQ(head.size(), 75);
      EXPECT_EQ(std::accumulate(head.counts.begin(), head.counts.end(), 0u), 300u);
      EXPECT_TRUE(std::equal(head.keys.begin(), head.keys.begin() + 4 * hs, original.keys.begin()));
      EXPECT_TRUE(
          std::equal(head.keys.end() - 32 * hs, head.keys.end(), original.keys.end() - 32 * hs));
    }
  }
}

TEST_F(CompressCacheTest, PassthroughHeadsPerLayerComeBackUnchanged) {
  absl::StatusOr<PrefilledText> prefilled = Prefilled(401, 201, 200);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  const PrefilledText& text = *prefilled;
  KvCache cache = text.cache;
  CompressCacheOptions options = Section4Options(0.5);
  options.passthrough_per_layer = {{}, {2}, {0, 3}};  // layers 3 and 4: none
  ASSERT_TRUE(CompressCache(*client_, options, &cache).ok());
  for (int32_t layer = 0; layer < 5; ++layer) {
    for (int32_t h = 0; h < 4; ++h) {
      const bool passthrough = (layer == 1 && h == 2) || (layer == 2 && (h == 0 || h == 3));
      EXPECT_EQ(cache.head(layer, h).size(), passthrough ? 200 : 100) << layer << " " << h;
      if (passthrough) {
        EXPECT_EQ(cache.head(layer, h).keys, text.cache.head(layer, h).keys);
      }
    }
  }
  // Heads of different lengths go back ragged for a second round: the passthrough heads
  // stay as they are; a target_ratio is of the longest head (docs/protocol.md), so in
  // layers 1 and 2 (passthrough heads of 200) t stays 100, elsewhere the heads halve.
  const KvCache first = cache;
  absl::StatusOr<CompressCacheStats> again = CompressCache(*client_, options, &cache);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int32_t layer = 0; layer < 5; ++layer) {
    for (int32_t h = 0; h < 4; ++h) {
      const bool passthrough = (layer == 1 && h == 2) || (layer == 2 && (h == 0 || h == 3));
      const int64_t expected = passthrough ? 200 : (layer == 1 || layer == 2) ? 100 : 50;
      EXPECT_EQ(cache.head(layer, h).size(), expected) << layer << " " << h;
      if (passthrough) {
        EXPECT_EQ(cache.head(layer, h).keys, first.head(layer, h).keys);
      }
      const std::vector<uint32_t>& counts = cache.head(layer, h).counts;
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0u), 200u);
    }
  }
}

// Heads of different lengths (passthrough heads, a similarity floor with heads on their
// own): padded to equal lengths per layer, or to one length for every layer.
CompressCacheOptions UnevenOptions() {
  CompressCacheOptions options = Section4Options(0.25);
  options.compression.uniform_heads = false;
  options.compression.min_similarity = 0.6;
  options.passthrough_per_layer = {{1}, {}, {0, 2}};
  return options;
}

TEST_F(CompressCacheTest, PaddedResultsLeaveTheModelBitIdentical) {
  for (const uint64_t seed : {601, 602}) {
    absl::StatusOr<PrefilledText> prefilled = Prefilled(seed, 300, 240);
    ASSERT_TRUE(prefilled.ok()) << prefilled.status();
    const PrefilledText& text = *prefilled;
    const CompressCacheOptions plain = UnevenOptions();
    CompressCacheOptions by_layer = plain;
    by_layer.compression.pad_heads = true;
    CompressCacheOptions to_fixed = plain;
    to_fixed.compression.pad_to = 240;  // one length for every layer (a paged cache)
    KvCache unpadded = text.cache;
    absl::StatusOr<CompressCacheStats> plain_stats = CompressCache(*client_, plain, &unpadded);
    ASSERT_TRUE(plain_stats.ok()) << plain_stats.status();
    EXPECT_EQ(plain_stats->rows_after, plain_stats->entries_after);
    for (const CompressCacheOptions& padded_options : {by_layer, to_fixed}) {
      KvCache padded = text.cache;
      absl::StatusOr<CompressCacheStats> stats = CompressCache(*client_, padded_options, &padded);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->entries_after, plain_stats->entries_after);
      EXPECT_GT(stats->rows_after, stats->entries_after) << "nothing was padded";
      for (int32_t layer = 0; layer < 5; ++layer) {
        const int64_t rows = padded.head(layer, 0).size();
        if (padded_options.compression.pad_to > 0) {
          EXPECT_EQ(rows, 240);
        }
        EXPECT_EQ(stats->layers[static_cast<size_t>(layer)].padded_length, rows);
        for (int32_t h = 0; h < 4; ++h) {
          const HeadCache& head = padded.head(layer, h);
          const HeadCache& real = unpadded.head(layer, h);
          ASSERT_EQ(head.size(), rows) << "layer " << layer << " head " << h;
          // The real rows first, as unpadded; then count-0 rows.
          const size_t n = real.counts.size();
          EXPECT_TRUE(std::equal(real.counts.begin(), real.counts.end(), head.counts.begin()));
          EXPECT_TRUE(std::equal(real.keys.begin(), real.keys.end(), head.keys.begin()));
          EXPECT_TRUE(std::all_of(head.counts.begin() + static_cast<ptrdiff_t>(n),
                                  head.counts.end(), [](uint32_t c) { return c == 0; }));
        }
      }
      // The continuation attends over the padded cache exactly as over the unpadded one.
      absl::StatusOr<Agreement> expected =
          EvaluateCompressed(transformer_, text, ThroughServer(plain));
      absl::StatusOr<Agreement> got =
          EvaluateCompressed(transformer_, text, ThroughServer(padded_options));
      ASSERT_TRUE(expected.ok() && got.ok());
      EXPECT_EQ(got->kl_sum, expected->kl_sum);
      EXPECT_EQ(got->top1_matches, expected->top1_matches);
      EXPECT_EQ(got->steps, 60);
      // A second round takes the padded cache (padding left out, heads sent ragged).
      ASSERT_TRUE(CompressCache(*client_, padded_options, &padded).ok());
    }
  }
}

TEST_F(CompressCacheTest, ExactTargetGivesEveryHeadOfEveryLayerTEntries) {
  absl::StatusOr<PrefilledText> prefilled = Prefilled(701, 301, 300);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  CompressCacheOptions options = Section4Options(0.25);
  options.compression.uniform_heads = false;
  options.compression.min_similarity = 0.9;  // stops most heads short of t
  KvCache floored = prefilled->cache;
  absl::StatusOr<CompressCacheStats> missed = CompressCache(*client_, options, &floored);
  ASSERT_TRUE(missed.ok()) << missed.status();
  // The floor stops merging early: the service says so, layer by layer.
  EXPECT_FALSE(missed->target_reached());
  EXPECT_GT(missed->layers_target_missed, 0);
  EXPECT_GT(missed->entries_after, 5 * 4 * 75);
  options.compression.exact_target = true;
  KvCache exact = prefilled->cache;
  absl::StatusOr<CompressCacheStats> stats = CompressCache(*client_, options, &exact);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->target_reached());
  ASSERT_EQ(stats->layers.size(), 5u);
  for (int32_t layer = 0; layer < 5; ++layer) {
    const LayerAccount& account = stats->layers[static_cast<size_t>(layer)];
    EXPECT_EQ(account.target_length, 75);
    EXPECT_TRUE(account.target_reached);
    EXPECT_EQ(account.head_entries, std::vector<uint32_t>(4, 75u));
    EXPECT_EQ(account.stop_reasons, std::vector<StopReason>(4, StopReason::kTargetReached));
    for (int32_t h = 0; h < 4; ++h) {
      EXPECT_EQ(exact.head(layer, h).size(), 75) << "layer " << layer << " head " << h;
      const std::vector<uint32_t>& counts = exact.head(layer, h).counts;
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0u), 300u);
    }
  }
  EXPECT_EQ(stats->entries_after, 5 * 4 * 75);
}

TEST_F(CompressCacheTest, RejectedJobLeavesTheCacheUnchanged) {
  absl::StatusOr<PrefilledText> prefilled = Prefilled(501, 101, 100);
  ASSERT_TRUE(prefilled.ok()) << prefilled.status();
  const PrefilledText& text = *prefilled;
  KvCache cache = text.cache;
  CompressCacheOptions options = Section4Options(0.5);
  options.compression.chunk_size = 1;  // C >= 2
  absl::StatusOr<CompressCacheStats> stats = CompressCache(*client_, options, &cache);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument) << stats.status();
  EXPECT_EQ(cache.TotalEntries(), text.cache.TotalEntries());
  EXPECT_EQ(cache.head(3, 1).keys, text.cache.head(3, 1).keys);
}

}  // namespace
}  // namespace centroidkv::worker
