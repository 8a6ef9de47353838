// The CentroidKV gRPC service: Compress (one CompressReactor per stream) and GetInfo.
// Handlers only translate between the wire and the engine; no algorithm lives here.
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "service/service_context.h"

namespace centroidkv::service {

class CentroidKVService final : public v1::CentroidKV::CallbackService {
 public:
  explicit CentroidKVService(ServiceContext* context) : context_(context) {}

  grpc::ServerBidiReactor<v1::CompressRequest, v1::CompressResponse>* Compress(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::GetInfoRequest* request,
                                    v1::GetInfoResponse* response) override;

 private:
  ServiceContext* const context_;
};

}  // namespace centroidkv::service
