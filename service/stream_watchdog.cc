// StreamWatchdog: a sleeping thread that visits the stream registry once per tick.
#include "service/stream_watchdog.h"

#include <algorithm>
#include <utility>

#include "service/compress_reactor.h"
#include "service/service_context.h"

namespace centroidkv::service {

StreamWatchdog::StreamWatchdog(StreamRegistry* streams, std::chrono::milliseconds tick,
                               std::function<bool()> contended)
    : streams_(streams),
      tick_(tick),
      contended_(std::move(contended)),
      thread_([this] { Run(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::chrono::milliseconds StreamWatchdog::TickFor(
    std::chrono::milliseconds incomplete_job_timeout,
    std::chrono::milliseconds idle_stream_timeout) {
  const auto shorter = std::min(incomplete_job_timeout, idle_stream_timeout);
  return std::clamp<std::chrono::milliseconds>(shorter / 4, std::chrono::milliseconds(10),
                                               std::chrono::milliseconds(1000));
}

void StreamWatchdog::Run() {
  const std::chrono::milliseconds step = contended_ ? std::min(tick_, kContendedTick) : tick_;
  auto next_visit = std::chrono::steady_clock::now() + tick_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, step, [this] { return stop_; })) {
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_visit || (contended_ && contended_())) {
      next_visit = now + tick_;
      streams_->ForEach([now](CompressReactor* reactor) { reactor->CheckTimeouts(now); });
    }
    lock.lock();
  }
}

}  // namespace centroidkv::service
