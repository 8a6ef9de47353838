// What every stream of one server shares: options, engines, the clustering pool, the
// memory budget, the pools of idle result and input buffers, the registry of live streams (for draining on shutdown), the metrics and the caller gate.
// Thread-safe: fields are set once at start-up; the registry has its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "centroidkv/kernels/engine_factory.h"
#include "service/executor.h"
#include "service/input_pool.h"
#include "service/job_cancellation.h"
#include "service/memory_budget.h"
#include "service/result_pool.h"
#include "service/security/caller_gate.h"
#include "service/server_options.h"
#include "service/service_metrics.h"
#include "service/shm/region_table.h"

namespace centroidkv::service {

class CompressReactor;

// Live Compress streams. Reactors add themselves on creation and remove themselves in
// OnDone; Drain() visits each one that is still registered.
class StreamRegistry {
 public:
  void Add(CompressReactor* reactor);
  void Remove(CompressReactor* reactor);
  size_t size() const;
  // Calls Drain() on every live stream, holding a reference so none is deleted meanwhile.
  void DrainAll();
  // Calls `visit` on every live stream, likewise.
  void ForEach(const std::function<void(CompressReactor*)>& visit);
  // Waits until no stream is live or `timeout` passes; returns true when none is live.
  bool WaitEmpty(std::chrono::milliseconds timeout);

 private:
  mutable std::mutex mu_;
  std::condition_variable empty_;
  std::set<CompressReactor*> reactors_;
};

struct ServiceContext {
  explicit ServiceContext(const ServerOptions& server_options);
  // Cancels and waits for every job still in the pool before any member they use (the
  // metrics, the budget, the result pool, the engines) is destroyed.
  ~ServiceContext();

  ServerOptions options;
  std::unique_ptr<EngineSet> engines;
  std::unique_ptr<WorkExecutor> executor;
  MemoryBudget budget;
  std::shared_ptr<ResultPool> results;  // shared: leases keep it alive
  std::shared_ptr<InputPool> inputs;    // likewise
  StreamRegistry streams;
  JobCancellation jobs;  // every job in the pool, for shutdown
  std::atomic<bool> draining{false};
  ServiceMetrics metrics;  // its gauges read the members above
  CallerGate callers;      // identities and per-caller limits; counts into metrics
  RegionTable regions;     // shared memory regions registered by clients
};

}  // namespace centroidkv::service
