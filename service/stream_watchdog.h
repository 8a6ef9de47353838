// Timeouts of the live streams: a thread that, every `tick`, asks each registered stream
// to fail its jobs that have been incomplete (reserved memory, slabs still missing) for
// longer than ServerOptions::incomplete_job_timeout, and to end itself if it has been idle
// (nothing read or written, no job) for longer than idle_stream_timeout. So reserved-but-unfilled space
// expires and an abandoned stream does not hold a slot for ever. While `contended()` says
// a job waits for memory, the streams are visited every kContendedTick instead, so that
// reservations not earned (ServerOptions::min_receive_bytes_per_second) yield soon.
// Thread-safe; the destructor stops and joins the thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace centroidkv::service {

class StreamRegistry;

class StreamWatchdog {
 public:
  static constexpr std::chrono::milliseconds kContendedTick{20};

  // `contended` (may be empty): asked every kContendedTick.
  StreamWatchdog(StreamRegistry* streams, std::chrono::milliseconds tick,
                 std::function<bool()> contended = {});
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // A tick short enough to end a stream within about a quarter of the shorter timeout
  // past it (at least 10 ms, at most 1 s).
  static std::chrono::milliseconds TickFor(std::chrono::milliseconds incomplete_job_timeout,
                                           std::chrono::milliseconds idle_stream_timeout);

 private:
  void Run();

  StreamRegistry* const streams_;
  const std::chrono::milliseconds tick_;
  const std::function<bool()> contended_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace centroidkv::service
