// Every knob of the server, with production defaults (Triton-style nested option struct).
// The flags in server_main.cc map one to one onto these fields.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "centroidkv/kernels/engine.h"

namespace centroidkv::service {

// Who may call, over what (docs/security.md). Empty paths = that feature off.
struct SecurityOptions {
  // TLS: the server's certificate chain and key (PEM). Both or neither.
  std::string tls_cert;
  std::string tls_key;
  // mTLS: CA bundle (PEM) that client certificates must chain to; requires tls_cert.
  std::string tls_client_ca;
  // How often the certificate files are re-read (gRPC's file watcher provider), so a
  // rotated Kubernetes secret is served without a restart.
  int32_t tls_refresh_seconds = 60;
  // `token caller-name` lines; every CentroidKV call must then carry
  // `authorization: Bearer <token>`. Re-read on SIGHUP (Server::ReloadTokens).
  std::string auth_tokens_file;
  // On a unix listener: peers (SO_PEERCRED) whose uid is not listed are refused at
  // accept. Empty = every peer that can open the socket.
  std::vector<uint32_t> allow_uids;
  // Per caller identity (0 = unlimited): streams open at once, jobs admitted and not yet
  // answered, and their buffered bytes (input + result footprint). Over them: a stream
  // or job gets RESOURCE_EXHAUSTED; other callers are unaffected.
  int32_t max_caller_streams = 0;
  int32_t max_caller_jobs = 0;
  uint64_t max_caller_bytes = 0;
};

// Same-node shared memory (RegisterRegion; docs/protocol.md "Shared memory").
struct SharedMemoryOptions {
  // Offered to clients on a unix:// listener (the server then accepts on the socket itself
  // to read each peer's SO_PEERCRED). Never on TCP unless allow_tcp.
  bool enabled = true;
  // TCP clients may register regions too (only files of owner_uids, or the server's own
  // uid): for a same-host TCP deployment that trusts its network namespace.
  bool allow_tcp = false;
  // Besides the peer's own uid, whose files any client may register (the allowlist).
  std::vector<uint32_t> owner_uids;
  // Where region files live (POSIX shm names resolve here).
  std::string shm_dir = "/dev/shm";
  // Metadata bounds: regions per owner and in all (each holds a mapping and an fd).
  int32_t max_regions_per_owner = 64;
  int32_t max_regions = 4096;
};

struct ServerOptions {
  // "host:port" (TCP; port 0 picks a free one) or "unix:///path/to.sock".
  std::string listen_address = "0.0.0.0:50051";
  // Prometheus /metrics over HTTP: "host:port" (port 0 picks a free one); empty = off.
  // Off by default so that several servers on one host (tests, demos, replicas) never
  // compete for a port; the images and manifests in deploy/ use "0.0.0.0:9464".
  std::string metrics_listen;
  // With TLS on the gRPC port, /metrics is served over HTTPS with the same certificate
  // (service/metrics_tls.h); true keeps plain HTTP, accepted only on a loopback address.
  bool metrics_plaintext = false;
  // oneTBB worker threads for clustering; 0 = one per hardware thread.
  int32_t worker_threads = 0;

  // Backpressure: bytes a stream may buffer (inputs being received or computed, results
  // not yet written) before the server stops reading it, and the same over all streams.
  // A job's input buffer is taken only once its footprint is reserved, and freed input
  // buffers kept for reuse are capped at max_total_bytes too.
  uint64_t max_stream_bytes = uint64_t{512} << 20;
  uint64_t max_total_bytes = uint64_t{4} << 30;
  // Finished jobs' float32 result buffers kept idle for reuse by later jobs (ResultPool):
  // at most this many, holding at most this many bytes. They are outside max_total_bytes,
  // so the server's buffers total at most max_total_bytes + max_pooled_result_bytes.
  // 0 results = no pool (every job allocates and zero-fills its result afresh).
  int32_t max_pooled_results = 16;
  uint64_t max_pooled_result_bytes = uint64_t{512} << 20;
  // Freed job input buffers kept idle for the next job of the same size (InputPool), at
  // most this many bytes (and never more than max_total_bytes), also outside
  // max_total_bytes. 0 = no pool.
  uint64_t max_pooled_input_bytes = uint64_t{512} << 20;
  // Transport (gRPC) memory, outside the byte budgets above: a grpc::ResourceQuota of
  // max_transport_bytes over all connections (gRPC shrinks windows and refuses allocations
  // under it), at most max_streams streams in all (more end at once with
  // RESOURCE_EXHAUSTED), and each stream's receive window fixed at stream_window_bytes (no
  // BDP growth: an unread stream buffers at most that much). Together: RSS <= idle process
  // + max_total_bytes + min(max_pooled_input_bytes, max_total_bytes) +
  // max_pooled_result_bytes + max_transport_bytes + a fixed overhead (64 MiB,
  // tests/service/server_memory_test.cc) + the cpu engine's reusable scratch for the
  // largest jobs computed together (not budgeted; docs/reliability.md).
  uint64_t max_transport_bytes = uint64_t{256} << 20;
  int32_t max_streams = 1024;
  int32_t stream_window_bytes = 1 << 20;
  // Input bytes of one job (keys + values + counts); larger jobs get RESOURCE_EXHAUSTED.
  uint64_t max_job_bytes = uint64_t{256} << 20;
  // Largest message accepted (slabs are 64 KiB - 1 MiB; this leaves room for headers).
  int32_t max_message_bytes = 8 << 20;
  // Largest slab.data taken (GetInfo's max_slab_bytes; larger slabs fail their job with
  // RESOURCE_EXHAUSTED naming slab.data). At most max_message_bytes - kSlabHeadroom, so
  // that a slab up to twice the limit still reaches the server and gets that named error
  // instead of gRPC's own "larger than max" (see MaxSlabBytes).
  int32_t max_slab_bytes = 4 << 20;
  // Payload size of each result slab the server sends.
  int32_t result_slab_bytes = 1 << 20;

  // Timeouts (StreamWatchdog): a job whose slabs have not all arrived this long after its
  // memory was reserved fails with a DEADLINE_EXCEEDED JobError and its reservation expires
  // (clients that announce jobs and send nothing cannot hold the budget); a stream with
  // nothing read, written or in flight for idle_stream_timeout ends with DEADLINE_EXCEEDED.
  std::chrono::milliseconds incomplete_job_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds idle_stream_timeout{std::chrono::minutes(10)};
  // Earned reservations: while another job waits for the shared budget, a job still
  // receiving its slabs must have received at least
  //   min_receive_bytes_per_second * (time the server's reader waited on its stream since
  //   the job's memory was reserved) - receive_slack_bytes
  // or it fails with a RESOURCE_EXHAUSTED JobError naming its first missing tensor, and its
  // reservation goes to the waiting job (a client that reserves and does not send cannot
  // hold the budget hostage). Only time the reader waits on the client counts: not time the
  // server spends elsewhere, nor time the stream's reading is paused by the server.
  // 0 turns it off.
  uint64_t min_receive_bytes_per_second = uint64_t{16} << 20;
  uint64_t receive_slack_bytes = uint64_t{4} << 20;

  // On SIGTERM: time to finish in-flight jobs before the remaining streams are cancelled.
  // Kubernetes' terminationGracePeriodSeconds must exceed it (deploy/ checks this).
  std::chrono::milliseconds grace_period{std::chrono::seconds(20)};

  EngineLimits engine_limits;
  SecurityOptions security;
  SharedMemoryOptions shared_memory;

  // Tests only (unset in the server binary): called on the worker thread for each job just
  // before the engine runs, after the job's start checks, with its layer index. Lets a test
  // act at a known point inside a job, e.g. truncate the file of a region the job reads.
  std::function<void(uint32_t layer_index)> before_compute_for_testing;
};

// Room for a slab message's other fields (job id, tensor, offset, framing).
inline constexpr int32_t kSlabHeadroom = 1 << 10;

// The slab limit in force: max_slab_bytes, within what a message can carry.
inline int32_t MaxSlabBytes(const ServerOptions& options) {
  return std::max(1, std::min(options.max_slab_bytes, options.max_message_bytes - kSlabHeadroom));
}

}  // namespace centroidkv::service
