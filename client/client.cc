// Client: channel set-up, GetInfo, and the blocking CompressLayers convenience.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "centroidkv/client/client.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/wire/slab_codec.h"
#include "client/channel.h"
#include "client/channel_security.h"
#include "client/compress_stream_impl.h"

namespace centroidkv::client {
namespace {

Client::Region RegionFromProto(const v1::Region& region) {
  return Client::Region{region.region_id(), region.name(), region.offset(), region.size()};
}

class GrpcClient final : public Client {
 public:
  GrpcClient(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel)
      : options_(options),
        channel_(std::move(channel)),
        stub_(v1::CentroidKV::NewStub(channel_)) {}

  absl::StatusOr<ServerInfo> GetInfo() override { return FetchServerInfo(*stub_); }

  std::unique_ptr<CompressStream> OpenStream() override {
    return std::make_unique<GrpcCompressStream>(stub_.get(), slab_sizing_.Sized(*stub_, options_));
  }

  absl::StatusOr<Region> RegisterRegion(const std::string& name, uint64_t offset,
                                        uint64_t size) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::RegisterRegionRequest request;
    request.set_name(name);
    request.set_offset(offset);
    request.set_size(size);
    v1::RegisterRegionResponse response;
    grpc::Status status = stub_->RegisterRegion(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return RegionFromProto(response.region());
  }

  absl::Status UnregisterRegion(uint64_t region_id) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::UnregisterRegionRequest request;
    request.set_region_id(region_id);
    v1::UnregisterRegionResponse response;
    return FromGrpcStatus(stub_->UnregisterRegion(&context, request, &response));
  }

  absl::StatusOr<std::vector<Region>> ListRegions() override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ListRegionsRequest request;
    v1::ListRegionsResponse response;
    grpc::Status status = stub_->ListRegions(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    std::vector<Region> regions;
    for (const v1::Region& region : response.regions()) {
      regions.push_back(RegionFromProto(region));
    }
    return regions;
  }

 private:
  SlabSizing slab_sizing_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CentroidKV::Stub> stub_;
};

}  // namespace

ClientOptions SlabSizing::Sized(v1::CentroidKV::Stub& stub, const ClientOptions& options) {
  std::call_once(asked_, [this, &stub] {
    absl::StatusOr<ServerInfo> info = FetchServerInfo(stub);
    if (info.ok()) server_limit_ = info->max_slab_bytes;
  });
  ClientOptions sized = options;
  sized.slab_bytes = SlabPayloadBytes(options.slab_bytes, server_limit_);
  return sized;
}

absl::StatusOr<ServerInfo> FetchServerInfo(v1::CentroidKV::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetInfoRequest request;
  v1::GetInfoResponse response;
  grpc::Status status = stub.GetInfo(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  ServerInfo info;
  info.version = response.version();
  info.backends.assign(response.backends().begin(), response.backends().end());
  info.default_backend = response.default_backend();
  info.devices.assign(response.devices().begin(), response.devices().end());
  info.worker_threads = static_cast<int32_t>(response.worker_threads());
  info.shared_memory = response.shared_memory();
  for (const v1::Device& device : response.device_info()) {
    info.device_info.push_back({device.backend(), device.name(),
                                static_cast<int64_t>(device.memory_bytes()),
                                static_cast<int32_t>(device.compute_major()),
                                static_cast<int32_t>(device.compute_minor())});
  }
  info.max_job_bytes = static_cast<int64_t>(response.limits().max_job_bytes());
  info.max_stream_bytes = static_cast<int64_t>(response.limits().max_stream_bytes());
  info.max_total_bytes = static_cast<int64_t>(response.limits().max_total_bytes());
  info.max_message_bytes = static_cast<int32_t>(response.limits().max_message_bytes());
  info.max_slab_bytes = static_cast<int32_t>(response.limits().max_slab_bytes());
  info.max_tokens = static_cast<int32_t>(response.limits().max_tokens());
  info.max_heads = static_cast<int32_t>(response.limits().max_heads());
  info.max_dim = static_cast<int32_t>(response.limits().max_dim());
  info.max_chunk_size = static_cast<int32_t>(response.limits().max_chunk_size());
  return info;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const ClientOptions& options, const std::string& grpc_target,
    const std::string& service_config_json, std::chrono::milliseconds keepalive_time) {
  if (options.slab_bytes < 1024 || options.slab_bytes > options.max_message_bytes - 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab_bytes must be in [1024, max_message_bytes - 1024] (got ", options.slab_bytes, ")"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (!service_config_json.empty()) args.SetServiceConfigJSON(service_config_json);
  if (keepalive_time.count() > 0) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(keepalive_time.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10 * 1000);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // also on idle streams
  }
  CKV_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                       MakeChannelCredentials(options));
  AddSecurityChannelArgs(options, &args);
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      grpc_target, credentials, args, MakeAuthInterceptors(options));
  if (options.connect_timeout.count() > 0 &&
      !channel->WaitForConnected(std::chrono::system_clock::now() + options.connect_timeout)) {
    return absl::UnavailableError(absl::StrCat("server: cannot connect to '", options.target,
                                               "' within ", options.connect_timeout.count(),
                                               " ms"));
  }
  return channel;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  CKV_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                       OpenChannel(options, options.target, ""));
  return std::unique_ptr<Client>(new GrpcClient(options, std::move(channel)));
}

absl::StatusOr<Client::Region> Client::RegisterRegion(const std::string& /*name*/,
                                                      uint64_t /*offset*/, uint64_t /*size*/) {
  return absl::UnimplementedError("shared memory: this client does not register regions");
}

absl::Status Client::UnregisterRegion(uint64_t /*region_id*/) {
  return absl::UnimplementedError("shared memory: this client does not register regions");
}

absl::StatusOr<std::vector<Client::Region>> Client::ListRegions() {
  return absl::UnimplementedError("shared memory: this client does not register regions");
}

absl::StatusOr<std::vector<LayerResult>> Client::CompressLayers(
    const std::vector<LayerJob>& jobs) {
  std::unique_ptr<CompressStream> stream = OpenStream();
  std::map<uint64_t, size_t> position;
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<uint64_t> id = stream->Submit(jobs[i]);
    if (!id.ok()) {
      // The stream broke while submitting; its own status says why.
      absl::Status closed = stream->Close();
      return closed.ok() ? id.status() : closed;
    }
    position[*id] = i;
  }
  std::vector<LayerResult> results(jobs.size());
  for (size_t received = 0; received < jobs.size(); ++received) {
    absl::StatusOr<LayerResult> result = stream->Next();
    if (!result.ok()) return result.status();
    results[position[result->job_id]] = *std::move(result);
  }
  absl::Status closed = stream->Close();
  if (!closed.ok()) return closed;
  return results;
}

}  // namespace centroidkv::client
