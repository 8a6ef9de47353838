// The server's Prometheus metrics: which exist, their names, help and buckets, and the
// hooks the reactors call. Live state (streams open, queue depth, buffered bytes,
// draining) is read when scraped. docs/architecture.md lists every metric.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "service/metrics.h"

namespace centroidkv::service {

class MemoryBudget;
class ResultPool;
class InputPool;
class StreamRegistry;
class WorkExecutor;

// The name the HorizontalPodAutoscaler of deploy/ scales on (tests check it is exported).
inline constexpr char kQueueDepthMetric[] = "centroidkv_queue_depth";

// How a job received whole ended: its result sent, a JobError (bad data, an engine
// failure), or dropped unanswered or with a deadline error (cancelled, its stream gone,
// its deadline passed).
enum class JobOutcome { kCompleted, kFailed, kDropped };

class ServiceMetrics {
 public:
  // Reads the live gauges from the arguments, which must outlive this object.
  ServiceMetrics(const StreamRegistry& streams, const WorkExecutor& executor,
                 const MemoryBudget& budget, const ResultPool& results,
                 const InputPool& inputs,
                 const std::atomic<bool>& draining,
                 const std::vector<std::string>& backends);

  void StreamOpened() { streams_total_->Increment(); }
  // A complete job handed to the pool: `tokens` = heads x tokens per head.
  void JobReceived(std::string_view backend, int64_t tokens);
  // A job the engine ran (whatever its outcome).
  void JobComputed(std::string_view backend, double queue_seconds, double compute_seconds);
  void JobEnded(JobOutcome outcome);
  // A result queued for sending: `entries` = output rows over all heads.
  void EntriesOut(std::string_view backend, int64_t entries);
  // Serialized sizes of the Compress messages read and written.
  void BytesIn(uint64_t bytes) { bytes_in_->Increment(bytes); }
  void BytesOut(uint64_t bytes) { bytes_out_->Increment(bytes); }
  // `code`: a gRPC status code number; `scope`: "stream" (the stream ended with it) or
  // "job" (a JobError for one job, the stream went on).
  void Error(int code, std::string_view scope);
  // A call by `caller` (an identity name, never a token) of `rpc`; a call or job refused.
  void CallerRequest(std::string_view caller, std::string_view rpc);
  void CallerRejected(std::string_view caller, std::string_view reason);

  // Gauges of the shared memory regions registered (service/shm/region_table.h), read at
  // each scrape; called once, before the first scrape.
  void AddRegionGauges(std::function<double()> regions, std::function<double()> bytes);
  // A result written to a client's output region: its rows written there by the engine
  // itself (`in_place`), or copied there from the result's arrays.
  void RegionResult(bool in_place);

  std::string Render() const { return registry_.Render(); }

  // Totals over every label, read in process (the tests' view of the counters above).
  int64_t streams_opened() const { return static_cast<int64_t>(streams_total_->value()); }
  int64_t jobs_received() const { return static_cast<int64_t>(jobs_->Total()); }
  int64_t jobs_ended(JobOutcome outcome) const;
  int64_t region_results(bool in_place) const;

 private:
  MetricsRegistry registry_;
  Counter* streams_total_;
  CounterFamily* jobs_;
  CounterFamily* job_outcomes_;
  CounterFamily* tokens_;
  CounterFamily* entries_;
  Counter* bytes_in_;
  Counter* bytes_out_;
  HistogramFamily* clustering_seconds_;
  Histogram* queue_wait_seconds_;
  CounterFamily* errors_;
  CounterFamily* caller_requests_;
  CounterFamily* caller_rejections_;
  CounterFamily* region_results_;
};

}  // namespace centroidkv::service
