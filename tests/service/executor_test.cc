// WorkExecutor: an executor of N threads runs N tasks at once (its arena's slots are all for
// oneTBB workers), and WaitIdle sees every task finish.
#include "service/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>
#include <chrono>
#include <thread>

namespace centroidkv::service {
namespace {

// Each task waits (up to a few seconds) until `threads` tasks run at the same time, so the
// peak is `threads` when the executor really has that many threads and lower otherwise.
int32_t PeakConcurrency(int32_t threads) {
  WorkExecutor executor(threads);
  EXPECT_EQ(executor.threads(), threads);
  std::atomic<int32_t> running{0}, peak{0};
  for (int32_t i = 0; i < 2 * threads; ++i) {
    executor.Submit([&] {
      const int32_t now = running.fetch_add(1) + 1;
      int32_t seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {
      }
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (peak.load() < threads && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      running.fetch_sub(1);
    });
  }
  EXPECT_TRUE(executor.WaitIdle(std::chrono::seconds(30)));
  EXPECT_EQ(executor.pending(), 0);
  return peak.load();
}

TEST(WorkExecutorTest, QueuedTasksRunHighestPriorityFirstThenInOrder) {
  WorkExecutor executor(1);
  std::atomic<bool> release{false}, started{false};
  std::mutex mu;
  std::vector<int> order;
  executor.Submit([&] {  // holds the one thread until the others are queued
    started.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int priorities[] = {0, 3, -1, 3, 7, 0};
  for (int i = 0; i < 6; ++i) {
    executor.Submit(
        [&, i] {
          std::lock_guard<std::mutex> lock(mu);
          order.push_back(i);
        },
        priorities[i]);
  }
  EXPECT_EQ(executor.queued(), 6);
  release.store(true);
  ASSERT_TRUE(executor.WaitIdle(std::chrono::seconds(30)));
  EXPECT_EQ(order, (std::vector<int>{4, 1, 3, 0, 5, 2}));
}

TEST(WorkExecutorTest, RunsAsManyTasksAtOnceAsItHasThreads) {
  // oneTBB's defaults would give an arena of 2 enqueued-only slots a single worker.
  EXPECT_EQ(PeakConcurrency(2), 2);
  EXPECT_EQ(PeakConcurrency(3), 3);
}

// One thread, held busy while owner 1 queues ten tasks and owner 2 then one: owner 2's task
// runs second, not eleventh (round-robin across owners, FIFO within one).
TEST(WorkExecutorTest, OneOwnersBacklogDoesNotStarveAnother) {
  WorkExecutor executor(1);
  std::atomic<bool> release{false};
  std::mutex mu;
  std::vector<int> order;
  executor.Submit([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (executor.queued() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; i < 10; ++i) {
    executor.Submit(
        [&, i] {
          std::lock_guard<std::mutex> lock(mu);
          order.push_back(i);
        },
        0, 1);
  }
  executor.Submit(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(100);
      },
      0, 2);
  release.store(true);
  ASSERT_TRUE(executor.WaitIdle(std::chrono::seconds(30)));
  ASSERT_EQ(order.size(), 11u);
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], 100);
  for (int i = 2; i < 11; ++i) EXPECT_EQ(order[i], i - 1);
}

}  // namespace
}  // namespace centroidkv::service
