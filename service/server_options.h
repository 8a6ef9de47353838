// Every knob of the server, with production defaults (Triton-style nested option struct).
// The flags in server_main.cc map one to one onto these fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "centroidkv/kernels/engine.h"

namespace centroidkv::service {

struct ServerOptions {
  // "host:port" (TCP; port 0 picks a free one) or "unix:///path/to.sock".
  std::string listen_address = "0.0.0.0:50051";
  // Prometheus /metrics over HTTP: "host:port" (port 0 picks a free one); empty = off.
  // Off by default so that several servers on one host (tests, demos, replicas) never
  // compete for a port; the images and manifests in deploy/ use "0.0.0.0:9464".
  std::string metrics_listen;
  // oneTBB worker threads for clustering; 0 = one per hardware thread.
  int32_t worker_threads = 0;

  // Backpressure: bytes a stream may buffer (inputs being received or computed, results
  // not yet written) before the server stops reading it, and the same over all streams.
  uint64_t max_stream_bytes = uint64_t{512} << 20;
  uint64_t max_total_bytes = uint64_t{4} << 30;
  // Finished jobs' float32 result buffers kept idle for reuse by later jobs (ResultPool):
  // at most this many, holding at most this many bytes. They are outside max_total_bytes,
  // so the server's buffers total at most max_total_bytes + max_pooled_result_bytes.
  // 0 results = no pool (every job allocates and zero-fills its result afresh).
  int32_t max_pooled_results = 16;
  uint64_t max_pooled_result_bytes = uint64_t{512} << 20;
  // Input bytes of one job (keys + values + counts); larger jobs get RESOURCE_EXHAUSTED.
  uint64_t max_job_bytes = uint64_t{256} << 20;
  // Largest message accepted (slabs are 64 KiB - 1 MiB; this leaves room for headers).
  int32_t max_message_bytes = 8 << 20;
  // Payload size of each result slab the server sends.
  int32_t result_slab_bytes = 1 << 20;

  // On SIGTERM: time to finish in-flight jobs before the remaining streams are cancelled.
  // Kubernetes' terminationGracePeriodSeconds must exceed it (deploy/ checks this).
  std::chrono::milliseconds grace_period{std::chrono::seconds(20)};

  EngineLimits engine_limits;
};

}  // namespace centroidkv::service
