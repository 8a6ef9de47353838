// The server's one pool of clustering threads: a oneTBB task arena that gRPC handlers hand
// work to without blocking. Backends that parallelise internally (tbb::parallel_for) run
// inside the same arena, so there is no oversubscription.
//
// Work only ever arrives by enqueue, so no application thread joins the arena: its slots
// are all for oneTBB workers (reserved_for_masters = 0), and a tbb::global_control lets
// oneTBB start as many workers as the arena has slots. oneTBB's defaults (one slot kept
// for an application thread, at most hardware_concurrency - 1 workers) would run the
// clustering on `threads - 1` threads: one thread on a 2-core machine.
// Tasks wait in queues ordered by priority (higher first). Within one priority they are
// fair across owners (a stream): owners with work waiting take turns round-robin, and one
// owner's tasks run in submission order, so one stream's backlog of big jobs cannot starve
// another stream's tiny job. Each task handed to the arena runs whichever queued task is
// first in that order at that moment.
// Thread-safe. The destructor waits for submitted work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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
  // Queues `task`; returns at once. Higher `priority` runs first among tasks not started;
  // among equal priorities `owner`s (any stable key, e.g. the submitting stream's address)
  // take turns, each owner's tasks in submission order.
  void Submit(std::function<void()> task, int32_t priority = 0, uintptr_t owner = 0);
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
  // Runs the first queued task in that order (one per Submit, so none is left behind).
  void RunNext();

  std::mutex mu_;
  std::condition_variable idle_;
  // Owners with work at one priority, and the order they get their next turn in.
  struct Level {
    std::map<uintptr_t, std::deque<std::function<void()>>> queues;
    std::deque<uintptr_t> turns;
  };
  std::mutex queue_mu_;
  std::map<int32_t, Level, std::greater<int32_t>> levels_;  // only levels with work
};

}  // namespace centroidkv::service
