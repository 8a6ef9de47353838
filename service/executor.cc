// WorkExecutor: a priority queue of tasks, tbb::task_arena::enqueue to run them, and a
// pending-task counter for shutdown.
#include "service/executor.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace centroidkv::service {

namespace {
int32_t ResolveThreads(int32_t threads) {
  return threads > 0 ? threads
                     : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

WorkExecutor::WorkExecutor(int32_t threads)
    : threads_(ResolveThreads(threads)),
      // threads_ workers plus the one application thread oneTBB counts in the limit.
      workers_(tbb::global_control::max_allowed_parallelism,
               static_cast<size_t>(threads_) + 1),
      arena_(std::make_unique<tbb::task_arena>(threads_, /*reserved_for_masters=*/0)) {}

WorkExecutor::~WorkExecutor() { WaitIdle(std::chrono::hours(1)); }

void WorkExecutor::Submit(std::function<void()> task, int32_t priority) {
  pending_.fetch_add(1);
  queued_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push(Queued{priority, next_sequence_++, std::move(task)});
  }
  arena_->enqueue([this] { RunNext(); });
}

void WorkExecutor::RunNext() {
  std::function<void()> task;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    // One arena task per queued task: the queue is never empty here.
    task = std::move(const_cast<Queued&>(queue_.top()).task);
    queue_.pop();
  }
  queued_.fetch_sub(1);
  task();
  if (pending_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.notify_all();
  }
}

bool WorkExecutor::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, timeout, [this] { return pending_.load() == 0; });
}

}  // namespace centroidkv::service
