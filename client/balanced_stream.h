// BalancedStream: the CompressStream a ReplicaPool opens. It owns a few GrpcCompressStreams
// ("lanes", each placed on a replica by the channel's round_robin policy), dispatches each
// job to the least-loaded lane with room (PoolOptions::jobs_per_stream), and takes a job
// back when its lane fails: a per-job UNAVAILABLE (the replica drains; the lane takes no
// more jobs) or a lane that broke (UNAVAILABLE, reset, any end with jobs unanswered). Taken
// back jobs are resent after a capped, jittered backoff until RetryPolicy::max_attempts;
// non-retryable answers (INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...) are
// returned as they are. A stream-ending error names no job, so when it ends a lane carrying
// several jobs, each of them is resent alone on its own lane and only the guilty one gets it.
//
// Exactly once: a job lives in exactly one place (the ready queue, the backoff queue, or one
// lane's in-flight map) until it is moved, under mu_, to the completed queue; an answer that
// finds its job no longer in its lane's map (cancelled, expired, taken back) is dropped.
//
// Threads: one reader thread per lane blocks in the lane's Next(); one timer thread runs
// backoffs and deadlines. All state is under mu_. Lane calls made under mu_ (Submit, Cancel,
// Abort) never block and their gRPC reactions never take mu_; blocking lane calls (Next,
// Close) are made without it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "client/channel.h"
#include "client/compress_stream_impl.h"

namespace centroidkv::client {

// What a ReplicaPool shares with its streams.
struct ReplicaPool::Core {
  PoolOptions options;  // streams resolved (> 0)
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CentroidKV::Stub> stub;
  SlabSizing slab_sizing;  // options.client.slab_bytes within the servers' stated limit
  std::once_flag options_sized;  // options.client sized by slab_sizing, before any stream

  mutable std::mutex stats_mu;  // taken after a stream's mu_, never before
  PoolStats stats;
};

class BalancedStream final : public CompressStream {
 public:
  explicit BalancedStream(std::shared_ptr<ReplicaPool::Core> core);
  ~BalancedStream() override;

  absl::StatusOr<uint64_t> Submit(const LayerJob& job) override;
  absl::Status Cancel(uint64_t job_id) override;
  absl::StatusOr<LayerResult> Next() override;
  // Waits until every job is answered, closes the lanes and returns OK (per-job failures
  // are in the results, which Next() still returns).
  absl::Status Close() override;
  void Abort() override;

 private:
  using Clock = std::chrono::steady_clock;

  struct Lane {
    std::unique_ptr<GrpcCompressStream> stream;
    std::map<uint64_t, uint64_t> in_flight;  // lane job id -> job id
    std::string peer;                        // "" until the first answer
    int64_t assigned = 0;
    bool solo = false;      // carries one isolated job, then closes
    bool retiring = false;  // takes no more jobs; closes once empty
    bool broken = false;
    bool ended = false;     // the reader has finished; join and erase
    std::thread reader;
  };

  enum class JobState { kReady, kDelayed, kInFlight };
  struct Job {
    LayerJob job;
    JobState state = JobState::kReady;
    int32_t failures = 0;  // retryable failures so far
    bool solo = false;
    Lane* lane = nullptr;
    uint64_t lane_job_id = 0;
    std::multimap<Clock::time_point, uint64_t>::iterator delay_it;
    Clock::time_point deadline = Clock::time_point::max();
  };

  // Moves due backoffs to the ready queue, expires deadlines, dispatches ready jobs, reaps
  // ended lanes. Called after every change.
  void PumpLocked();
  void DispatchLocked();
  Lane* OpenLaneLocked(bool solo);
  void ReapLanesLocked();
  void ReaderLoop(Lane* lane);
  void HandleAnswerLocked(Lane* lane, LayerResult result);
  void HandleLaneEndLocked(Lane* lane, const absl::Status& status);
  // Takes a failed job back: backoff then resend, or its final error after max_attempts.
  void RetryLocked(uint64_t job_id, const absl::Status& status);
  // Returns the job's final answer through Next() and forgets the job.
  void DeliverLocked(uint64_t job_id, LayerResult result);
  void DeliverErrorLocked(uint64_t job_id, absl::Status status);
  // Detaches a job from wherever it is (its lane is told to cancel it) and forgets it.
  void DropLocked(uint64_t job_id);
  void TimerLoop();
  void AddInFlightLocked(const Lane& lane, int64_t delta);
  template <typename F>
  void Stats(F update) {
    std::lock_guard<std::mutex> lock(core_->stats_mu);
    update(core_->stats);
  }

  const std::shared_ptr<ReplicaPool::Core> core_;
  const PoolOptions& options_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<uint64_t, Job> jobs_;  // submitted, not yet answered
  std::deque<uint64_t> ready_;    // may hold stale ids (checked against jobs_ on use)
  std::multimap<Clock::time_point, uint64_t> delayed_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  std::deque<LayerResult> completed_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  uint64_t next_job_id_ = 1;
  int64_t outstanding_ = 0;  // submitted, not yet returned by Next() nor cancelled
  bool closing_ = false;
  bool aborted_ = false;
  bool stopping_ = false;  // the destructor runs: threads exit
  std::mt19937_64 random_;
  std::thread timer_;
};

}  // namespace centroidkv::client
