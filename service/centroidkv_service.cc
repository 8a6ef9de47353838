// CentroidKVService: stream creation (after the caller gate) and the GetInfo description
// of this server.
#include "service/centroidkv_service.h"

#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/wire/wire_convert.h"
#include "service/compress_reactor.h"

#ifndef CKV_VERSION
#define CKV_VERSION "unknown"
#endif

namespace centroidkv::service {
namespace {

// A stream refused before anything of it is read (no or a bad token, over the caller's
// stream limit): it ends at once with `status`.
class RefusedStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

void RegionToProto(const RegionInfo& region, v1::Region* out) {
  out->set_region_id(region.region_id);
  out->set_name(region.name);
  out->set_offset(region.offset);
  out->set_size(region.size);
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CentroidKVService::Compress(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<std::unique_ptr<CallerStream>> caller = context_->callers.OpenStream(*context);
  if (!caller.ok()) {
    context_->metrics.Error(static_cast<int>(caller.status().code()), "stream");
    return new RefusedStream(ToGrpcStatus(caller.status()));
  }
  // The owner whose regions this stream's jobs may name; none on TCP (or with it off).
  std::optional<RegionOwner> regions;
  if (absl::StatusOr<RegionOwner> owner =
          context_->regions.OwnerOf(context->peer(), (*caller)->caller());
      owner.ok()) {
    regions = *std::move(owner);
  }
  return new CompressReactor(context_, *std::move(caller), std::move(regions));
}

grpc::ServerUnaryReactor* CentroidKVService::GetInfo(grpc::CallbackServerContext* context,
                                                     const v1::GetInfoRequest* /*request*/,
                                                     v1::GetInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> caller = context_->callers.Identify(*context, "GetInfo");
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const ServerOptions& options = context_->options;
  response->set_version(CKV_VERSION);
  for (const std::string& name : context_->engines->EngineNames()) {
    response->add_backends(name);
  }
  for (const DeviceInfo& device : context_->engines->Devices()) {
    response->add_devices(device.name);
    v1::Device* out = response->add_device_info();
    out->set_backend(device.backend);
    out->set_name(device.name);
    out->set_memory_bytes(static_cast<uint64_t>(device.memory_bytes));
    out->set_compute_major(static_cast<uint32_t>(device.compute_major));
    out->set_compute_minor(static_cast<uint32_t>(device.compute_minor));
  }
  if (auto engine = context_->engines->Select(BackendKind::kAuto); engine.ok()) {
    response->set_default_backend(std::string((*engine)->name()));
  }
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_heads(static_cast<uint32_t>(options.engine_limits.max_heads));
  limits->set_max_tokens(static_cast<uint32_t>(options.engine_limits.max_tokens));
  limits->set_max_dim(static_cast<uint32_t>(options.engine_limits.max_dim));
  limits->set_max_chunk_size(static_cast<uint32_t>(options.engine_limits.max_chunk_size));
  limits->set_max_job_bytes(options.max_job_bytes);
  limits->set_max_stream_bytes(options.max_stream_bytes);
  limits->set_max_total_bytes(options.max_total_bytes);
  limits->set_max_message_bytes(static_cast<uint32_t>(options.max_message_bytes));
  limits->set_max_slab_bytes(static_cast<uint32_t>(MaxSlabBytes(options)));
  limits->set_result_slab_bytes(static_cast<uint32_t>(options.result_slab_bytes));
  *response->mutable_defaults() = OptionsToProto(CompressOptions{});
  response->add_features("scored");
  response->add_features("fitted");
  const CompressOptions defaults;
  response->mutable_selection_defaults()->set_centroid_share(defaults.centroid_share);
  response->mutable_selection_defaults()->set_max_cluster_size(
      static_cast<uint32_t>(defaults.max_cluster_size));
  response->mutable_fit_defaults()->set_log_weight_bound(defaults.fit.log_weight_bound);
  response->mutable_fit_defaults()->set_block_tokens(
      static_cast<uint32_t>(defaults.fit.block_tokens));
  response->mutable_fit_defaults()->set_fit_values(defaults.fit.fit_values);
  response->set_worker_threads(static_cast<uint32_t>(context_->executor->threads()));
  response->set_shared_memory(context_->regions.OwnerOf(context->peer(), *caller).ok());

  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<RegionOwner> CentroidKVService::RegionCaller(grpc::CallbackServerContext* context,
                                                            const char* rpc) {
  absl::StatusOr<std::string> caller = context_->callers.Identify(*context, rpc);
  if (!caller.ok()) return caller.status();
  return context_->regions.OwnerOf(context->peer(), *caller);
}

grpc::ServerUnaryReactor* CentroidKVService::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<RegionOwner> owner = RegionCaller(context, "RegisterRegion");
  if (!owner.ok()) {
    reactor->Finish(ToGrpcStatus(owner.status()));
    return reactor;
  }
  absl::StatusOr<RegionInfo> region =
      context_->regions.Register(*owner, request->name(), request->offset(), request->size());
  if (!region.ok()) {
    reactor->Finish(ToGrpcStatus(region.status()));
    return reactor;
  }
  RegionToProto(*region, response->mutable_region());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CentroidKVService::ListRegions(grpc::CallbackServerContext* context,
                                                         const v1::ListRegionsRequest* /*request*/,
                                                         v1::ListRegionsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<RegionOwner> owner = RegionCaller(context, "ListRegions");
  if (!owner.ok()) {
    reactor->Finish(ToGrpcStatus(owner.status()));
    return reactor;
  }
  for (const RegionInfo& region : context_->regions.List(*owner)) {
    RegionToProto(region, response->add_regions());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CentroidKVService::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<RegionOwner> owner = RegionCaller(context, "UnregisterRegion");
  if (!owner.ok()) {
    reactor->Finish(ToGrpcStatus(owner.status()));
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(context_->regions.Unregister(*owner, request->region_id())));
  return reactor;
}

}  // namespace centroidkv::service
