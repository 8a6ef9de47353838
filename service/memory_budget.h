// A byte budget shared by all streams: the server's bound on buffered KV data. A stream
// that cannot reserve what it needs registers as a waiter and stops reading; it is woken
// when bytes are released (backpressure instead of unbounded memory).
// Idle result buffers kept for reuse are not in this budget: ResultPool bounds them
// separately (ServerOptions::max_pooled_result_bytes); a leased buffer is part of its job's
// footprint here.
// Thread-safe. Waiters are called without the budget's lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace centroidkv::service {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;

  // Reserves `bytes` if they fit; otherwise returns false and reserves nothing.
  bool TryReserve(uint64_t bytes);
  // Returns bytes and wakes every registered waiter once (they retry TryReserve).
  void Release(uint64_t bytes);

  using WaiterId = uint64_t;
  // Registers `wake`, called once on a later Release. Returns a handle for CancelWait.
  WaiterId Wait(std::function<void()> wake);
  // Removes a waiter that has not been woken yet; returns false if it was already taken
  // by a Release (its wake function has run or is about to run).
  bool CancelWait(WaiterId id);
  // Whether some reservation is waiting for bytes (the budget is contended).
  bool HasWaiters() const;

 private:
  const uint64_t capacity_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  WaiterId next_id_ = 1;
  std::map<WaiterId, std::function<void()>> waiters_;
};

}  // namespace centroidkv::service
