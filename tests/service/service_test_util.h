// Test helpers for the service: a real server on loopback, and a raw synchronous stream
// for writing hand-made (also malformed) protocol messages.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "service/server.h"

namespace centroidkv::service::testing {

// Starts a server on 127.0.0.1:0 with `options` (listen address overridden).
std::unique_ptr<Server> StartLoopbackServer(ServerOptions options = {});

std::unique_ptr<v1::CentroidKV::Stub> MakeStub(const std::string& target);

// A StartJob describing `layer` (dims, dtype, layout, has_counts) with `options`.
v1::CompressRequest StartJobRequest(uint64_t job_id, const LayerView& layer,
                                    const CompressOptions& options,
                                    v1::Backend backend = v1::BACKEND_AUTO);
v1::CompressRequest SlabRequest(uint64_t job_id, v1::Tensor tensor, uint64_t byte_offset,
                                const void* data, size_t size);

// Byte sizes of a layer's key, value and count tensors.
uint64_t KeyBytes(const LayerView& layer);
uint64_t ValueBytes(const LayerView& layer);
uint64_t CountBytes(const LayerView& layer);

// Reassembles float32 results from a stream's responses, by job id. Job errors go to
// *errors (job id -> JobError) when given.
std::map<uint64_t, CompressResult> DecodeResults(
    const std::vector<v1::CompressResponse>& responses,
    std::map<uint64_t, v1::JobError>* errors = nullptr);

class RawStream {
 public:
  // `deadline` > 0 sets the stream's deadline (it must be set before the call starts);
  // a `bearer_token` is sent as `authorization: Bearer <token>`.
  explicit RawStream(v1::CentroidKV::Stub* stub,
                     std::chrono::milliseconds deadline = std::chrono::milliseconds(0),
                     const std::string& bearer_token = "");
  // False once the server has ended the stream.
  bool Write(const v1::CompressRequest& request);
  // StartJob, then every tensor in slabs of `slab_bytes`. False if a write failed.
  bool SendJob(uint64_t job_id, const LayerView& layer, const CompressOptions& options,
               size_t slab_bytes = 64 << 10, v1::Backend backend = v1::BACKEND_AUTO);
  // Every tensor of an announced job in slabs of `slab_bytes`. False if a write failed.
  bool SendSlabs(uint64_t job_id, const LayerView& layer, size_t slab_bytes = 64 << 10);
  // Half-closes the sending side.
  bool WritesDone() { return stream_->WritesDone(); }
  // Half-closes, reads every response until the end, and returns the final status.
  grpc::Status Finish(std::vector<v1::CompressResponse>* responses = nullptr);
  grpc::ClientContext& context() { return context_; }
  bool Read(v1::CompressResponse* response) { return stream_->Read(response); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::CompressRequest, v1::CompressResponse>> stream_;
};

}  // namespace centroidkv::service::testing
