// Helpers for the service tests.
#include "tests/service/service_test_util.h"

#include <cstring>
#include <type_traits>

#include "centroidkv/wire/job_codec.h"
#include "centroidkv/wire/wire_convert.h"
#include "gtest/gtest.h"

namespace centroidkv::service::testing {

std::unique_ptr<Server> StartLoopbackServer(ServerOptions options) {
  options.listen_address = "127.0.0.1:0";
  auto server = Server::Start(options);
  if (!server.ok()) return nullptr;
  return *std::move(server);
}

std::unique_ptr<v1::CentroidKV::Stub> MakeStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  return v1::CentroidKV::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

uint64_t KeyBytes(const LayerView& layer) {
  return uint64_t(layer.TotalRows()) * layer.key_dim * DTypeSize(layer.dtype);
}
uint64_t ValueBytes(const LayerView& layer) {
  return uint64_t(layer.TotalRows()) * layer.value_dim * DTypeSize(layer.dtype);
}
uint64_t CountBytes(const LayerView& layer) {
  return layer.counts == nullptr ? 0 : uint64_t(layer.TotalRows()) * 4;
}

v1::CompressRequest StartJobRequest(uint64_t job_id, const LayerView& layer,
                                    const CompressOptions& options, v1::Backend backend) {
  v1::CompressRequest request;
  v1::StartJob* start = request.mutable_start_job();
  start->set_job_id(job_id);
  start->set_num_heads(static_cast<uint32_t>(layer.num_heads));
  start->set_num_tokens(static_cast<uint32_t>(layer.num_tokens));
  start->set_key_dim(static_cast<uint32_t>(layer.key_dim));
  start->set_value_dim(static_cast<uint32_t>(layer.value_dim));
  start->set_dtype(DTypeToProto(layer.dtype));
  start->set_layout(LayoutToProto(layer.layout));
  start->set_has_counts(layer.counts != nullptr);
  *start->mutable_params() = OptionsToProto(options);
  start->set_return_assignment(options.compute_assignment);
  start->set_output_dtype(v1::DTYPE_FLOAT32);
  start->set_backend(backend);
  // The fields after the first wire version only when the job uses them: a job that does
  // not is exactly the message an older client sends.
  if (layer.head_offsets != nullptr) {
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      start->add_head_tokens(static_cast<uint32_t>(layer.HeadTokens(h)));
    }
  }
  if (options.pad_heads) start->set_pad_heads(true);
  if (options.pad_to > 0) start->set_pad_to(static_cast<uint32_t>(options.pad_to));
  if (options.exact_target) start->set_exact_target(true);
  if (options.output_layout == TensorLayout::kTokenMajor) {
    start->set_output_layout(v1::LAYOUT_TOKEN_MAJOR);
  }
  return request;
}

v1::CompressRequest SlabRequest(uint64_t job_id, v1::Tensor tensor, uint64_t byte_offset,
                                const void* data, size_t size) {
  v1::CompressRequest request;
  v1::TensorSlab* slab = request.mutable_slab();
  slab->set_job_id(job_id);
  slab->set_tensor(tensor);
  slab->set_byte_offset(byte_offset);
  slab->set_data(static_cast<const char*>(data), size);
  return request;
}

std::map<uint64_t, CompressResult> DecodeResults(
    const std::vector<v1::CompressResponse>& responses,
    std::map<uint64_t, v1::JobError>* errors) {
  std::map<uint64_t, CompressResult> results;
  for (const v1::CompressResponse& response : responses) {
    if (response.has_error() && errors != nullptr) {
      (*errors)[response.error().job_id()] = response.error();
    }
    if (response.has_result()) {
      const v1::JobResult& header = response.result();
      CompressResult& result = results[header.job_id()];
      ResultProvenance provenance;
      EXPECT_TRUE(JobResultHeaderFromProto(header, &result, &provenance).ok());
      result.dtype = DType::kFloat32;  // the rows are read into the float32 arrays below
    }
    if (response.has_slab()) {
      const v1::TensorSlab& slab = response.slab();
      CompressResult& result = results[slab.job_id()];
      auto append = [&slab](auto* vec) {
        using T = typename std::remove_pointer_t<decltype(vec)>::value_type;
        const size_t first = slab.byte_offset() / sizeof(T);
        vec->resize(first + slab.data().size() / sizeof(T));
        std::memcpy(vec->data() + first, slab.data().data(), slab.data().size());
      };
      switch (slab.tensor()) {
        case v1::TENSOR_OUT_KEYS:
          append(&result.keys);
          break;
        case v1::TENSOR_OUT_VALUES:
          append(&result.values);
          break;
        case v1::TENSOR_OUT_COUNTS:
          append(&result.counts);
          break;
        case v1::TENSOR_ASSIGNMENT:
          append(&result.assignment);
          break;
        default:
          break;
      }
    }
  }
  return results;
}

RawStream::RawStream(v1::CentroidKV::Stub* stub, std::chrono::milliseconds deadline,
                     const std::string& bearer_token) {
  if (deadline.count() > 0) context_.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!bearer_token.empty()) context_.AddMetadata("authorization", "Bearer " + bearer_token);
  stream_ = stub->Compress(&context_);
}

bool RawStream::Write(const v1::CompressRequest& request) { return stream_->Write(request); }

bool RawStream::SendJob(uint64_t job_id, const LayerView& layer, const CompressOptions& options,
                        size_t slab_bytes, v1::Backend backend) {
  return Write(StartJobRequest(job_id, layer, options, backend)) &&
         SendSlabs(job_id, layer, slab_bytes);
}

bool RawStream::SendSlabs(uint64_t job_id, const LayerView& layer, size_t slab_bytes) {
  struct Part {
    v1::Tensor tensor;
    const void* data;
    uint64_t size;
  };
  const Part parts[] = {{v1::TENSOR_KEYS, layer.keys, KeyBytes(layer)},
                        {v1::TENSOR_VALUES, layer.values, ValueBytes(layer)},
                        {v1::TENSOR_COUNTS, layer.counts, CountBytes(layer)}};
  for (const Part& part : parts) {
    for (uint64_t offset = 0; offset < part.size; offset += slab_bytes) {
      const size_t length = static_cast<size_t>(std::min<uint64_t>(slab_bytes, part.size - offset));
      if (!Write(SlabRequest(job_id, part.tensor, offset,
                             static_cast<const char*>(part.data) + offset, length))) {
        return false;
      }
    }
  }
  return true;
}

grpc::Status RawStream::Finish(std::vector<v1::CompressResponse>* responses) {
  stream_->WritesDone();
  v1::CompressResponse response;
  while (stream_->Read(&response)) {
    if (responses != nullptr) responses->push_back(response);
  }
  return stream_->Finish();
}

}  // namespace centroidkv::service::testing
