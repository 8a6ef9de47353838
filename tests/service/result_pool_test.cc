// ResultPool: leases come back on destruction, idle results stay within both bounds
// (least recently returned freed first), leasing picks the best-fitting buffer, and
// concurrent leasing from real threads keeps the books straight; the size it leases for
// is the size the engine produces.
#include "service/result_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "centroidkv/kernels/engine_factory.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service {
namespace {

// Gives `result` arrays holding exactly `floats` keys (and nothing else).
void Grow(CompressResult* result, size_t floats) {
  result->keys.assign(floats, 1.0f);
  result->keys.shrink_to_fit();
}

TEST(ResultPoolTest, LeasesReturnOnDestructionAndAreReused) {
  auto pool = ResultPool::Create({4, uint64_t{1} << 20});
  const CompressResult* first = nullptr;
  {
    PooledResult result = pool->Acquire(0);
    first = result.get();
    Grow(result.get(), 1000);
    EXPECT_EQ(pool->stats().leased, 1);
    EXPECT_EQ(pool->stats().created, 1);
  }
  ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.leased, 0);
  EXPECT_EQ(stats.idle_results, 1);
  EXPECT_EQ(stats.idle_bytes, 4000u);
  PooledResult again = pool->Acquire(4000);
  EXPECT_EQ(again.get(), first) << "the idle result is reused, with its buffers";
  EXPECT_EQ(again->keys.capacity(), 1000u);
  stats = pool->stats();
  EXPECT_EQ(stats.reused, 1);
  EXPECT_EQ(stats.created, 1);
  EXPECT_EQ(stats.idle_results, 0);
  EXPECT_EQ(stats.idle_bytes, 0u);
}

TEST(ResultPoolTest, StaysWithinTheCountBoundFreeingTheOldestFirst) {
  auto pool = ResultPool::Create({2, uint64_t{1} << 30});
  std::vector<PooledResult> leased;
  for (size_t i = 0; i < 5; ++i) {
    leased.push_back(pool->Acquire(0));
    Grow(leased.back().get(), 100 * (i + 1));
  }
  leased.clear();  // returned in order 100, 200, ..., 500 floats
  const ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.idle_results, 2);
  EXPECT_EQ(stats.trimmed, 3);
  EXPECT_EQ(stats.idle_bytes, (400u + 500u) * 4) << "the two returned last are kept";
}

TEST(ResultPoolTest, StaysWithinTheByteBound) {
  auto pool = ResultPool::Create({100, 10000});
  std::vector<PooledResult> leased;
  for (int i = 0; i < 6; ++i) {
    leased.push_back(pool->Acquire(0));
    Grow(leased.back().get(), 1000);  // 4000 bytes each
  }
  leased.clear();
  ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.idle_results, 2);
  EXPECT_EQ(stats.idle_bytes, 8000u);
  EXPECT_EQ(stats.trimmed, 4);
  {
    PooledResult huge = pool->Acquire(0);
    Grow(huge.get(), 5000);  // 20000 bytes: above the bound on its own, never kept
  }
  stats = pool->stats();
  EXPECT_EQ(stats.idle_results, 1) << "the one reused for `huge` grew past the bound";
  EXPECT_LE(stats.idle_bytes, 10000u);
  EXPECT_EQ(stats.trimmed, 5);
}

TEST(ResultPoolTest, ZeroResultsMeansNoPool) {
  auto pool = ResultPool::Create({0, uint64_t{1} << 30});
  for (int i = 0; i < 3; ++i) {
    PooledResult result = pool->Acquire(0);
    Grow(result.get(), 10);
  }
  const ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.idle_results, 0);
  EXPECT_EQ(stats.created, 3);
  EXPECT_EQ(stats.reused, 0);
}

TEST(ResultPoolTest, LeasesTheSmallestIdleResultThatFitsElseTheLargest) {
  auto pool = ResultPool::Create({8, uint64_t{1} << 30});
  std::vector<const CompressResult*> by_size;
  {
    std::vector<PooledResult> leased;
    for (size_t floats : {3000, 1000, 2000}) {
      leased.push_back(pool->Acquire(0));
      Grow(leased.back().get(), floats);
    }
    by_size = {leased[1].get(), leased[2].get(), leased[0].get()};  // 4000, 8000, 12000 bytes
  }
  PooledResult fits = pool->Acquire(5000);
  EXPECT_EQ(fits.get(), by_size[1]);
  PooledResult too_big = pool->Acquire(50000);
  EXPECT_EQ(too_big.get(), by_size[2]) << "nothing fits: the largest grows the least";
  PooledResult last = pool->Acquire(1);
  EXPECT_EQ(last.get(), by_size[0]);
}

TEST(ResultPoolTest, ConcurrentLeasesKeepTheBooksStraight) {
  auto pool = ResultPool::Create({3, uint64_t{1} << 30});
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 500; ++i) {
        PooledResult result = pool->Acquire(static_cast<uint64_t>(i % 7) * 400);
        Grow(result.get(), static_cast<size_t>(1 + (i * 7 + t) % 13) * 100);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.leased, 0);
  EXPECT_EQ(stats.reused + stats.created, 6 * 500);
  EXPECT_LE(stats.created, 6 + stats.trimmed) << "new results only replace freed ones";
  EXPECT_LE(stats.idle_results, 3);
  EXPECT_EQ(stats.created - stats.trimmed, stats.idle_results);
}

TEST(ResultPoolTest, ResultBytesForIsWhatTheEngineProducesForMergeableData) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  auto engine = engines->Select(BackendKind::kAuto);
  ASSERT_TRUE(engine.ok()) << engine.status();
  struct Case {
    int32_t heads, tokens, key_dim, value_dim;
    double ratio;
    bool assignment;
    std::vector<int32_t> passthrough;
    int32_t sink, recent;
    bool exact;  // reaches the target (else: protected rows and chunking keep more)
  };
  for (const Case& c : std::vector<Case>{{2, 96, 16, 12, 0.4, true, {}, 2, 8, true},
                                         {3, 130, 8, 24, 0.3, false, {1}, 2, 8, true},
                                         {1, 300, 32, 32, 0.25, true, {}, 0, 0, true},
                                         {2, 96, 16, 12, 0.4, true, {}, 16, 64, false}}) {
    test::RandomLayerSpec spec = test::Spec(c.heads, c.tokens, c.key_dim, c.value_dim, 7);
    spec.prototypes = 4;  // near-duplicate tokens: every head can merge down to t
    const test::RandomLayer layer = test::RandomLayer::Generate(spec);
    CompressOptions options{.target_ratio = c.ratio, .chunk_size = 16, .sink_tokens = c.sink,
        .recent_tokens = c.recent, .passthrough_heads = c.passthrough,
        .compute_assignment = c.assignment};
    auto result = (*engine)->Compress(layer.view(), options);
    ASSERT_TRUE(result.ok()) << result.status();
    const uint64_t produced = result->offsets.size() * sizeof(int64_t) +
                              (result->keys.size() + result->values.size()) * sizeof(float) +
                              result->counts.size() * sizeof(uint32_t) +
                              result->assignment.size() * sizeof(int32_t);
    const uint64_t estimate = ResultPool::ResultBytesFor(layer.view(), options);
    if (c.exact) {
      EXPECT_EQ(estimate, produced) << spec.ToString();
    } else {
      EXPECT_LE(estimate, produced) << spec.ToString();
      EXPECT_GE(estimate, produced * 9 / 10) << spec.ToString();
    }
  }
}

}  // namespace
}  // namespace centroidkv::service
