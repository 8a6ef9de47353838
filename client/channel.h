// Channel set-up and GetInfo, shared by Client (one address) and ReplicaPool (a replica set).
#pragma once

#include <chrono>
#include <memory>
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

}  // namespace centroidkv::client
