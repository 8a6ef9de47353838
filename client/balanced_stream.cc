// BalancedStream: lanes, dispatch, retries with backoff, deadlines, exactly-once delivery.
#include "client/balanced_stream.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace centroidkv::client {
namespace {

// A stream-ending error the server raises over one job's content or limits: resending the
// job cannot help. Whatever else ends a lane (UNAVAILABLE, a reset, INTERNAL, CANCELLED by
// the server, an end with jobs unanswered) is the replica's failure, and its jobs are resent.
bool IsJobFault(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

// A per-job answer that asks for the job to be sent elsewhere (a draining replica).
bool IsRetryableAnswer(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted;
}

}  // namespace

BalancedStream::BalancedStream(std::shared_ptr<ReplicaPool::Core> core)
    : core_(std::move(core)), options_(core_->options), random_(std::random_device{}()) {
  timer_ = std::thread([this] { TimerLoop(); });
}

BalancedStream::~BalancedStream() {
  {
    // Like GrpcCompressStream: a stream destroyed without Close() is cancelled (a
    // graceful close could wait on a replica that no longer answers).
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty()) aborted_ = true;
    stopping_ = true;
    for (auto& lane : lanes_) {
      lane->retiring = true;
      lane->stream->Abort();
    }
    changed_.notify_all();
  }
  timer_.join();
  // No lane is added or erased once stopping_ is set.
  for (auto& lane : lanes_) lane->reader.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& lane : lanes_) AddInFlightLocked(*lane, -static_cast<int64_t>(lane->in_flight.size()));
}

// ---------------------------------------------------------------------------------------
// Public calls.

absl::StatusOr<uint64_t> BalancedStream::Submit(const LayerJob& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return absl::CancelledError("the stream was aborted");
  if (closing_) return absl::FailedPreconditionError("the stream is closing");
  const uint64_t id = next_job_id_++;
  Job& added = jobs_[id];
  added.job = job;
  if (options_.job_deadline.count() > 0) {
    added.deadline = Clock::now() + options_.job_deadline;
    deadlines_.emplace(added.deadline, id);
  }
  ready_.push_back(id);
  ++outstanding_;
  Stats([](PoolStats& s) { ++s.submitted; });
  PumpLocked();
  changed_.notify_all();  // the timer may have a new deadline to wait for
  return id;
}

absl::Status BalancedStream::Cancel(uint64_t job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (DropCompleted(completed_, job_id)) {
    --outstanding_;
    changed_.notify_all();
    return absl::OkStatus();
  }
  if (jobs_.count(job_id) > 0) {
    DropLocked(job_id);
    --outstanding_;
    PumpLocked();
    changed_.notify_all();
    return absl::OkStatus();
  }
  if (job_id == 0 || job_id >= next_job_id_) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " was not submitted on this stream"));
  }
  return absl::OkStatus();  // already returned by Next(), or cancelled before
}

absl::StatusOr<LayerResult> BalancedStream::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return !completed_.empty() || outstanding_ <= 0 || aborted_; });
  if (!completed_.empty()) {
    LayerResult result = std::move(completed_.front());
    completed_.pop_front();
    --outstanding_;
    return result;
  }
  if (aborted_) return absl::CancelledError("the stream was aborted");
  return absl::OutOfRangeError("every submitted job has been returned");
}

absl::Status BalancedStream::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  closing_ = true;
  changed_.wait(lock, [this] { return jobs_.empty() || aborted_; });
  for (auto& lane : lanes_) lane->retiring = true;
  changed_.notify_all();
  changed_.wait(lock, [this] {
    return std::all_of(lanes_.begin(), lanes_.end(),
                       [](const std::unique_ptr<Lane>& lane) { return lane->ended; });
  });
  ReapLanesLocked();
  return aborted_ ? absl::CancelledError("the stream was aborted") : absl::OkStatus();
}

void BalancedStream::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  for (auto& lane : lanes_) {
    lane->retiring = true;
    AddInFlightLocked(*lane, -static_cast<int64_t>(lane->in_flight.size()));
    lane->in_flight.clear();
    lane->stream->Abort();
  }
  jobs_.clear();
  ready_.clear();
  delayed_.clear();
  deadlines_.clear();
  outstanding_ = static_cast<int64_t>(completed_.size());
  changed_.notify_all();
}

// ---------------------------------------------------------------------------------------
// Dispatch.

void BalancedStream::PumpLocked() {
  if (stopping_) return;
  const Clock::time_point now = Clock::now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    const uint64_t id = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    jobs_.at(id).state = JobState::kReady;
    ready_.push_front(id);  // resends go first
  }
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const uint64_t id = deadlines_.begin()->second;
    const int32_t sends = jobs_.at(id).failures + 1;
    Stats([](PoolStats& s) { ++s.deadline_exceeded; });
    DeliverErrorLocked(id, absl::DeadlineExceededError(absl::StrCat(
                               "the job's deadline of ", options_.job_deadline.count(),
                               " ms passed (send ", sends, ")")));
  }
  if (!aborted_) DispatchLocked();
  ReapLanesLocked();
}

void BalancedStream::DispatchLocked() {
  const size_t window = static_cast<size_t>(options_.jobs_per_stream);
  while (!ready_.empty()) {
    const uint64_t id = ready_.front();
    auto found = jobs_.find(id);
    if (found == jobs_.end() || found->second.state != JobState::kReady) {
      ready_.pop_front();  // stale: cancelled, answered, or queued again elsewhere
      continue;
    }
    Job& job = found->second;
    Lane* lane = nullptr;
    if (job.solo) {
      lane = OpenLaneLocked(/*solo=*/true);
    } else {
      int32_t active = 0;
      for (const auto& candidate : lanes_) {
        if (candidate->solo || candidate->retiring) continue;
        ++active;
        if (candidate->in_flight.size() < window &&
            (lane == nullptr || candidate->in_flight.size() < lane->in_flight.size())) {
          lane = candidate.get();
        }
      }
      // Spread over every lane before stacking jobs on one.
      if ((lane == nullptr || !lane->in_flight.empty()) && active < options_.streams) {
        lane = OpenLaneLocked(/*solo=*/false);
      }
      if (lane == nullptr) return;  // every lane is full
    }
    absl::StatusOr<uint64_t> lane_job_id = lane->stream->Submit(job.job);
    if (!lane_job_id.ok()) {
      // The lane ended before the job went out. A lane that carried jobs before has
      // simply died meanwhile (its reader will tell): the job was never sent, try the next
      // lane. A fresh one that cannot take a first job (no replica reachable) counts as a
      // failed send, so that the backoff paces the next try.
      lane->retiring = true;
      changed_.notify_all();
      if (lane->assigned > 0) continue;
      ready_.pop_front();
      RetryLocked(id, absl::UnavailableError(absl::StrCat(
                          "the stream ended before the job was sent: ",
                          lane_job_id.status().ToString())));
      continue;
    }
    ready_.pop_front();
    job.state = JobState::kInFlight;
    job.lane = lane;
    job.lane_job_id = *lane_job_id;
    lane->in_flight[*lane_job_id] = id;
    ++lane->assigned;
    AddInFlightLocked(*lane, 1);
    if (lane->solo ||
        (options_.stream_job_limit > 0 && lane->assigned >= options_.stream_job_limit)) {
      lane->retiring = true;
    }
    changed_.notify_all();  // the lane's reader waits for work
  }
}

BalancedStream::Lane* BalancedStream::OpenLaneLocked(bool solo) {
  auto lane = std::make_unique<Lane>();
  lane->solo = solo;
  lane->stream = std::make_unique<GrpcCompressStream>(core_->stub.get(), options_.client);
  Lane* raw = lane.get();
  lane->reader = std::thread([this, raw] { ReaderLoop(raw); });
  lanes_.push_back(std::move(lane));
  Stats([](PoolStats& s) { ++s.streams_opened; });
  return raw;
}

void BalancedStream::ReapLanesLocked() {
  if (stopping_) return;
  const std::thread::id self = std::this_thread::get_id();
  for (auto it = lanes_.begin(); it != lanes_.end();) {
    Lane& lane = **it;
    if (lane.ended && lane.reader.get_id() != self) {
      lane.reader.join();  // it has released mu_ for good
      it = lanes_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Answers.

void BalancedStream::ReaderLoop(Lane* lane) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [this, lane] {
      return !lane->in_flight.empty() || lane->retiring || stopping_ || aborted_;
    });
    if (lane->in_flight.empty()) break;  // retiring, stopping or aborted, and idle
    lock.unlock();
    absl::StatusOr<LayerResult> answer = lane->stream->Next();
    lock.lock();
    if (answer.ok()) {
      HandleAnswerLocked(lane, *std::move(answer));
    } else if (answer.status().code() != absl::StatusCode::kOutOfRange) {
      HandleLaneEndLocked(lane, answer.status());
      break;
    }  // OutOfRange: every job it carried was cancelled meanwhile
    PumpLocked();
  }
  lane->retiring = true;
  const bool broken = lane->broken;
  lock.unlock();
  if (!broken) lane->stream->Close().IgnoreError();  // half-close; the server ends it
  lock.lock();
  lane->ended = true;
  PumpLocked();  // a lane slot is free
  changed_.notify_all();
}

void BalancedStream::HandleAnswerLocked(Lane* lane, LayerResult result) {
  if (lane->peer.empty()) {
    // Initial metadata has arrived with this answer, so gRPC knows the peer.
    lane->peer = lane->stream->peer();
    const auto moved = static_cast<int64_t>(lane->in_flight.size());
    Stats([&](PoolStats& s) {
      s.replicas[""].in_flight -= moved;
      s.replicas[lane->peer].in_flight += moved;
    });
  }
  auto it = lane->in_flight.find(result.job_id);
  if (it == lane->in_flight.end()) return;  // cancelled or expired meanwhile: dropped
  const uint64_t id = it->second;
  lane->in_flight.erase(it);
  AddInFlightLocked(*lane, -1);
  Job& job = jobs_.at(id);
  job.lane = nullptr;
  job.state = JobState::kReady;  // neither queued nor in flight until decided below
  if (!result.status.ok() && IsRetryableAnswer(result.status.code())) {
    lane->retiring = true;  // the replica drains: no more jobs for this lane
    Stats([&](PoolStats& s) {
      ++s.job_unavailable;
      ++s.replicas[lane->peer].resent;
    });
    RetryLocked(id, result.status);
    return;
  }
  if (result.status.ok()) Stats([&](PoolStats& s) { ++s.replicas[lane->peer].results; });
  DeliverLocked(id, std::move(result));
}

void BalancedStream::HandleLaneEndLocked(Lane* lane, const absl::Status& status) {
  lane->broken = true;
  lane->retiring = true;
  std::vector<uint64_t> ids;
  for (const auto& [lane_job_id, id] : lane->in_flight) ids.push_back(id);
  AddInFlightLocked(*lane, -static_cast<int64_t>(ids.size()));
  lane->in_flight.clear();
  if (ids.empty() || aborted_ || stopping_) return;
  Stats([&](PoolStats& s) { ++s.streams_broken; });
  for (uint64_t id : ids) {
    Job& job = jobs_.at(id);
    job.lane = nullptr;
    job.state = JobState::kReady;
  }
  const absl::StatusCode code = status.code();
  if (IsJobFault(code)) {
    if (ids.size() == 1) {
      DeliverErrorLocked(ids[0], status);
      return;
    }
    // The error names no job: send each alone so that only the guilty one gets it.
    Stats([&](PoolStats& s) { s.isolated += static_cast<int64_t>(ids.size()); });
    for (auto id = ids.rbegin(); id != ids.rend(); ++id) {
      jobs_.at(*id).solo = true;
      ready_.push_front(*id);
    }
    return;
  }
  if (code == absl::StatusCode::kDeadlineExceeded) {  // ClientOptions::stream_deadline
    Stats([&](PoolStats& s) { s.deadline_exceeded += static_cast<int64_t>(ids.size()); });
    for (uint64_t id : ids) DeliverErrorLocked(id, status);
    return;
  }
  Stats([&](PoolStats& s) { s.replicas[lane->peer].resent += static_cast<int64_t>(ids.size()); });
  for (uint64_t id : ids) RetryLocked(id, status);
}

void BalancedStream::RetryLocked(uint64_t job_id, const absl::Status& status) {
  Job& job = jobs_.at(job_id);
  ++job.failures;
  const RetryPolicy& retry = options_.retry;
  if (job.failures >= retry.max_attempts) {
    Stats([](PoolStats& s) { ++s.gave_up; });
    DeliverErrorLocked(job_id, absl::Status(status.code(),
                                            absl::StrCat("gave up after ", job.failures,
                                                         " sends: ", status.message())));
    return;
  }
  const double cap = static_cast<double>(retry.max_backoff.count());
  const double base =
      std::min(cap, static_cast<double>(retry.initial_backoff.count()) *
                        std::pow(retry.multiplier, static_cast<double>(job.failures - 1)));
  const double scale = 1.0 - retry.jitter * std::uniform_real_distribution<double>(0, 1)(random_);
  const auto backoff = std::chrono::milliseconds(static_cast<int64_t>(std::llround(base * scale)));
  Stats([&](PoolStats& s) {
    ++s.retries;
    s.longest_backoff = std::max(s.longest_backoff, backoff);
  });
  job.state = JobState::kDelayed;
  job.delay_it = delayed_.emplace(Clock::now() + backoff, job_id);
  changed_.notify_all();  // the timer waits for the earliest backoff
}

void BalancedStream::DeliverLocked(uint64_t job_id, LayerResult result) {
  const uint32_t layer_index = jobs_.at(job_id).job.layer_index;
  DropLocked(job_id);
  result.job_id = job_id;
  result.layer_index = layer_index;
  const bool ok = result.status.ok();
  Stats([ok](PoolStats& s) { ++(ok ? s.returned_ok : s.returned_error); });
  completed_.push_back(std::move(result));
  changed_.notify_all();
}

void BalancedStream::DeliverErrorLocked(uint64_t job_id, absl::Status status) {
  LayerResult result;
  result.status = std::move(status);
  DeliverLocked(job_id, std::move(result));
}

void BalancedStream::DropLocked(uint64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.lane != nullptr) {
    job.lane->in_flight.erase(job.lane_job_id);
    AddInFlightLocked(*job.lane, -1);
    // Its answer, if one is already on the way, is dropped by the lane.
    job.lane->stream->Cancel(job.lane_job_id).IgnoreError();
  }
  if (job.state == JobState::kDelayed) delayed_.erase(job.delay_it);
  if (job.deadline != Clock::time_point::max()) deadlines_.erase({job.deadline, job_id});
  jobs_.erase(it);  // a stale entry in ready_ is skipped
}

void BalancedStream::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    Clock::time_point wake = Clock::time_point::max();
    if (!delayed_.empty()) wake = std::min(wake, delayed_.begin()->first);
    if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
    if (wake == Clock::time_point::max()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, wake);
    }
    PumpLocked();
  }
}

void BalancedStream::AddInFlightLocked(const Lane& lane, int64_t delta) {
  if (delta == 0) return;
  Stats([&](PoolStats& s) { s.replicas[lane.peer].in_flight += delta; });
}

}  // namespace centroidkv::client
