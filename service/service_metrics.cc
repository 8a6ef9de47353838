// ServiceMetrics: the metric families of the server and their hooks.
#include "service/service_metrics.h"

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "service/executor.h"
#include "service/input_pool.h"
#include "service/memory_budget.h"
#include "service/result_pool.h"
#include "service/service_context.h"

#ifndef CKV_VERSION
#define CKV_VERSION "unknown"
#endif
#ifndef CKV_GIT_COMMIT
#define CKV_GIT_COMMIT "unknown"
#endif

namespace centroidkv::service {
namespace {

// Clustering one layer takes ~1 ms (small jobs) to seconds (reference backend, long
// contexts); waiting for a thread ranges from microseconds to seconds under load.
const std::vector<double> kClusteringBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30};
const std::vector<double> kQueueWaitBounds = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                              0.05,   0.1,    0.25,  0.5,    1,     2.5,  10};


const char* OutcomeName(JobOutcome outcome) {
  switch (outcome) {
    case JobOutcome::kCompleted:
      return "completed";
    case JobOutcome::kFailed:
      return "failed";
    case JobOutcome::kDropped:
      return "dropped";
  }
  return "unknown";
}

}  // namespace

ServiceMetrics::ServiceMetrics(const StreamRegistry& streams, const WorkExecutor& executor,
                               const MemoryBudget& budget, const ResultPool& results,
                               const InputPool& inputs,
                               const std::atomic<bool>& draining,
                               const std::vector<std::string>& backends) {
  registry_
      .AddGauge("centroidkv_build_info",
                "Build of this server (always 1): version, git commit and backends built in",
                {"version", "git_commit", "backends"})
      ->Add({CKV_VERSION, CKV_GIT_COMMIT, absl::StrJoin(backends, ",")}, [] { return 1.0; });
  registry_.AddGauge("centroidkv_draining", "1 once the server is draining (after SIGTERM)")
      ->Add({}, [&draining] { return draining.load() ? 1.0 : 0.0; });
  registry_.AddGauge("centroidkv_streams_open", "Compress streams open now")
      ->Add({}, [&streams] { return static_cast<double>(streams.size()); });
  streams_total_ = registry_
                       .AddCounter("centroidkv_streams_total", "Compress streams opened")
                       ->WithLabels({});
  jobs_ = registry_.AddCounter("centroidkv_jobs_total",
                               "Layer jobs received whole and handed to the clustering pool",
                               {"backend"});
  job_outcomes_ = registry_.AddCounter(
      "centroidkv_job_outcomes_total",
      "Jobs received whole that ended: completed (result sent), failed (a JobError for bad "
      "data or an engine failure), dropped (cancelled, stream gone or deadline passed)",
      {"outcome"});
  for (JobOutcome outcome : {JobOutcome::kCompleted, JobOutcome::kFailed, JobOutcome::kDropped}) {
    job_outcomes_->WithLabels({OutcomeName(outcome)});  // every outcome exported from 0
  }
  tokens_ = registry_.AddCounter("centroidkv_tokens_total",
                                 "Input token rows of received jobs (heads x tokens)", {"backend"});
  entries_ = registry_.AddCounter("centroidkv_entries_total",
                                  "Output rows (centroids) of results sent, over all heads",
                                  {"backend"});
  bytes_in_ = registry_
                  .AddCounter("centroidkv_received_bytes_total",
                              "Serialized bytes of Compress messages received")
                  ->WithLabels({});
  bytes_out_ = registry_
                   .AddCounter("centroidkv_sent_bytes_total",
                               "Serialized bytes of Compress messages sent")
                   ->WithLabels({});
  clustering_seconds_ = registry_.AddHistogram(
      "centroidkv_clustering_seconds", "Time the engine took per job", {"backend"},
      kClusteringBounds);
  registry_
      .AddGauge(kQueueDepthMetric, "Jobs waiting for a clustering thread (not yet started)")
      ->Add({}, [&executor] { return static_cast<double>(executor.queued()); });
  registry_.AddGauge("centroidkv_jobs_in_flight", "Jobs in the clustering pool, waiting or running")
      ->Add({}, [&executor] { return static_cast<double>(executor.pending()); });
  queue_wait_seconds_ =
      registry_
          .AddHistogram("centroidkv_queue_wait_seconds",
                        "Time a job waited for a clustering thread", {}, kQueueWaitBounds)
          ->WithLabels({});
  registry_
      .AddGauge("centroidkv_buffered_bytes",
                "Bytes reserved by jobs in flight (inputs and results) in the memory budget")
      ->Add({}, [&budget] { return static_cast<double>(budget.used()); });
  // The idle-buffer pools, outside centroidkv_buffered_bytes (read at each scrape).
  struct PoolGauge {
    const char* name;
    const char* help;
    std::function<double()> read;
  };
  const PoolGauge pool_gauges[] = {
      {"centroidkv_result_pool_idle_bytes",
       "Bytes of finished results kept idle for reuse (outside centroidkv_buffered_bytes)",
       [&results] { return double(results.stats().idle_bytes); }},
      {"centroidkv_result_pool_idle_results", "Results kept idle for reuse",
       [&results] { return double(results.stats().idle_results); }},
      {"centroidkv_result_pool_leased_results",
       "Result buffers held by jobs now (computing, or being sent)",
       [&results] { return double(results.stats().leased); }},
      {"centroidkv_input_pool_idle_bytes",
       "Bytes of freed job inputs kept idle for reuse (outside centroidkv_buffered_bytes)",
       [&inputs] { return double(inputs.stats().idle_bytes); }},
      {"centroidkv_input_pool_idle_buffers", "Input buffers kept idle for reuse",
       [&inputs] { return double(inputs.stats().idle_buffers); }},
      {"centroidkv_input_pool_leased_bytes",
       "Bytes of input buffers held by jobs now (receiving, queued or computing)",
       [&inputs] { return double(inputs.stats().leased_bytes); }},
  };
  for (const PoolGauge& gauge : pool_gauges) {
    registry_.AddGauge(gauge.name, gauge.help)->Add({}, gauge.read);
  }
  errors_ = registry_.AddCounter(
      "centroidkv_errors_total",
      "Errors by gRPC status code; scope=stream: a stream ended with it, scope=job: one job failed",
      {"code", "scope"});
  caller_requests_ = registry_.AddCounter(
      "centroidkv_caller_requests_total",
      "Calls by caller identity (token's caller name, certificate CN, uid:N or anonymous; "
      "never a token) and RPC",
      {"caller", "rpc"});
  region_results_ = registry_.AddCounter(
      "centroidkv_region_results_total",
      "Results written to a client's shared memory output region: rows=in_place (the engine "
      "wrote the rows there itself) or rows=copied (from the result's arrays: a backend that "
      "cannot, or padded / token-major / exact_target / ragged jobs)",
      {"rows"});
  for (const char* rows : {"in_place", "copied"}) region_results_->WithLabels({rows});
  caller_rejections_ = registry_.AddCounter(
      "centroidkv_caller_rejections_total",
      "Calls and jobs refused by caller and reason (no_token, bad_token, stream_limit, "
      "job_limit)",
      {"caller", "reason"});
}

void ServiceMetrics::AddRegionGauges(std::function<double()> regions,
                                     std::function<double()> bytes) {
  registry_.AddGauge("centroidkv_shm_regions",
                     "Shared memory regions registered by clients (mapped, not owned)")
      ->Add({}, std::move(regions));
  registry_.AddGauge("centroidkv_shm_registered_bytes",
                     "Bytes of the registered shared memory regions: the clients' memory, "
                     "outside every server budget")
      ->Add({}, std::move(bytes));
}

void ServiceMetrics::CallerRequest(std::string_view caller, std::string_view rpc) {
  caller_requests_->WithLabels({std::string(caller), std::string(rpc)})->Increment();
}

void ServiceMetrics::CallerRejected(std::string_view caller, std::string_view reason) {
  caller_rejections_->WithLabels({std::string(caller), std::string(reason)})->Increment();
}

void ServiceMetrics::JobReceived(std::string_view backend, int64_t tokens) {
  const std::vector<std::string> labels = {std::string(backend)};
  jobs_->WithLabels(labels)->Increment();
  tokens_->WithLabels(labels)->Increment(static_cast<uint64_t>(tokens));
}

void ServiceMetrics::JobEnded(JobOutcome outcome) {
  job_outcomes_->WithLabels({OutcomeName(outcome)})->Increment();
}

int64_t ServiceMetrics::jobs_ended(JobOutcome outcome) const {
  return static_cast<int64_t>(job_outcomes_->WithLabels({OutcomeName(outcome)})->value());
}

void ServiceMetrics::RegionResult(bool in_place) {
  region_results_->WithLabels({in_place ? "in_place" : "copied"})->Increment();
}

int64_t ServiceMetrics::region_results(bool in_place) const {
  return static_cast<int64_t>(
      region_results_->WithLabels({in_place ? "in_place" : "copied"})->value());
}

void ServiceMetrics::JobComputed(std::string_view backend, double queue_seconds,
                                 double compute_seconds) {
  clustering_seconds_->WithLabels({std::string(backend)})->Observe(compute_seconds);
  queue_wait_seconds_->Observe(queue_seconds);
}

void ServiceMetrics::EntriesOut(std::string_view backend, int64_t entries) {
  entries_->WithLabels({std::string(backend)})->Increment(static_cast<uint64_t>(entries));
}

void ServiceMetrics::Error(int code, std::string_view scope) {
  // gRPC and absl share the google.rpc.Code numbering; this only names the code.
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  errors_->WithLabels({name.empty() ? std::to_string(code) : name, std::string(scope)})
      ->Increment();
}

}  // namespace centroidkv::service
