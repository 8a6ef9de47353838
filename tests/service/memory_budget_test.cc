// MemoryBudget: reservations never exceed the capacity, and waiters are woken on release.
#include "service/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace centroidkv::service {
namespace {

TEST(MemoryBudgetTest, ReservesUpToCapacityAndNoMore) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_FALSE(budget.TryReserve(41));
  EXPECT_TRUE(budget.TryReserve(40));
  EXPECT_EQ(budget.used(), 100u);
  budget.Release(100);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(MemoryBudgetTest, ReleaseWakesEachWaiterOnce) {
  MemoryBudget budget(10);
  ASSERT_TRUE(budget.TryReserve(10));
  int woken = 0;
  budget.Wait([&woken] { ++woken; });
  budget.Wait([&woken] { ++woken; });
  budget.Release(5);
  EXPECT_EQ(woken, 2);
  budget.Release(5);
  EXPECT_EQ(woken, 2) << "a waiter is woken once, then must register again";
}

TEST(MemoryBudgetTest, CancelledWaiterIsNotWoken) {
  MemoryBudget budget(10);
  bool woken = false;
  const MemoryBudget::WaiterId id = budget.Wait([&woken] { woken = true; });
  EXPECT_TRUE(budget.CancelWait(id));
  EXPECT_FALSE(budget.CancelWait(id));
  budget.Release(0);
  EXPECT_FALSE(woken);
}

TEST(MemoryBudgetTest, ConcurrentReservationsNeverOvercommit) {
  MemoryBudget budget(1000);
  std::atomic<bool> overcommitted{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (budget.TryReserve(300)) {
          if (budget.used() > 1000) overcommitted = true;
          budget.Release(300);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(overcommitted.load());
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace centroidkv::service
