// ReplicaPool: a Client over a set of server replicas. One gRPC channel with the
// `round_robin` load-balancing policy and client-side health checking (a draining replica
// reports NOT_SERVING and gets no new streams) spreads streams over the replicas; each
// stream it opens is a balanced stream that spreads layer jobs over several gRPC streams
// ("lanes"), gives each job a deadline, and resends a job whose replica failed (per-job
// UNAVAILABLE from a draining server, or a stream that broke) on another lane with capped
// exponential backoff and jitter. Every submitted job is returned by Next() exactly once:
// its result or its final error.
//
//   PoolOptions options;
//   options.client.target = "10.0.0.1:50051,10.0.0.2:50051";  // or "dns:///ckv-pool:50051"
//   auto pool = ReplicaPool::Connect(options);
//   auto stream = (*pool)->OpenStream();  // then Submit / Next as with any CompressStream
//
// Thread-safe, like Client.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"

namespace centroidkv::client {

// How a job whose replica failed is resent.
struct RetryPolicy {
  // Sends of one job in all, the first included; a job that fails this often with a
  // retryable error is returned with that error.
  int32_t max_attempts = 5;
  // Wait before resend n (n = 1, 2, ...): min(max_backoff, initial_backoff *
  // multiplier^(n-1)), scaled down by a random factor in [1 - jitter, 1].
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  double multiplier = 2.0;
  double jitter = 0.2;
};

struct PoolOptions {
  // client.target names the replicas: "HOST:PORT,HOST:PORT,..." (IP literals, or host
  // names resolved once at Connect), "ipv4:A:P,B:P", "ipv6:[A]:P,[B]:P",
  // "unix:///a.sock,unix:///b.sock", or one gRPC target such as "dns:///svc:50051" (a
  // Kubernetes headless Service: every pod address, re-resolved by gRPC).
  ClientOptions client;
  // gRPC streams (lanes) per balanced stream; round_robin places each on the next healthy
  // replica. 0: twice the number of addresses named, or 8 for a dns: target.
  int32_t streams = 0;
  // Jobs in flight on one lane; the rest wait in the pool, so a fast replica takes more
  // work and a failed one has little to resend.
  int32_t jobs_per_stream = 8;
  // A lane that has carried this many jobs takes no more and is closed once its jobs are
  // done; its replacement is placed afresh, so replicas that became ready later (or were
  // added) get work. 0: never.
  int32_t stream_job_limit = 64;
  // Deadline of each job, counted from Submit and covering every resend; an expired job is
  // cancelled on its server and returned with DEADLINE_EXCEEDED. Zero: none.
  std::chrono::milliseconds job_deadline{0};
  // Keepalive pings on every connection after this much silence, so that a replica that
  // vanished without closing its connections (a lost node) is noticed within about this
  // plus 10 s and its jobs are resent. Servers accept one ping per 10 s. Zero: off.
  std::chrono::milliseconds keepalive_time{std::chrono::seconds(20)};
  RetryPolicy retry;
};

// What one replica (one peer address) did for this pool.
struct ReplicaStats {
  int64_t results = 0;    // jobs it answered with a result (OK)
  int64_t in_flight = 0;  // jobs sent to it and not yet answered, now
  int64_t resent = 0;     // jobs taken back from it after it failed, to be resent
};

// Counters over every stream of a pool since Connect.
struct PoolStats {
  int64_t submitted = 0;
  int64_t returned_ok = 0;         // delivered with an OK status
  int64_t returned_error = 0;      // delivered with a final error
  int64_t retries = 0;             // resends after a retryable failure
  int64_t job_unavailable = 0;     // per-job UNAVAILABLE answers (a draining replica)
  int64_t streams_opened = 0;
  int64_t streams_broken = 0;      // lanes that ended with an error while carrying jobs
  int64_t isolated = 0;            // jobs resent alone after a stream error naming no job
  int64_t gave_up = 0;             // jobs returned with an error after max_attempts sends
  int64_t deadline_exceeded = 0;   // jobs returned with DEADLINE_EXCEEDED
  std::chrono::milliseconds longest_backoff{0};
  // By peer as gRPC names it ("ipv4:127.0.0.1:50051"); "" for lanes whose peer was not
  // known yet (a lane learns its peer with its first answer).
  std::map<std::string, ReplicaStats> replicas;
};

// A target translated for gRPC: `grpc_target` for the channel and how many addresses it
// names (0: decided by the resolver, e.g. dns:).
struct ReplicaTarget {
  std::string grpc_target;
  int32_t addresses = 0;
};
// Translates PoolOptions::client.target (see there). InvalidArgument for an empty entry,
// a malformed address, a dns: target inside a list, or a list mixing address families.
absl::StatusOr<ReplicaTarget> ParseReplicaTarget(const std::string& target);

// True when `target` names a replica set: a comma list or a dns: target.
bool NamesReplicaSet(const std::string& target);

class ReplicaPool final : public Client {
 public:
  // Opens the channel and, unless options.client.connect_timeout is zero, waits until some
  // replica is ready.
  static absl::StatusOr<std::unique_ptr<ReplicaPool>> Connect(const PoolOptions& options);
  ~ReplicaPool() override;

  // From whichever replica round_robin picks.
  absl::StatusOr<ServerInfo> GetInfo() override;
  // A balanced, retrying stream (see the file comment). Its job ids are its own.
  std::unique_ptr<CompressStream> OpenStream() override;

  PoolStats stats() const;
  const PoolOptions& options() const;

  struct Core;  // shared with the streams; defined in replica_pool.cc

 private:
  explicit ReplicaPool(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

// Client::Connect for one address, ReplicaPool::Connect (default pool options around
// `options`) when the target names a replica set. What the CLI and the worker use.
absl::StatusOr<std::unique_ptr<Client>> ConnectTarget(const ClientOptions& options);

}  // namespace centroidkv::client
