// WorkExecutor: queues per priority and per owner (round-robin across owners) drained by
// tbb::task_arena::enqueue'd runners, plus a pending-task counter for shutdown.
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

void WorkExecutor::Submit(std::function<void()> task, int32_t priority, uintptr_t owner) {
  pending_.fetch_add(1);
  queued_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    Level& level = levels_[priority];
    std::deque<std::function<void()>>& queue = level.queues[owner];
    if (queue.empty()) level.turns.push_back(owner);
    queue.push_back(std::move(task));
  }
  arena_->enqueue([this] { RunNext(); });
}

void WorkExecutor::RunNext() {
  std::function<void()> task;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    // One arena task per queued task: there is always a level with work here.
    auto level = levels_.begin();
    const uintptr_t owner = level->second.turns.front();
    level->second.turns.pop_front();
    auto queue = level->second.queues.find(owner);
    task = std::move(queue->second.front());
    queue->second.pop_front();
    if (queue->second.empty()) {
      level->second.queues.erase(queue);
      if (level->second.queues.empty()) levels_.erase(level);
    } else {
      level->second.turns.push_back(owner);  // its next task waits for every other owner's turn
    }
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
