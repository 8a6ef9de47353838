// StreamWatchdog: a sleeping thread that visits the stream registry once per tick.
#include "service/stream_watchdog.h"

#include <algorithm>

#include "service/compress_reactor.h"
#include "service/service_context.h"

namespace centroidkv::service {

StreamWatchdog::StreamWatchdog(StreamRegistry* streams, std::chrono::milliseconds tick)
    : streams_(streams), tick_(tick), thread_([this] { Run(); }) {}

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
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, tick_, [this] { return stop_; })) {
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    streams_->ForEach([now](CompressReactor* reactor) { reactor->CheckTimeouts(now); });
    lock.lock();
  }
}

}  // namespace centroidkv::service
