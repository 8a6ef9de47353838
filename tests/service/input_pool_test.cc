// Tests of service/input_pool.cc: a freed buffer serves the next job of exactly its size
// (the most recently returned first), small buffers are left to the heap, idle bytes never
// exceed the limit (the oldest go first), the stats count every lease, and a lease outlives
// the server's handle on the pool.
#include "service/input_pool.h"

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"

namespace centroidkv::service {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(InputPoolTest, AFreedBufferServesTheNextJobOfItsSize) {
  auto pool = InputPool::Create({.max_idle_bytes = 64 * kMiB, .min_pooled_bytes = kMiB});
  uint8_t* first = nullptr;
  {
    PooledInput buffer = pool->Acquire(4 * kMiB);
    first = buffer.get();
    EXPECT_EQ(pool->stats().leased, 1);
    EXPECT_EQ(pool->stats().leased_bytes, 4 * kMiB);
  }
  EXPECT_EQ(pool->stats().leased, 0);
  EXPECT_EQ(pool->stats().idle_buffers, 1);
  EXPECT_EQ(pool->stats().idle_bytes, 4 * kMiB);
  PooledInput other_size = pool->Acquire(2 * kMiB);
  EXPECT_NE(other_size.get(), first) << "only an exact size is reused";
  PooledInput same_size = pool->Acquire(4 * kMiB);
  EXPECT_EQ(same_size.get(), first);
  EXPECT_EQ(pool->stats().reused, 1);
  EXPECT_EQ(pool->stats().created, 2);
  EXPECT_EQ(pool->stats().idle_buffers, 0);
}

TEST(InputPoolTest, TheMostRecentlyReturnedBufferComesFirst) {
  auto pool = InputPool::Create({.max_idle_bytes = 64 * kMiB, .min_pooled_bytes = kMiB});
  PooledInput a = pool->Acquire(2 * kMiB), b = pool->Acquire(2 * kMiB);
  uint8_t* later = b.get();
  a.reset();
  b.reset();
  EXPECT_EQ(pool->Acquire(2 * kMiB).get(), later);
}

TEST(InputPoolTest, SmallBuffersAreLeftToTheHeap) {
  auto pool = InputPool::Create({.max_idle_bytes = 64 * kMiB, .min_pooled_bytes = kMiB});
  { PooledInput small = pool->Acquire(kMiB - 1); }
  EXPECT_EQ(pool->stats().idle_buffers, 0);
  EXPECT_EQ(pool->stats().leased, 0);
  EXPECT_EQ(pool->stats().created, 1);
}

TEST(InputPoolTest, IdleBytesStayWithinTheLimitOldestFreedFirst) {
  auto pool = InputPool::Create({.max_idle_bytes = 5 * kMiB, .min_pooled_bytes = kMiB});
  PooledInput a = pool->Acquire(2 * kMiB), b = pool->Acquire(2 * kMiB), c = pool->Acquire(3 * kMiB);
  uint8_t* newest = c.get();
  a.reset();
  b.reset();
  EXPECT_EQ(pool->stats().idle_bytes, 4 * kMiB);
  c.reset();  // 4 + 3 > 5 MiB: the oldest 2 MiB buffer goes to make room
  EXPECT_LE(pool->stats().idle_bytes, 5 * kMiB);
  EXPECT_EQ(pool->stats().idle_bytes, 5 * kMiB);
  EXPECT_EQ(pool->stats().trimmed, 1);
  EXPECT_EQ(pool->Acquire(3 * kMiB).get(), newest);
  // A buffer larger than the whole limit is never kept.
  { PooledInput huge = pool->Acquire(6 * kMiB); }
  EXPECT_LE(pool->stats().idle_bytes, 5 * kMiB);
}

TEST(InputPoolTest, NoPoolWhenTheLimitIsZero) {
  auto pool = InputPool::Create({.max_idle_bytes = 0, .min_pooled_bytes = kMiB});
  { PooledInput buffer = pool->Acquire(2 * kMiB); }
  EXPECT_EQ(pool->stats().idle_buffers, 0);
  EXPECT_EQ(pool->stats().idle_bytes, 0u);
}

TEST(InputPoolTest, ALeaseOutlivesTheServersHandle) {
  auto pool = InputPool::Create({.max_idle_bytes = 64 * kMiB, .min_pooled_bytes = kMiB});
  std::weak_ptr<InputPool> weak = pool;
  {
    PooledInput buffer = pool->Acquire(2 * kMiB);
    pool.reset();
    EXPECT_FALSE(weak.expired()) << "the lease keeps its pool alive";
    buffer[0] = 1;
    buffer[2 * kMiB - 1] = 2;
  }
  EXPECT_TRUE(weak.expired()) << "the last lease gone, the pool (and its idle buffer) is freed";
}

}  // namespace
}  // namespace centroidkv::service
