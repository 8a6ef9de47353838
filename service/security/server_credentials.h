// The credentials the gRPC port is served with: plaintext, TLS (--tls-cert/--tls-key) or
// mTLS (plus --tls-client-ca: a client certificate chaining to that CA is required and
// verified). Certificates come from gRPC's FileWatcherCertificateProvider, which re-reads
// the files every tls_refresh_seconds, so a rotated secret is served without a restart.
#pragma once

#include <memory>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "service/server_options.h"

namespace centroidkv::service {

// Checks the flags (both cert and key, files readable, a client CA only with a
// certificate) and builds the credentials; errors name the flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options);

// True when the options ask for TLS on the gRPC port.
inline bool UsesTls(const SecurityOptions& options) { return !options.tls_cert.empty(); }

}  // namespace centroidkv::service
