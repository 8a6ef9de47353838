// Per-caller accounting: how many streams each caller identity has open, and how many jobs
// and bytes it has admitted and not yet answered, against SecurityOptions' per-caller
// limits. A stream holds a CallerStream handle; the reactor calls AdmitJob when a job is
// announced and ReleaseJob when the job's footprint is released, and whatever a handle
// still holds is released when it is destroyed, so an account can never leak.
// Thread-safe: one lock over all accounts (a few integer updates per job).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace centroidkv::service {

struct CallerLimits {  // 0 = unlimited
  int32_t max_streams = 0;
  int32_t max_jobs = 0;
  uint64_t max_bytes = 0;
};

struct CallerUsage {
  int32_t streams = 0;
  int32_t jobs = 0;
  uint64_t bytes = 0;
};

class CallerStream;

class CallerRegistry {
 public:
  explicit CallerRegistry(const CallerLimits& limits) : limits_(limits) {}
  CallerRegistry(const CallerRegistry&) = delete;
  CallerRegistry& operator=(const CallerRegistry&) = delete;

  // A stream slot for `caller`, or RESOURCE_EXHAUSTED when it already has max_streams.
  // The handle must not outlive the registry.
  absl::StatusOr<std::unique_ptr<CallerStream>> OpenStream(const std::string& caller);
  CallerUsage usage(const std::string& caller) const;
  const CallerLimits& limits() const { return limits_; }

 private:
  friend class CallerStream;
  absl::Status Admit(const std::string& caller, uint64_t bytes);
  void Release(const std::string& caller, int32_t streams, int32_t jobs, uint64_t bytes);

  const CallerLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, CallerUsage> accounts_;  // callers with something held
};

// One stream's share of its caller's account. Not thread-safe: the reactor calls it under
// its own lock.
class CallerStream {
 public:
  CallerStream(CallerRegistry* registry, std::string caller)
      : registry_(registry), caller_(std::move(caller)) {}
  ~CallerStream();
  CallerStream(const CallerStream&) = delete;
  CallerStream& operator=(const CallerStream&) = delete;

  const std::string& caller() const { return caller_; }
  // Admits one job of `bytes` (its footprint), or RESOURCE_EXHAUSTED naming the limit.
  absl::Status AdmitJob(uint64_t bytes);
  // Releases one admitted job of `bytes`. 0 bytes (a reply for a job never admitted,
  // e.g. refused while draining) releases nothing.
  void ReleaseJob(uint64_t bytes);
  // The stream has ended: its slot is free for another stream of the caller. Jobs still
  // computing stay counted until they are released (or this handle is destroyed).
  void EndStream();

 private:
  CallerRegistry* const registry_;
  const std::string caller_;
  bool stream_open_ = true;
  int32_t jobs_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace centroidkv::service
