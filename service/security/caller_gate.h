// Who is calling: the identity of each CentroidKV RPC, and the gate every Compress stream
// and GetInfo call passes before anything of it is read. The identity is the caller name of
// the call's bearer token when --auth-tokens-file is set (a missing or unknown token is
// UNAUTHENTICATED), else the client certificate's common name with mTLS, else "uid:N" for
// a unix peer seen by UnixPeerListener, else "anonymous". Health and reflection are other
// services and never pass here (probes need no token).
// Thread-safe; the token table can be swapped while calls run (SIGHUP).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "service/security/caller_limits.h"
#include "service/security/token_table.h"
#include "service/service_metrics.h"

namespace centroidkv::service {

class CallerGate {
 public:
  // `metrics` must outlive the gate.
  CallerGate(const CallerLimits& limits, ServiceMetrics* metrics)
      : registry_(limits), metrics_(metrics) {}

  // Requires tokens on every call from now on.
  void SetTokens(std::unique_ptr<TokenTable> tokens);
  // Re-reads the tokens file (SIGHUP); FAILED_PRECONDITION when no file is configured.
  absl::Status ReloadTokens();
  // Maps a gRPC peer string ("fd:N") to the uid of a unix peer, for identities.
  void SetPeerUidLookup(std::function<std::optional<uint32_t>(const std::string&)> lookup);

  // The caller of one call, or UNAUTHENTICATED (counted as a rejection).
  absl::StatusOr<std::string> Identify(const grpc::CallbackServerContext& context,
                                       const char* rpc);
  // Identify, then a stream slot of that caller (RESOURCE_EXHAUSTED over its limit).
  absl::StatusOr<std::unique_ptr<CallerStream>> OpenStream(
      const grpc::CallbackServerContext& context);
  // A job refused by the caller's limits, for /metrics.
  void JobRejected(const std::string& caller) { metrics_->CallerRejected(caller, "job_limit"); }

  CallerRegistry& registry() { return registry_; }
  const CallerRegistry& registry() const { return registry_; }

 private:
  std::optional<std::string> PeerIdentity(const grpc::CallbackServerContext& context) const;

  CallerRegistry registry_;
  ServiceMetrics* const metrics_;
  mutable std::mutex mu_;
  std::shared_ptr<TokenTable> tokens_;  // null: no token required
  std::function<std::optional<uint32_t>(const std::string&)> peer_uid_;
};

}  // namespace centroidkv::service
