// centroidkv-server: flags, logging and signal handling around service::Server.
// SIGTERM / SIGINT start a graceful shutdown (see Server::Shutdown); a second signal
// exits at once. SIGHUP re-reads --auth-tokens-file.
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpc/grpc.h>
#include <spdlog/spdlog.h>

#include "centroidkv/common/heap_tuning.h"
#include "service/server.h"

namespace {

using centroidkv::service::ServerOptions;

struct DurationFlags {
  double grace_seconds;
  double incomplete_job_seconds;
  double idle_stream_seconds;
};

void AddFlags(CLI::App& app, ServerOptions& options, DurationFlags& durations) {
  app.add_option("--listen", options.listen_address,
                 "Address to serve on: HOST:PORT (port 0 picks a free one) or "
                 "unix:///path/to.sock")
      ->capture_default_str();
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus /metrics over HTTP on HOST:PORT (port 0 picks a free one), e.g. "
                 "0.0.0.0:9464 as in the images; off by default ('off' or ''). With "
                 "--tls-cert it is HTTPS with the same certificate");
  app.add_flag("--metrics-plaintext", options.metrics_plaintext,
               "With --tls-cert, serve /metrics over plain HTTP anyway: only on a loopback "
               "--metrics-listen (127.0.0.1, ::1, localhost)");
  app.add_option("--threads", options.worker_threads,
                 "Clustering threads (oneTBB); 0 = one per hardware thread")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-stream-bytes", options.max_stream_bytes,
                 "Bytes one stream may hold in flight before reading pauses (e.g. 512MiB)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-total-bytes", options.max_total_bytes,
                 "Bytes all streams together may hold in flight (a job's input buffer is "
                 "taken only once its input + result fit; idle freed inputs are kept up to "
                 "this much too)")
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
  app.add_option("--max-pooled-input-bytes", options.max_pooled_input_bytes,
                 "Bytes the idle input buffers may hold (outside --max-total-bytes); 0 = no pool")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-transport-bytes", options.max_transport_bytes,
                 "gRPC transport memory over all connections (a grpc::ResourceQuota; under "
                 "it new streams get RESOURCE_EXHAUSTED). RSS stays within the idle process "
                 "+ --max-total-bytes + the idle pools (--max-pooled-input-bytes, at most "
                 "--max-total-bytes, and --max-pooled-result-bytes) + this + a fixed "
                 "overhead of 64 MiB (tested) + the engine's scratch for the largest jobs "
                 "(docs/reliability.md)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-streams", options.max_streams,
                 "Open Compress streams in all; more end with RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stream-window-bytes", options.stream_window_bytes,
                 "HTTP/2 receive window of each stream (what an unread stream may buffer)")
      ->capture_default_str()
      ->check(CLI::Range(1 << 16, 1 << 30));
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
  app.add_option("--incomplete-job-timeout", durations.incomplete_job_seconds,
                 "Seconds a job's slabs may take to arrive after its start_job (its memory "
                 "is reserved meanwhile); later, the job fails with DEADLINE_EXCEEDED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--min-receive-rate", options.min_receive_bytes_per_second,
                 "Bytes per second a job must receive while the server waits on its stream, "
                 "less --receive-slack, to keep its reserved memory while another job waits "
                 "for memory; below it the job fails with RESOURCE_EXHAUSTED (0: off)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--receive-slack", options.receive_slack_bytes,
                 "Bytes a job may lag behind --min-receive-rate")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--idle-stream-timeout", durations.idle_stream_seconds,
                 "Seconds a stream may stay idle (nothing read, written or in flight) before "
                 "it is ended with DEADLINE_EXCEEDED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--grace-period,--drain-timeout", durations.grace_seconds,
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
  app.add_option("--max-chunk-size", options.engine_limits.max_chunk_size,
                 "Largest chunk_size a job may ask for (bounds one job's matching work)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 22));
  app.add_option("--max-dim", options.engine_limits.max_dim, "Largest key or value dimension")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

void AddSecurityFlags(CLI::App& app, centroidkv::service::SecurityOptions& security) {
  app.add_option("--tls-cert", security.tls_cert,
                 "Server certificate chain (PEM); serves TLS, with --tls-key")
      ->group("Security");
  app.add_option("--tls-key", security.tls_key, "Private key of --tls-cert (PEM)")
      ->group("Security");
  app.add_option("--tls-client-ca", security.tls_client_ca,
                 "CA bundle (PEM) client certificates must chain to: requires and verifies "
                 "a client certificate (mTLS); the caller is its subject's common name")
      ->group("Security");
  app.add_option("--tls-refresh-seconds", security.tls_refresh_seconds,
                 "How often the certificate files are re-read (rotation without a restart)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group("Security");
  app.add_option("--auth-tokens-file", security.auth_tokens_file,
                 "Lines 'token caller-name': every CentroidKV call must carry "
                 "'authorization: Bearer <token>' (health and reflection need none); "
                 "re-read on SIGHUP")
      ->group("Security");
  app.add_option("--allow-uids", security.allow_uids,
                 "On a unix:// listener: only peers with these uids (SO_PEERCRED), e.g. "
                 "1000,1001")
      ->delimiter(',')
      ->group("Security");
  app.add_option("--max-caller-streams", security.max_caller_streams,
                 "Streams one caller may have open at once; 0 = unlimited")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group("Security");
  app.add_option("--max-caller-jobs", security.max_caller_jobs,
                 "Jobs one caller may have in flight (admitted, not yet answered); 0 = unlimited")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group("Security");
  app.add_option("--max-caller-bytes", security.max_caller_bytes,
                 "Bytes one caller's jobs in flight may hold (input + result); 0 = unlimited")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false))
      ->group("Security");
}

void AddSharedMemoryFlags(CLI::App& app, centroidkv::service::SharedMemoryOptions& shm) {
  app.add_flag("--shared-memory,!--no-shared-memory", shm.enabled,
               "Offer RegisterRegion (jobs by reference to /dev/shm) to clients on a unix:// "
               "listener")
      ->capture_default_str()
      ->group("Shared memory");
  app.add_flag("--shared-memory-over-tcp", shm.allow_tcp,
               "Offer it to TCP clients too (files of --shared-memory-owner-uids or the "
               "server's own uid only)")
      ->group("Shared memory");
  app.add_option("--shared-memory-owner-uids", shm.owner_uids,
                 "Besides the peer's own uid (SO_PEERCRED), whose region files any client "
                 "may register, e.g. 1000,1001")
      ->delimiter(',')
      ->group("Shared memory");
  app.add_option("--shared-memory-dir", shm.shm_dir, "Where region files live")
      ->capture_default_str()
      ->group("Shared memory");
  app.add_option("--max-regions-per-client", shm.max_regions_per_owner,
                 "Regions one client process may have registered")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group("Shared memory");
}

}  // namespace

int main(int argc, char** argv) {
  centroidkv::KeepFreedHeapMemory();  // reuse job buffers instead of faulting them in anew
  ServerOptions options;
  auto seconds = [](std::chrono::milliseconds ms) {
    return std::chrono::duration<double>(ms).count();
  };
  auto milliseconds = [](double s) {
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  };
  DurationFlags durations{seconds(options.grace_period), seconds(options.incomplete_job_timeout),
                          seconds(options.idle_stream_timeout)};
  CLI::App app{"CentroidKV server: compresses LLM KV caches by clustering similar tokens"};
  AddFlags(app, options, durations);
  AddSecurityFlags(app, options.security);
  AddSharedMemoryFlags(app, options.shared_memory);
  CLI11_PARSE(app, argc, argv);
  if (options.metrics_listen == "off") options.metrics_listen.clear();
  options.grace_period = milliseconds(durations.grace_seconds);
  options.incomplete_job_timeout = milliseconds(durations.incomplete_job_seconds);
  options.idle_stream_timeout = milliseconds(durations.idle_stream_seconds);

  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // A unix socket is created group-writable (srwxrwx---): connecting needs write access,
  // so a client running as another user in the socket's group can dial it (Kubernetes:
  // the pod's fsGroup owns the shared emptyDir and joins every container to that group).
  if (options.listen_address.rfind("unix:", 0) == 0) umask(S_IRWXO);
  // Held until the process ends, so that destroying the server is never gRPC's last
  // grpc_shutdown (see the end of main).
  grpc_init();
  auto server = centroidkv::service::Server::Start(options);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  spdlog::info("centroidkv-server listening on {} (this host dials {}), backends: {}, {} threads",
               options.listen_address, (*server)->target(),
               fmt::join((*server)->context().engines->EngineNames(), ","),
               (*server)->context().executor->threads());
  const bool unix_listener = options.listen_address.rfind("unix:", 0) == 0;
  if (options.security.tls_cert.empty() && !unix_listener) {
    spdlog::warn("serving plaintext on TCP {}: anyone who can reach the port can read the KV "
                 "caches sent; use --tls-cert/--tls-key (and --tls-client-ca) across nodes",
                 options.listen_address);
  }
  if (!options.security.auth_tokens_file.empty()) {
    spdlog::info("callers authenticated by bearer token ({}; SIGHUP re-reads it)",
                 options.security.auth_tokens_file);
  }
  if ((*server)->metrics_port() != 0) {
    const bool metrics_tls = !options.security.tls_cert.empty() && !options.metrics_plaintext;
    spdlog::info("metrics: {}://{}/metrics (port {})", metrics_tls ? "https" : "http",
                 options.metrics_listen, (*server)->metrics_port());
  }

  std::thread signal_watcher([&signals, &server] {
    // SIGHUP at any time re-reads the tokens; the first SIGTERM/SIGINT drains.
    const auto next_stop_signal = [&signals, &server] {
      while (true) {
        int signal_number = 0;
        sigwait(&signals, &signal_number);
        if (signal_number != SIGHUP) return signal_number;
        if (absl::Status status = (*server)->ReloadTokens(); status.ok()) {
          spdlog::info("SIGHUP: tokens re-read");
        } else {
          spdlog::error("SIGHUP: {} (the previous tokens stay in force)", status.ToString());
        }
      }
    };
    const int signal_number = next_stop_signal();
    spdlog::info("signal {}: draining (NOT_SERVING, finishing jobs in flight)", signal_number);
    std::thread second([next_stop_signal] {
      const int again = next_stop_signal();
      spdlog::warn("second signal {}: exiting now", again);
      std::_Exit(1);
    });
    second.detach();
    (*server)->Shutdown();
  });
  (*server)->Wait();
  signal_watcher.join();
  server->reset();  // every part of the server stopped and joined; gRPC stays initialised
  spdlog::info("centroidkv-server stopped");
  spdlog::shutdown();
  std::fflush(nullptr);
  // Without gRPC's last grpc_shutdown: in gRPC 1.51 it joins the executor threads
  // (Executor::ShutdownAll), and one of them may be inside grpc_pollset_work's epoll_wait,
  // unkicked, until its next timer, up to ~10 s (seen after a job finished during the
  // drain; the same delay on server destruction: https://github.com/grpc/grpc/issues/41050).
  // Nothing of ours is left to clean up, so the process ends here.
  std::_Exit(0);
}
