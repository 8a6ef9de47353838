// The CentroidKV gRPC service: Compress (one CompressReactor per stream), GetInfo, and the
// shared memory regions (RegisterRegion / ListRegions / UnregisterRegion, over RegionTable).
// Handlers only translate between the wire and the engine; no algorithm lives here.
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "service/service_context.h"

namespace centroidkv::service {

// Compress is registered raw (grpc::ByteBuffer in and out) so that the reactor parses each
// request itself: gRPC's typed reader reports a message that does not parse exactly like
// the client's half-close (OnReadDone(false)), which would end the stream with OK.
class CentroidKVService final
    : public v1::CentroidKV::WithCallbackMethod_GetInfo<
          v1::CentroidKV::WithCallbackMethod_RegisterRegion<
              v1::CentroidKV::WithCallbackMethod_ListRegions<
                  v1::CentroidKV::WithCallbackMethod_UnregisterRegion<
                      v1::CentroidKV::WithRawCallbackMethod_Compress<
                          v1::CentroidKV::Service>>>>> {
 public:
  explicit CentroidKVService(ServiceContext* context) : context_(context) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Compress(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::GetInfoRequest* request,
                                    v1::GetInfoResponse* response) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;

 private:
  // The caller (Identify) and the owner of its regions (RegionTable::OwnerOf).
  absl::StatusOr<RegionOwner> RegionCaller(grpc::CallbackServerContext* context,
                                           const char* rpc);

  ServiceContext* const context_;
};

}  // namespace centroidkv::service
