// The server's pool of job input buffers, the peer of ResultPool: freed input buffers are
// kept for the next job of the same size (the layers of a model share a shape), so that a
// job's input (~17 MB for a 4k-token Llama-3-8B layer) is not faulted in again. Buffers are
// handed out uninitialised: every byte is written by a slab before a job is complete
// (zeroing and faulting in fresh buffers was ~10-30% of a server's CPU samples,
// docs/results/service-bench.md). Idle buffers are bounded by bytes (--max-pooled-input-bytes);
// buffers under min_pooled_bytes are left to the heap. Counted in /metrics.
// Thread-safe; buffers are freed outside the lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace centroidkv::service {

class InputPool;

// Returns a leased buffer to its pool (or frees it when it has none).
struct InputReturner {
  std::shared_ptr<InputPool> pool;
  uint64_t size = 0;
  void operator()(uint8_t* bytes) const;
};
using PooledInput = std::unique_ptr<uint8_t[], InputReturner>;

class InputPool : public std::enable_shared_from_this<InputPool> {
 public:
  struct Limits {
    uint64_t max_idle_bytes = uint64_t{512} << 20;  // 0 = keep nothing
    uint64_t min_pooled_bytes = uint64_t{1} << 20;  // smaller buffers come from the heap
  };
  struct Stats {
    int64_t idle_buffers = 0;
    uint64_t idle_bytes = 0;
    int64_t leased = 0;   // buffers held by jobs now
    uint64_t leased_bytes = 0;
    int64_t reused = 0;   // leases served from an idle buffer
    int64_t created = 0;  // leases that allocated
    int64_t trimmed = 0;  // idle buffers freed to stay within the limit
  };

  // Leases keep the pool alive, so it is always created shared.
  static std::shared_ptr<InputPool> Create(Limits limits);
  ~InputPool();
  InputPool(const InputPool&) = delete;
  InputPool& operator=(const InputPool&) = delete;

  // A buffer of exactly `size` bytes (uninitialised); the most recently returned one of
  // that size first, as its pages are likely still cached.
  PooledInput Acquire(uint64_t size);

  Stats stats() const;
  const Limits& limits() const { return limits_; }

 private:
  friend struct InputReturner;
  explicit InputPool(Limits limits) : limits_(limits) {}
  void Return(uint8_t* bytes, uint64_t size);

  const Limits limits_;
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, uint8_t*>> idle_;  // (size, bytes), oldest first
  Stats stats_;
};

}  // namespace centroidkv::service
