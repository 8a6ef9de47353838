// WorkExecutor: tbb::task_arena::enqueue plus a pending-task counter for shutdown.
#include "service/executor.h"

#include <thread>
#include <utility>

namespace centroidkv::service {

WorkExecutor::WorkExecutor(int32_t threads)
    : threads_(threads > 0 ? threads
                           : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()))),
      arena_(std::make_unique<tbb::task_arena>(threads_)) {}

WorkExecutor::~WorkExecutor() { WaitIdle(std::chrono::hours(1)); }

void WorkExecutor::Submit(std::function<void()> task) {
  pending_.fetch_add(1);
  queued_.fetch_add(1);
  arena_->enqueue([this, task = std::move(task)] {
    queued_.fetch_sub(1);
    task();
    if (pending_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.notify_all();
    }
  });
}

bool WorkExecutor::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, timeout, [this] { return pending_.load() == 0; });
}

}  // namespace centroidkv::service
