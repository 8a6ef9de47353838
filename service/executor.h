// The server's one pool of clustering threads: a oneTBB task arena that gRPC handlers hand
// work to without blocking. Backends that parallelise internally (tbb::parallel_for) run
// inside the same arena, so there is no oversubscription.
//
// Work only ever arrives by enqueue, so no application thread joins the arena: its slots
// are all for oneTBB workers (reserved_for_masters = 0), and a tbb::global_control lets
// oneTBB start as many workers as the arena has slots. oneTBB's defaults (one slot kept
// for an application thread, at most hardware_concurrency - 1 workers) would run the
// clustering on `threads - 1` threads: one thread on a 2-core machine.
// Tasks wait in one queue ordered by priority (higher first, then in submission order):
// each task handed to the arena runs whichever queued task is first at that moment.
// Thread-safe. The destructor waits for submitted work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

namespace centroidkv::service {

class WorkExecutor {
 public:
  // `threads` <= 0: one per hardware thread.
  explicit WorkExecutor(int32_t threads);
  ~WorkExecutor();

  int32_t threads() const { return threads_; }
  // Queues `task`; returns at once. Higher `priority` runs first among tasks not started.
  void Submit(std::function<void()> task, int32_t priority = 0);
  // Tasks submitted and not yet finished.
  int64_t pending() const { return pending_.load(); }
  // Tasks submitted and not yet started (the queue depth).
  int64_t queued() const { return queued_.load(); }
  // Waits until no task is pending or `timeout` passes; returns true when idle.
  bool WaitIdle(std::chrono::milliseconds timeout);

 private:
  int32_t threads_;
  // Process-wide while it lives; oneTBB applies the smallest of the live limits.
  tbb::global_control workers_;
  std::unique_ptr<tbb::task_arena> arena_;
  std::atomic<int64_t> pending_{0};
  std::atomic<int64_t> queued_{0};
  struct Queued {
    int32_t priority;
    uint64_t sequence;
    std::function<void()> task;
    bool operator<(const Queued& other) const {  // the heap's top is the greatest
      return priority != other.priority ? priority < other.priority : sequence > other.sequence;
    }
  };
  // Runs the queue's first task (one per Submit).
  void RunNext();

  std::mutex mu_;
  std::condition_variable idle_;
  std::mutex queue_mu_;
  std::priority_queue<Queued> queue_;
  uint64_t next_sequence_ = 0;
};

}  // namespace centroidkv::service
