// The server's one pool of clustering threads: a oneTBB task arena that gRPC handlers hand
// work to without blocking. Backends that parallelise internally (tbb::parallel_for) run
// inside the same arena, so there is no oversubscription.
// Thread-safe. The destructor waits for submitted work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include <tbb/task_arena.h>

namespace centroidkv::service {

class WorkExecutor {
 public:
  // `threads` <= 0: one per hardware thread.
  explicit WorkExecutor(int32_t threads);
  ~WorkExecutor();

  int32_t threads() const { return threads_; }
  // Queues `task`; returns at once.
  void Submit(std::function<void()> task);
  // Tasks submitted and not yet finished.
  int64_t pending() const { return pending_.load(); }
  // Tasks submitted and not yet started (the queue depth).
  int64_t queued() const { return queued_.load(); }
  // Waits until no task is pending or `timeout` passes; returns true when idle.
  bool WaitIdle(std::chrono::milliseconds timeout);

 private:
  int32_t threads_;
  std::unique_ptr<tbb::task_arena> arena_;
  std::atomic<int64_t> pending_{0};
  std::atomic<int64_t> queued_{0};
  std::mutex mu_;
  std::condition_variable idle_;
};

}  // namespace centroidkv::service
