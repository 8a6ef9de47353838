// ServiceContext construction and the registry of live streams.
#include "service/service_context.h"

#include <algorithm>
#include <vector>

#include "service/compress_reactor.h"

namespace centroidkv::service {

ServiceContext::ServiceContext(const ServerOptions& server_options)
    : options(server_options),
      engines(EngineSet::CreateAvailable(server_options.engine_limits)),
      executor(std::make_unique<WorkExecutor>(server_options.worker_threads)),
      budget(server_options.max_total_bytes),
      results(ResultPool::Create({server_options.max_pooled_results,
                                  server_options.max_pooled_result_bytes})),
      // Idle inputs never exceed one memory budget's worth.
      inputs(InputPool::Create({.max_idle_bytes = std::min(server_options.max_pooled_input_bytes,
                                                            server_options.max_total_bytes)})),
      metrics(streams, *executor, budget, *results, *inputs, draining, engines->EngineNames()),
      callers(CallerLimits{server_options.security.max_caller_streams,
                           server_options.security.max_caller_jobs,
                           server_options.security.max_caller_bytes},
              &metrics),
      regions(server_options.shared_memory) {
  metrics.AddRegionGauges([this] { return static_cast<double>(regions.regions()); },
                          [this] { return static_cast<double>(regions.registered_bytes()); });
}

ServiceContext::~ServiceContext() {
  jobs.CancelAll();
  // The engines check the flag inside their loops, so this returns soon after.
  executor->WaitIdle(std::chrono::hours(24));
}

void StreamRegistry::Add(CompressReactor* reactor) {
  std::lock_guard<std::mutex> lock(mu_);
  reactors_.insert(reactor);
}

void StreamRegistry::Remove(CompressReactor* reactor) {
  std::lock_guard<std::mutex> lock(mu_);
  reactors_.erase(reactor);
  if (reactors_.empty()) empty_.notify_all();
}

bool StreamRegistry::WaitEmpty(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return empty_.wait_for(lock, timeout, [this] { return reactors_.empty(); });
}

size_t StreamRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reactors_.size();
}

void StreamRegistry::DrainAll() {
  ForEach([](CompressReactor* reactor) { reactor->Drain(); });
}

void StreamRegistry::ForEach(const std::function<void(CompressReactor*)>& visit) {
  std::vector<CompressReactor*> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (CompressReactor* reactor : reactors_) {
      reactor->Ref();
      live.push_back(reactor);
    }
  }
  for (CompressReactor* reactor : live) {
    visit(reactor);
    reactor->Unref();
  }
}

}  // namespace centroidkv::service
