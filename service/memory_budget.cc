// MemoryBudget: a counter under a mutex, plus a waiter list drained on every release.
#include "service/memory_budget.h"

#include <utility>

namespace centroidkv::service {

uint64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

bool MemoryBudget::TryReserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > capacity_ - used_) return false;
  used_ += bytes;
  return true;
}

void MemoryBudget::Release(uint64_t bytes) {
  std::map<WaiterId, std::function<void()>> woken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = bytes > used_ ? 0 : used_ - bytes;
    woken.swap(waiters_);
  }
  for (auto& [id, wake] : woken) wake();
}

MemoryBudget::WaiterId MemoryBudget::Wait(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  const WaiterId id = next_id_++;
  waiters_.emplace(id, std::move(wake));
  return id;
}

bool MemoryBudget::HasWaiters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiters_.empty();
}

bool MemoryBudget::CancelWait(WaiterId id) {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.erase(id) > 0;
}

}  // namespace centroidkv::service
