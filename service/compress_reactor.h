// The server side of one Compress stream: a gRPC callback reactor (route_guide style)
// that assembles layer jobs from slabs, hands complete jobs to the clustering pool and
// streams each result back as soon as it is ready, one write in flight at a time.
//
// Threads: reactions arrive on gRPC threads and job completions on oneTBB threads; all
// state is under mu_, and gRPC operations are started only after mu_ is released (a
// reaction may run inline inside StartWrite). Lifetime: reference counted; gRPC holds one
// reference until OnDone, each job in the pool and a budget wait hold one more.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "service/incoming_job.h"
#include "service/result_encoder.h"
#include "service/result_pool.h"
#include "service/security/caller_limits.h"
#include "service/service_context.h"

namespace centroidkv::service {

// Raw messages (see CentroidKVService): each request is parsed here, so that one that does
// not parse fails the stream with INVALID_ARGUMENT instead of passing for a half-close.
class CompressReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `caller`: this stream's share of its caller's limits (CallerGate::OpenStream);
  // `regions`: the owner whose shared memory regions its jobs may name (none: slabs only).
  CompressReactor(ServiceContext* context, std::unique_ptr<CallerStream> caller,
                  std::optional<RegionOwner> regions = std::nullopt);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Server shutdown: new jobs get UNAVAILABLE, jobs in flight finish and are written,
  // then the stream ends with UNAVAILABLE (or OK if the client already half-closed).
  void Drain();
  // Fails (a DEADLINE_EXCEEDED JobError) each job incomplete for longer than
  // incomplete_job_timeout since its memory was reserved, releasing that memory; ends the
  // stream with DEADLINE_EXCEEDED if it has been idle (no job, no traffic) for longer than
  // idle_stream_timeout. While the shared budget has a waiter, also fails (RESOURCE_EXHAUSTED)
  // each receiving job that has not earned its reservation
  // (ServerOptions::min_receive_bytes_per_second). StreamWatchdog calls it.
  void CheckTimeouts(std::chrono::steady_clock::time_point now);

  void Ref();
  void Unref();

 private:
  // gRPC operations decided under mu_ and started after it is released.
  struct Actions {
    bool start_read = false;
    bool start_write = false;
    bool finish = false;
    uint64_t release_bytes = 0;  // to give back to the shared budget
  };
  struct ReceivingJob {
    std::unique_ptr<IncomingJob> job;
    const ClusterEngine* engine = nullptr;
    std::chrono::steady_clock::time_point admitted;  // when its footprint was reserved
    std::chrono::steady_clock::duration read_wait_at_admission{};  // ReadWaitSoFar then
  };
  struct Output {  // one job's reply: a result, or an error message
    std::unique_ptr<ResultEncoder> encoder;
    std::optional<v1::CompressResponse> error;
    uint64_t footprint = 0;
  };

  ~CompressReactor() override = default;

  // Parses read_buffer_ into request_; false if it is not a valid CompressRequest.
  bool ParseRequest();
  absl::Status HandleRequest(Actions* actions);
  absl::Status HandleStartJob(const v1::StartJob& start, Actions* actions);
  absl::Status HandleSlab(const v1::TensorSlab& slab, Actions* actions);
  void HandleCancelJob(const v1::CancelJob& cancel, Actions* actions);

  // Reserves the waiting job's footprint (stream and shared budget) and, once it fits,
  // admits it and resumes reading. A job that can never fit gets a JobError.
  void AdmitWaitingJob(Actions* actions);
  void StartReadIfIdle(Actions* actions);
  // The time the stream's reads have waited on the client since it opened (a read started
  // and not yet done), up to `now`.
  std::chrono::steady_clock::duration ReadWaitSoFar(std::chrono::steady_clock::time_point now) const;
  void OnBudgetAvailable();
  // A job that failed before computing: JobError, and its later slabs are dropped.
  void RejectJob(uint64_t job_id, const absl::Status& status, Actions* actions);
  void FailReceivingJob(std::map<uint64_t, ReceivingJob>::iterator it,
                        const absl::Status& status, Actions* actions);
  // At half-close: a JobError for each job still short of bytes.
  void FailIncompleteJobs(Actions* actions);
  void SubmitJob(ReceivingJob job, Actions* actions);
  void RunJob(uint64_t job_id, std::shared_ptr<IncomingJob> job, const ClusterEngine* engine,
              std::shared_ptr<std::atomic<bool>> cancelled, double enqueue_time);
  struct ResultMeta {
    uint32_t layer_index;
    DType output_dtype;
    ResultProvenance provenance;  // the engine's name and the job's timings
    bool deadline_exceeded = false;  // the engine stopped (or never started) on the deadline
    bool in_region = false;          // the result was written to the job's output region
  };
  // `result` is the job's pooled result (valid when `status` is OK); it returns to the
  // pool when its encoder is done with it, or at once when the job produced no reply.
  void OnJobComputed(uint64_t job_id, const absl::Status& status, PooledResult result,
                     const ResultMeta& meta);
  void QueueJobError(uint64_t job_id, const absl::Status& status, uint64_t footprint,
                     Actions* actions);

  void ReleaseFootprint(uint64_t bytes, Actions* actions);
  void PrepareWrite(Actions* actions);
  void MaybeFinish(Actions* actions);
  void FailStream(const absl::Status& status, Actions* actions);
  void RequestFinish(const grpc::Status& status, Actions* actions);
  bool Idle() const;
  void Perform(const Actions& actions);

  ServiceContext* const context_;
  const std::unique_ptr<CallerStream> caller_;  // under mu_
  const std::optional<IncomingJob::RegionAccess> regions_;
  std::atomic<int32_t> refs_{1};

  std::mutex mu_;
  grpc::ByteBuffer read_buffer_;   // one read in flight
  grpc::ByteBuffer write_buffer_;  // one write in flight: response_, serialized
  v1::CompressRequest request_;    // the last request read, parsed
  v1::CompressResponse response_;  // the next response, before serialization
  std::map<uint64_t, ReceivingJob> receiving_;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> computing_;  // job -> cancel flag
  std::map<uint64_t, uint64_t> computing_footprint_;
  std::deque<Output> outgoing_;
  // Jobs answered with a JobError before computing (bad StartJob, draining, a slab that does
  // not fit): their later slabs are dropped. An id leaves when announced again.
  std::set<uint64_t> rejected_;
  std::optional<ReceivingJob> waiting_;  // a job waiting for memory; reading is paused
  std::optional<MemoryBudget::WaiterId> budget_wait_;
  uint64_t stream_bytes_ = 0;  // footprints of this stream's admitted jobs
  std::chrono::steady_clock::time_point last_activity_ = std::chrono::steady_clock::now();
  bool reads_done_ = false;
  bool read_in_flight_ = false;
  std::chrono::steady_clock::time_point read_started_;  // of the read in flight
  std::chrono::steady_clock::duration read_wait_{};     // of the reads done
  bool write_in_flight_ = false;
  bool draining_ = false;
  bool finish_requested_ = false;
  bool finish_called_ = false;
  int32_t calls_in_progress_ = 0;  // StartRead/StartWrite calls being made outside mu_
  grpc::Status final_status_;
};

}  // namespace centroidkv::service
