// Channel set-up and GetInfo, shared by Client (one address) and ReplicaPool (a replica set).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"

namespace centroidkv::client {

// Checks `options` (slab size against the message limit), creates a channel to
// `grpc_target` with the message limits, `service_config_json` as its default service
// config ("" for none) and keepalive pings after `keepalive_time` of silence (zero: none),
// and waits up to options.connect_timeout for it to become ready.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const ClientOptions& options, const std::string& grpc_target,
    const std::string& service_config_json,
    std::chrono::milliseconds keepalive_time = std::chrono::milliseconds(0));

// The GetInfo RPC, with a 30 s deadline.
absl::StatusOr<ServerInfo> FetchServerInfo(v1::CentroidKV::Stub& stub);

// `options` with slab_bytes within the server's GetInfo max_slab_bytes (SlabPayloadBytes),
// asked over `stub` on the first call only; a server that does not answer (or predates the
// field) leaves slab_bytes as it is. Used by Client and ReplicaPool for every stream they open.
class SlabSizing {
 public:
  ClientOptions Sized(v1::CentroidKV::Stub& stub, const ClientOptions& options);

 private:
  std::once_flag asked_;
  int32_t server_limit_ = 0;  // 0: none stated
};

}  // namespace centroidkv::client
