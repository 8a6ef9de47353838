// The client half of docs/security.md: channel credentials (plaintext, TLS verifying the
// server against --tls-ca, mTLS with --tls-cert/--tls-key; certificate files re-read by
// gRPC's file watcher), the server-name override, and the interceptor that puts
// `authorization: Bearer <token>` on every call. Used only by OpenChannel (channel.h).
#pragma once

#include <memory>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"

namespace centroidkv::client {

// Plaintext unless options.tls_ca or options.tls_cert is set; errors name the option.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options);
// tls_server_name as the name the server's certificate must carry.
void AddSecurityChannelArgs(const ClientOptions& options, grpc::ChannelArguments* args);
// The bearer token interceptor when options.auth_token is set, else none.
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
MakeAuthInterceptors(const ClientOptions& options);

}  // namespace centroidkv::client
