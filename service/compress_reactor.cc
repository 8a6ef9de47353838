// CompressReactor: the protocol of one Compress stream (see centroidkv.proto).
#include "service/compress_reactor.h"

#include <chrono>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/common/tsan_annotations.h"
#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/wire/job_codec.h"
#include "centroidkv/wire/wire_convert.h"
#include "service/result_range.h"

namespace centroidkv::service {
namespace {

// Jobs one stream may have refused by its caller's limits before the stream itself ends.
constexpr size_t kMaxRefusedJobsPerStream = 4096;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status DeadlineError(uint64_t job_id) {
  return FieldError(absl::StatusCode::kDeadlineExceeded, {"start_job.timeout_ms"},
                    absl::StrCat("job ", job_id,
                                 ": its deadline (start_job.timeout_ms) passed; the work was "
                                 "dropped"));
}

}  // namespace

CompressReactor::CompressReactor(ServiceContext* context, std::unique_ptr<CallerStream> caller,
                                 std::optional<RegionOwner> regions)
    : context_(context),
      caller_(std::move(caller)),
      regions_(regions.has_value() ? std::make_optional(IncomingJob::RegionAccess{
                                         &context->regions, std::move(regions->key)})
                                   : std::nullopt) {
  context_->streams.Add(this);
  context_->metrics.StreamOpened();
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = context_->draining.load();
    const size_t max_streams = static_cast<size_t>(context_->options.max_streams);
    if (draining_) {
      MaybeFinish(&actions);  // a stream opened during shutdown ends at once
    } else if (context_->streams.size() > max_streams) {
      FailStream(absl::ResourceExhaustedError(absl::StrCat(
                     "the server has its limit of ", max_streams,
                     " open streams (max_streams); retry later or on another replica")),
                 &actions);
    } else {
      read_in_flight_ = true;
      read_started_ = std::chrono::steady_clock::now();
      ++calls_in_progress_;
      actions.start_read = true;
    }
  }
  Perform(actions);
}

void CompressReactor::Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }

void CompressReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

// ---------------------------------------------------------------------------------------
// Reactions.

void CompressReactor::OnReadDone(bool ok) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_in_flight_ = false;
    last_activity_ = std::chrono::steady_clock::now();
    read_wait_ += last_activity_ - read_started_;
    if (ok) context_->metrics.BytesIn(read_buffer_.Length());
    if (finish_requested_) {
      read_buffer_.Clear();  // the stream is ending; drop whatever arrived
    } else if (ok && !ParseRequest()) {
      FailStream(absl::InvalidArgumentError(
                     "request: a message on the stream is not a valid CompressRequest "
                     "(protobuf parse failed)"),
                 &actions);
    } else if (!ok) {
      reads_done_ = true;
      FailIncompleteJobs(&actions);
      MaybeFinish(&actions);
    } else if (absl::Status status = HandleRequest(&actions); !status.ok()) {
      FailStream(status, &actions);
    } else if (!waiting_.has_value() && !finish_requested_ && !read_in_flight_) {
      // (AdmitWaitingJob may already have started the next read.)
      read_in_flight_ = true;
      read_started_ = std::chrono::steady_clock::now();
      ++calls_in_progress_;
      actions.start_read = true;
    }
  }
  Perform(actions);
}

void CompressReactor::OnWriteDone(bool ok) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    write_in_flight_ = false;
    last_activity_ = std::chrono::steady_clock::now();
    if (!ok) {
      FailStream(absl::UnavailableError("writing a result failed: the client went away"),
                 &actions);
    } else {
      PrepareWrite(&actions);
      MaybeFinish(&actions);
    }
  }
  Perform(actions);
}

void CompressReactor::OnCancel() {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailStream(absl::CancelledError("stream cancelled by the client or its deadline passed"),
               &actions);
  }
  Perform(actions);
}

void CompressReactor::OnDone() {
  bool drop_wait_ref = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (budget_wait_.has_value()) {
      drop_wait_ref = context_->budget.CancelWait(*budget_wait_);
      budget_wait_.reset();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    caller_->EndStream();  // jobs still computing stay counted until they finish
  }
  context_->streams.Remove(this);
  ServiceContext* context = context_;
  if (drop_wait_ref) Unref();
  Unref();  // gRPC's reference; `this` may be gone now
  // grpc::Server::Shutdown returns only after every reactor's OnDone has returned, counted
  // by an atomic inside libgrpc++ that TSan does not see; Server::Shutdown takes this edge.
  TsanHappensBefore(context);
}

void CompressReactor::Drain() {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    MaybeFinish(&actions);
  }
  Perform(actions);
}

void CompressReactor::CheckTimeouts(std::chrono::steady_clock::time_point now) {
  const ServerOptions& options = context_->options;
  auto seconds = [](std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
  };
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_requested_) return;
    // An incomplete job fails alone (a JobError; its later slabs are dropped) and its
    // reserved memory goes back to the budget; the stream goes on.
    for (auto it = receiving_.begin(); it != receiving_.end();) {
      auto next = std::next(it);
      if (now - it->second.admitted > options.incomplete_job_timeout) {
        const IncomingJob& job = *it->second.job;
        const absl::Status status = FieldError(
            absl::StatusCode::kDeadlineExceeded, {job.FirstMissingField()},
            absl::StrCat("job ", it->first, " still incomplete ",
                         seconds(now - it->second.admitted),
                         " s after its memory was reserved (its slabs must follow within the "
                         "server's incomplete_job_timeout of ",
                         seconds(options.incomplete_job_timeout), " s; missing ",
                         job.MissingTensors(), "); its reserved memory is released"));
        FailReceivingJob(it, status, &actions);
      }
      it = next;
    }
    // Earned reservations (ServerOptions::min_receive_bytes_per_second): only while
    // another job waits for the budget.
    const double rate = static_cast<double>(options.min_receive_bytes_per_second);
    if (rate > 0 && !receiving_.empty() && context_->budget.HasWaiters()) {
      const std::chrono::steady_clock::duration read_wait = ReadWaitSoFar(now);
      for (auto it = receiving_.begin(); it != receiving_.end();) {
        auto next = std::next(it);
        const IncomingJob& job = *it->second.job;
        const double waited = seconds(read_wait - it->second.read_wait_at_admission);
        const double owed = rate * waited - static_cast<double>(options.receive_slack_bytes);
        if (static_cast<double>(job.received_bytes()) < owed) {
          const absl::Status status = FieldError(
              absl::StatusCode::kResourceExhausted, {job.FirstMissingField()},
              absl::StrCat("job ", it->first, " received ", job.received_bytes(), " of ",
                           job.input_bytes(), " bytes in ", waited,
                           " s of waiting on its stream, below the server's "
                           "min_receive_bytes_per_second of ",
                           options.min_receive_bytes_per_second,
                           " while other jobs wait for memory; its reserved memory goes to "
                           "them (missing ",
                           job.MissingTensors(), ")"));
          FailReceivingJob(it, status, &actions);
        }
        it = next;
      }
    }
    if (!finish_requested_ && Idle() && now - last_activity_ > options.idle_stream_timeout) {
      FailStream(absl::DeadlineExceededError(absl::StrCat(
                     "stream idle for ", seconds(now - last_activity_),
                     " s (the server's idle_stream_timeout is ",
                     seconds(options.idle_stream_timeout), " s); open a new one")),
                 &actions);
    }
  }
  Perform(actions);
}

// ---------------------------------------------------------------------------------------
// Requests.

bool CompressReactor::ParseRequest() {
  // What gRPC's typed reader does, minus treating a failure like the end of the stream.
  return grpc::SerializationTraits<v1::CompressRequest>::Deserialize(&read_buffer_, &request_)
      .ok();
}

absl::Status CompressReactor::HandleRequest(Actions* actions) {
  switch (request_.message_case()) {
    case v1::CompressRequest::kStartJob:
      return HandleStartJob(request_.start_job(), actions);
    case v1::CompressRequest::kSlab:
      return HandleSlab(request_.slab(), actions);
    case v1::CompressRequest::kCancelJob:
      HandleCancelJob(request_.cancel_job(), actions);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "request: a CompressRequest must hold start_job, slab or cancel_job");
  }
}

absl::Status CompressReactor::HandleStartJob(const v1::StartJob& start, Actions* actions) {
  const uint64_t job_id = start.job_id();
  // A job answered with a JobError may be announced again: its id is free once more.
  rejected_.erase(job_id);
  if (receiving_.count(job_id) || computing_.count(job_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("start_job.job_id ", job_id, " is already in flight on this stream"));
  }
  for (const Output& output : outgoing_) {
    if (output.encoder != nullptr && output.encoder->job_id() == job_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start_job.job_id ", job_id, " is already in flight on this stream (result pending)"));
    }
  }
  // The server's flag too: Shutdown() sets it before it reaches each stream's Drain(), and a
  // job that arrives in between must be refused like any later one.
  if (draining_ || context_->draining.load()) {
    rejected_.insert(job_id);
    QueueJobError(job_id,
                  absl::UnavailableError("server is shutting down; resend the job elsewhere"),
                  0, actions);
    return absl::OkStatus();
  }
  // Everything wrong with one StartJob fails that job only.
  absl::StatusOr<std::unique_ptr<IncomingJob>> job;
  try {
    job = IncomingJob::Create(start, context_->options, context_->inputs.get(),
                              regions_.has_value() ? &*regions_ : nullptr);
  } catch (const std::bad_alloc&) {
    job = FieldError(absl::StatusCode::kResourceExhausted, {"start_job.num_tokens"},
                     absl::StrCat("start_job: out of memory allocating job ", job_id));
  }
  if (!job.ok()) {
    RejectJob(job_id, job.status(), actions);
    return absl::OkStatus();
  }
  absl::StatusOr<const ClusterEngine*> engine = context_->engines->Select((*job)->backend());
  if (!engine.ok()) {
    RejectJob(job_id, FieldError(engine.status().code(), {"start_job.backend"},
                                 engine.status().message()),
              actions);
    return absl::OkStatus();
  }
  // The caller's own limits: over them this job alone is refused (its slabs are dropped
  // unread) and the stream, and every other caller, goes on.
  if (absl::Status admitted = caller_->AdmitJob((*job)->footprint_bytes()); !admitted.ok()) {
    context_->callers.JobRejected(caller_->caller());
    // The ids of refused jobs are kept (their slabs are dropped); a stream that keeps
    // sending jobs over its caller's limit would grow the set without bound.
    if (rejected_.size() >= kMaxRefusedJobsPerStream) return admitted;
    RejectJob(job_id, admitted, actions);
    return absl::OkStatus();
  }
  waiting_ = ReceivingJob{std::move(*job), *engine, {}};
  AdmitWaitingJob(actions);
  return absl::OkStatus();
}

void CompressReactor::AdmitWaitingJob(Actions* actions) {
  if (!waiting_.has_value() || finish_requested_) return;
  const uint64_t footprint = waiting_->job->footprint_bytes();
  const ServerOptions& options = context_->options;
  if (footprint > options.max_stream_bytes || footprint > options.max_total_bytes) {
    // It can never fit: that job fails, and reading goes on.
    const uint64_t job_id = waiting_->job->job_id();
    caller_->ReleaseJob(footprint);  // admitted for its caller at StartJob
    waiting_.reset();
    RejectJob(job_id,
              FieldError(absl::StatusCode::kResourceExhausted, {"start_job.num_tokens"},
                         absl::StrCat("start_job: job ", job_id, " needs ", footprint,
                                      " bytes for input and result, above max_stream_bytes ",
                                      options.max_stream_bytes, " or max_total_bytes ",
                                      options.max_total_bytes)),
              actions);
    StartReadIfIdle(actions);
    return;
  }
  if (stream_bytes_ + footprint > options.max_stream_bytes) {
    return;  // wait for this stream's own jobs to drain
  }
  if (!context_->budget.TryReserve(footprint)) {
    if (!budget_wait_.has_value()) {
      Ref();  // held by the budget's wake callback
      budget_wait_ = context_->budget.Wait([this] {
        OnBudgetAvailable();
        Unref();
      });
    }
    // A release may have happened between the failed reservation and the registration.
    if (!context_->budget.TryReserve(footprint)) return;
    if (context_->budget.CancelWait(*budget_wait_)) Unref();
    budget_wait_.reset();
  }
  stream_bytes_ += footprint;
  waiting_->admitted = std::chrono::steady_clock::now();
  waiting_->read_wait_at_admission = ReadWaitSoFar(waiting_->admitted);
  const uint64_t job_id = waiting_->job->job_id();
  try {
    waiting_->job->AllocateInput();  // only now: a job waiting for memory holds none
  } catch (const std::bad_alloc&) {
    waiting_.reset();
    ReleaseFootprint(footprint, actions);
    RejectJob(job_id,
              FieldError(absl::StatusCode::kResourceExhausted, {"start_job.num_tokens"},
                         absl::StrCat("start_job: out of memory allocating job ", job_id)),
              actions);
    StartReadIfIdle(actions);
    return;
  }
  if (waiting_->job->complete()) {
    // By reference to shared memory: nothing more to receive.
    ReceivingJob ready = std::move(*waiting_);
    waiting_.reset();
    SubmitJob(std::move(ready), actions);
  } else {
    receiving_.emplace(job_id, std::move(*waiting_));
    waiting_.reset();
  }
  StartReadIfIdle(actions);
}

std::chrono::steady_clock::duration CompressReactor::ReadWaitSoFar(
    std::chrono::steady_clock::time_point now) const {
  return read_wait_ + (read_in_flight_ ? now - read_started_ : std::chrono::steady_clock::duration{});
}

void CompressReactor::StartReadIfIdle(Actions* actions) {
  if (!read_in_flight_ && !reads_done_ && !finish_requested_) {
    read_in_flight_ = true;
    read_started_ = std::chrono::steady_clock::now();
    ++calls_in_progress_;
    actions->start_read = true;
  }
}

void CompressReactor::OnBudgetAvailable() {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    budget_wait_.reset();
    AdmitWaitingJob(&actions);
  }
  Perform(actions);
}

absl::Status CompressReactor::HandleSlab(const v1::TensorSlab& slab, Actions* actions) {
  auto it = receiving_.find(slab.job_id());
  if (it == receiving_.end()) {
    if (rejected_.count(slab.job_id())) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "slab.job_id ", slab.job_id(),
        " is not a job receiving data on this stream (send start_job first)"));
  }
  const int32_t max_slab = MaxSlabBytes(context_->options);
  if (slab.data().size() > static_cast<size_t>(max_slab)) {
    FailReceivingJob(it, FieldError(absl::StatusCode::kResourceExhausted, {"slab.data"},
                                    absl::StrCat("slab.data of job ", slab.job_id(), " is ",
                                                 slab.data().size(),
                                                 " bytes, above the server's max_slab_bytes ",
                                                 max_slab, " (GetInfo limits.max_slab_bytes)")),
                     actions);
    return absl::OkStatus();
  }
  if (absl::Status status = it->second.job->AddSlab(slab); !status.ok()) {
    // An overlap or a gap breaks the stream's framing; a slab that does not fit the job's
    // tensors fails the job.
    if (status.code() == absl::StatusCode::kFailedPrecondition) return status;
    FailReceivingJob(it, status, actions);
    return absl::OkStatus();
  }
  if (it->second.job->complete()) {
    ReceivingJob job = std::move(it->second);
    receiving_.erase(it);
    SubmitJob(std::move(job), actions);
  }
  return absl::OkStatus();
}

void CompressReactor::FailReceivingJob(std::map<uint64_t, ReceivingJob>::iterator it,
                                       const absl::Status& status, Actions* actions) {
  const uint64_t job_id = it->first;
  const uint64_t footprint = it->second.job->footprint_bytes();
  receiving_.erase(it);
  ReleaseFootprint(footprint, actions);
  RejectJob(job_id, status, actions);
}

void CompressReactor::FailIncompleteJobs(Actions* actions) {
  while (!receiving_.empty()) {
    auto it = receiving_.begin();
    const IncomingJob& job = *it->second.job;
    const absl::Status status =
        FieldError(absl::StatusCode::kFailedPrecondition, {job.FirstMissingField()},
                   absl::StrCat("stream half-closed while job ", it->first,
                                " still expected slabs: ", job.MissingTensors()));
    FailReceivingJob(it, status, actions);
  }
  if (waiting_.has_value()) {
    const uint64_t job_id = waiting_->job->job_id();
    caller_->ReleaseJob(waiting_->job->footprint_bytes());  // admitted at StartJob
    waiting_.reset();
    QueueJobError(job_id,
                  FieldError(absl::StatusCode::kFailedPrecondition, {"keys"},
                             absl::StrCat("stream half-closed while job ", job_id,
                                          " still expected slabs (it waited for memory)")),
                  0, actions);
  }
}

void CompressReactor::RejectJob(uint64_t job_id, const absl::Status& status, Actions* actions) {
  rejected_.insert(job_id);
  QueueJobError(job_id, status, 0, actions);
}

void CompressReactor::HandleCancelJob(const v1::CancelJob& cancel, Actions* actions) {
  const uint64_t job_id = cancel.job_id();
  if (auto it = receiving_.find(job_id); it != receiving_.end()) {
    const uint64_t footprint = it->second.job->footprint_bytes();
    receiving_.erase(it);
    ReleaseFootprint(footprint, actions);
  } else if (auto running = computing_.find(job_id); running != computing_.end()) {
    running->second->store(true);  // the pool drops it; OnJobComputed releases it
  } else {
    for (auto out = outgoing_.begin(); out != outgoing_.end(); ++out) {
      // A result not yet started on the wire can be dropped whole.
      if (out->encoder != nullptr && out->encoder->job_id() == job_id &&
          !(out == outgoing_.begin() && write_in_flight_)) {
        const uint64_t footprint = out->footprint;
        outgoing_.erase(out);
        ReleaseFootprint(footprint, actions);
        break;
      }
    }
  }
  // Cancelling a job that already finished is not an error: the reply may be in flight.
}

// ---------------------------------------------------------------------------------------
// Jobs in the pool.

void CompressReactor::SubmitJob(ReceivingJob job, Actions* actions) {
  const uint64_t job_id = job.job->job_id();
  if (job.job->deadline().has_value() &&
      std::chrono::steady_clock::now() >= *job.job->deadline()) {
    // Expired while its bytes arrived: dropped without computing.
    context_->metrics.JobEnded(JobOutcome::kDropped);
    QueueJobError(job_id, DeadlineError(job_id), job.job->footprint_bytes(), actions);
    return;
  }
  // Registered server-wide too, so that shutdown can cancel it after the grace period.
  std::shared_ptr<std::atomic<bool>> cancelled = context_->jobs.Register();
  computing_.emplace(job_id, cancelled);
  computing_footprint_.emplace(job_id, job.job->footprint_bytes());
  Ref();  // held by the task
  const LayerView& view = job.job->view();
  context_->metrics.JobReceived(job.engine->name(),
                                static_cast<int64_t>(view.num_heads) * view.num_tokens);
  std::shared_ptr<IncomingJob> input(std::move(job.job));
  const ClusterEngine* engine = job.engine;
  const double enqueue_time = NowSeconds();
  const int32_t priority = input->priority();
  context_->executor->Submit(
      [this, job_id, input, engine, cancelled, enqueue_time] {
        RunJob(job_id, input, engine, cancelled, enqueue_time);
        Unref();
      },
      priority, reinterpret_cast<uintptr_t>(this));  // fair across streams
}

void CompressReactor::RunJob(uint64_t job_id, std::shared_ptr<IncomingJob> job,
                             const ClusterEngine* engine,
                             std::shared_ptr<std::atomic<bool>> cancelled, double enqueue_time) {
  ResultProvenance provenance{std::string(engine->name())};
  const double start = NowSeconds();
  provenance.queue_seconds = start - enqueue_time;
  // A result buffer from the pool (any earlier shape): CompressInto overwrites it without
  // faulting in and zero-filling fresh pages for every job.
  // Rows in the output dtype straight from an engine that writes them (the GPU and the cpu
  // backend: half the bytes to write, and to download from a GPU); otherwise float32,
  // rounded by the encoder as it copies.
  CompressOptions options = job->options();
  if (engine->caps().WritesResultDType(job->output_dtype())) options.result_dtype = job->output_dtype();
  CompressControl control{cancelled.get()};
  if (job->deadline().has_value()) control.deadline = *job->deadline();
  // Shared memory: an engine that can writes the rows straight into the client's region
  // (which holds them in the output dtype).
  const std::optional<ResultRowTarget> row_target = job->RowTarget();
  if (row_target.has_value() && options.result_dtype == job->output_dtype()) {
    control.row_target = &*row_target;
  }
  PooledResult result;
  absl::Status status;
  bool ran = false;  // the engine ran: it read (and the job may write) the job's regions
  if (control.IsCancelled()) {
    status = absl::CancelledError("job cancelled or expired before it started");
  } else if (status = job->CheckRegionsUsable(); !status.ok()) {
    // A region's file shrank while the job waited: a cheap early error, nothing touched.
  } else {
    ran = true;
    if (context_->options.before_compute_for_testing) {
      context_->options.before_compute_for_testing(job->layer_index());
    }
    result = context_->results->Acquire(ResultPool::ResultBytesFor(job->view(), options));
    try {
      status = engine->CompressInto(job->view(), options, result.get(), control);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("job ", job_id, ": out of memory while clustering"));
    }
  }
  if (status.ok()) {
    status = CheckResultFitsDType(*result, job->output_dtype(), job_id,
                                  result->rows_in_target ? control.row_target : nullptr);
  }
  // Shared memory: the rest of the result (all of it, if the engine did not write the rows
  // there) goes into the client's region here, on the worker thread.
  const bool in_region = status.ok() && job->writes_to_region();
  if (in_region) {
    status = job->WriteResultToRegion(*result);
    context_->metrics.RegionResult(result->rows_in_target);
  }
  // A region truncated by its owner while the job read or wrote it (sigbus_guard.h): the
  // job's data went to or came from zero pages, so it fails before its result is announced.
  if (ran && status.code() != absl::StatusCode::kCancelled) {
    if (absl::Status intact = job->CheckRegionsIntact(); !intact.ok()) status = intact;
  }
  context_->jobs.Unregister(cancelled);
  provenance.compute_seconds = NowSeconds() - start;
  context_->metrics.JobComputed(engine->name(), provenance.queue_seconds,
                                provenance.compute_seconds);
  const bool expired = status.code() == absl::StatusCode::kCancelled && control.Expired() &&
                       !cancelled->load();
  const ResultMeta meta{job->layer_index(), job->output_dtype(), std::move(provenance), expired,
                        in_region};
  job.reset();  // free the input before the result is queued
  OnJobComputed(job_id, status, std::move(result), meta);
}

void CompressReactor::OnJobComputed(uint64_t job_id, const absl::Status& status,
                                    PooledResult result, const ResultMeta& meta) {
  ServiceMetrics& metrics = context_->metrics;
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto flag = computing_.find(job_id);
    const bool job_cancelled = flag != computing_.end() && flag->second->load();
    const uint64_t footprint = computing_footprint_[job_id];
    computing_.erase(job_id);
    computing_footprint_.erase(job_id);
    if (finish_requested_ || (job_cancelled && !meta.deadline_exceeded) ||
        (status.code() == absl::StatusCode::kCancelled && !meta.deadline_exceeded)) {
      metrics.JobEnded(JobOutcome::kDropped);
      ReleaseFootprint(footprint, &actions);
    } else if (meta.deadline_exceeded) {
      // Its deadline passed while it waited or computed: the work was dropped.
      metrics.JobEnded(JobOutcome::kDropped);
      QueueJobError(job_id, DeadlineError(job_id), footprint, &actions);
    } else if (!status.ok()) {
      // Bad data (NaN, counts, ...) or a failure while computing: that job only, naming the
      // field; the stream goes on.
      metrics.JobEnded(JobOutcome::kFailed);
      QueueJobError(job_id, WithPrefix(status, absl::StrCat("job ", job_id, ": ")), footprint,
                    &actions);
    } else {
      // The job's input is gone; the result needs at most the reserved footprint.
      metrics.JobEnded(JobOutcome::kCompleted);
      context_->metrics.EntriesOut(meta.provenance.backend, result->total_entries());
      outgoing_.push_back(Output{});
      outgoing_.back().footprint = footprint;
      outgoing_.back().encoder = std::make_unique<ResultEncoder>(
          job_id, meta.layer_index, meta.output_dtype, meta.provenance, std::move(result),
          context_->options.result_slab_bytes, meta.in_region);
      PrepareWrite(&actions);
    }
    MaybeFinish(&actions);
  }
  result.reset();  // a job with no result to send returns its buffer to the pool now
  Perform(actions);
}

void CompressReactor::QueueJobError(uint64_t job_id, const absl::Status& status,
                                    uint64_t footprint, Actions* actions) {
  Output output;
  output.footprint = footprint;
  output.error.emplace();
  *output.error->mutable_error() = JobErrorToProto(job_id, status);
  context_->metrics.Error(ToWireCode(status.code()), "job");
  outgoing_.push_back(std::move(output));
  PrepareWrite(actions);
}

// ---------------------------------------------------------------------------------------
// Writing, finishing, and the hand-off to gRPC.

void CompressReactor::ReleaseFootprint(uint64_t bytes, Actions* actions) {
  caller_->ReleaseJob(bytes);
  stream_bytes_ -= bytes;
  actions->release_bytes += bytes;
  if (waiting_.has_value() && !finish_requested_) AdmitWaitingJob(actions);
}

void CompressReactor::PrepareWrite(Actions* actions) {
  while (!write_in_flight_ && !finish_requested_ && !outgoing_.empty()) {
    Output& front = outgoing_.front();
    bool have_message = false;
    if (front.error.has_value()) {
      response_ = std::move(*front.error);
      front.error.reset();
      have_message = true;
    } else if (front.encoder != nullptr) {
      have_message = front.encoder->Next(&response_);
    }
    if (!have_message || front.encoder == nullptr) {
      const uint64_t footprint = front.footprint;
      outgoing_.pop_front();
      ReleaseFootprint(footprint, actions);
    }
    if (have_message) {
      bool own_buffer = false;
      write_buffer_.Clear();  // gRPC copied the previous message; the writer wants it empty
      if (!grpc::SerializationTraits<v1::CompressResponse>::Serialize(response_, &write_buffer_,
                                                                      &own_buffer)
               .ok()) {
        FailStream(absl::InternalError("a response could not be serialized"), actions);
        return;
      }
      context_->metrics.BytesOut(write_buffer_.Length());
      write_in_flight_ = true;
      ++calls_in_progress_;
      actions->start_write = true;
    }
  }
}

bool CompressReactor::Idle() const {
  return receiving_.empty() && computing_.empty() && outgoing_.empty() && !write_in_flight_ &&
         !waiting_.has_value();
}

void CompressReactor::MaybeFinish(Actions* actions) {
  if (finish_requested_ || !Idle()) return;
  if (reads_done_) {
    RequestFinish(grpc::Status::OK, actions);
  } else if (draining_) {
    RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "server is shutting down; reconnect to another replica"),
                  actions);
  }
}

void CompressReactor::FailStream(const absl::Status& status, Actions* actions) {
  if (finish_requested_) return;
  for (auto& [job_id, cancelled] : computing_) cancelled->store(true);
  uint64_t released = 0;
  for (auto& [job_id, job] : receiving_) {
    released += job.job->footprint_bytes();
    caller_->ReleaseJob(job.job->footprint_bytes());
  }
  for (Output& output : outgoing_) {
    released += output.footprint;
    caller_->ReleaseJob(output.footprint);
  }
  if (waiting_.has_value()) caller_->ReleaseJob(waiting_->job->footprint_bytes());
  receiving_.clear();
  outgoing_.clear();
  waiting_.reset();
  stream_bytes_ -= released;
  actions->release_bytes += released;
  RequestFinish(ToGrpcStatus(status), actions);
}

void CompressReactor::RequestFinish(const grpc::Status& status, Actions* actions) {
  finish_requested_ = true;
  final_status_ = status;
  if (!status.ok()) context_->metrics.Error(static_cast<int>(status.error_code()), "stream");
  if (calls_in_progress_ == 0 && !finish_called_) {
    finish_called_ = true;
    actions->finish = true;
  }
}

void CompressReactor::Perform(const Actions& actions) {
  if (actions.release_bytes > 0) context_->budget.Release(actions.release_bytes);
  const int32_t calls = (actions.start_read ? 1 : 0) + (actions.start_write ? 1 : 0);
  if (actions.start_read) StartRead(&read_buffer_);
  if (actions.start_write) StartWrite(&write_buffer_);
  bool finish = actions.finish;
  grpc::Status status;
  if (calls > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_in_progress_ -= calls;
    if (finish_requested_ && !finish_called_ && calls_in_progress_ == 0) {
      finish_called_ = true;
      finish = true;
    }
    status = final_status_;
  } else if (finish) {
    std::lock_guard<std::mutex> lock(mu_);
    status = final_status_;
  }
  // Finish must be the last use of `this`: OnDone may run inline and delete the reactor.
  if (finish) Finish(status);
}

}  // namespace centroidkv::service
