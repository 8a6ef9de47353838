// centroidkv-server: flags, logging and signal handling around service::Server.
// SIGTERM / SIGINT start a graceful shutdown (see Server::Shutdown); a second signal
// exits at once.
#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "centroidkv/common/heap_tuning.h"
#include "service/server.h"

namespace {

using centroidkv::service::ServerOptions;

void AddFlags(CLI::App& app, ServerOptions& options, double& grace_seconds) {
  app.add_option("--listen", options.listen_address,
                 "Address to serve on: HOST:PORT (port 0 picks a free one) or "
                 "unix:///path/to.sock")
      ->capture_default_str();
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus /metrics over HTTP on HOST:PORT (port 0 picks a free one), e.g. "
                 "0.0.0.0:9464 as in the images; off by default ('off' or '')");
  app.add_option("--threads", options.worker_threads,
                 "Clustering threads (oneTBB); 0 = one per hardware thread")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-stream-bytes", options.max_stream_bytes,
                 "Bytes one stream may hold in flight before reading pauses (e.g. 512MiB)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-total-bytes", options.max_total_bytes,
                 "Bytes all streams together may hold in flight")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-pooled-results", options.max_pooled_results,
                 "Finished result buffers kept idle for reuse by later jobs; 0 = no pool")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-pooled-result-bytes", options.max_pooled_result_bytes,
                 "Bytes the idle result buffers may hold (outside --max-total-bytes)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-job-bytes", options.max_job_bytes, "Largest input of one layer job")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "Largest gRPC message accepted")
      ->capture_default_str()
      ->check(CLI::Range(1 << 16, 1 << 30));
  app.add_option("--max-slab-bytes", options.max_slab_bytes,
                 "Largest slab payload taken (GetInfo max_slab_bytes; at most "
                 "--max-message-bytes - 1 KiB)")
      ->capture_default_str()
      ->check(CLI::Range(1 << 10, 1 << 30));
  app.add_option("--result-slab-bytes", options.result_slab_bytes,
                 "Payload bytes per result slab sent back")
      ->capture_default_str()
      ->check(CLI::Range(1 << 10, 1 << 26));
  app.add_option("--grace-period,--drain-timeout", grace_seconds,
                 "Seconds in-flight jobs get to finish after SIGTERM (health is NOT_SERVING "
                 "meanwhile); Kubernetes' terminationGracePeriodSeconds must exceed it")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens", options.engine_limits.max_tokens,
                 "Largest number of tokens per head in one job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-heads", options.engine_limits.max_heads, "Largest number of heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-dim", options.engine_limits.max_dim, "Largest key or value dimension")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

}  // namespace

int main(int argc, char** argv) {
  centroidkv::KeepFreedHeapMemory();  // reuse job buffers instead of faulting them in anew
  ServerOptions options;
  double grace_seconds =
      std::chrono::duration<double>(options.grace_period).count();
  CLI::App app{"CentroidKV server: compresses LLM KV caches by clustering similar tokens"};
  AddFlags(app, options, grace_seconds);
  CLI11_PARSE(app, argc, argv);
  if (options.metrics_listen == "off") options.metrics_listen.clear();
  options.grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));

  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // A unix socket is created group-writable (srwxrwx---): connecting needs write access,
  // so a client running as another user in the socket's group can dial it (Kubernetes:
  // the pod's fsGroup owns the shared emptyDir and joins every container to that group).
  if (options.listen_address.rfind("unix:", 0) == 0) umask(S_IRWXO);
  auto server = centroidkv::service::Server::Start(options);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  spdlog::info("centroidkv-server listening on {} (this host dials {}), backends: {}, {} threads",
               options.listen_address, (*server)->target(),
               fmt::join((*server)->context().engines->EngineNames(), ","),
               (*server)->context().executor->threads());
  if ((*server)->metrics_port() != 0) {
    spdlog::info("metrics: http://{}/metrics (port {})", options.metrics_listen,
                 (*server)->metrics_port());
  }

  std::thread signal_watcher([&signals, &server] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    spdlog::info("signal {}: draining (NOT_SERVING, finishing jobs in flight)", signal_number);
    std::thread second([&signals] {
      int again = 0;
      sigwait(&signals, &again);
      spdlog::warn("second signal {}: exiting now", again);
      std::_Exit(1);
    });
    second.detach();
    (*server)->Shutdown();
  });
  (*server)->Wait();
  signal_watcher.join();
  spdlog::info("centroidkv-server stopped");
  return 0;
}
