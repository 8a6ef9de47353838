// ResultEncoder: the header, then each output tensor in the codec's fixed order.
#include "service/result_encoder.h"

#include <utility>
#include <vector>

#include "centroidkv/common/dtype.h"

namespace centroidkv::service {
namespace {

// The wire bytes of one float32 row tensor in `dtype`, made slab by slab.
SlabWriter::CopyBytes RoundedRows(const std::vector<float>& rows, DType dtype) {
  return [&rows, dtype](uint64_t offset, uint64_t length, char* out) {
    const int64_t element = DTypeSize(dtype);
    StoreFromFloats(out, dtype, 0, static_cast<int64_t>(length) / element,
                    rows.data() + static_cast<int64_t>(offset) / element);
  };
}

}  // namespace

std::vector<SlabWriter::Tensor> ResultTensors(const CompressResult& result, DType output_dtype) {
  const ResultBytes bytes = ResultBytesOf(result, output_dtype);
  std::vector<SlabWriter::Tensor> tensors(5);
  tensors[0] = {v1::TENSOR_OUT_KEYS, bytes.keys, nullptr, {}};
  tensors[1] = {v1::TENSOR_OUT_VALUES, bytes.values, nullptr, {}};
  if (IsFp8(result.dtype)) {
    // fp8 codes, quantised above the backend (CompressOptions::result_dtype).
    tensors[0].data = result.fp8_keys.data();
    tensors[1].data = result.fp8_values.data();
  } else if (result.dtype != DType::kFloat32) {
    // The engine wrote the rows in the output dtype (CompressOptions::result_dtype).
    tensors[0].data = result.half_keys.data();
    tensors[1].data = result.half_values.data();
  } else if (output_dtype == DType::kFloat32) {
    tensors[0].data = result.keys.data();
    tensors[1].data = result.values.data();
  } else {
    tensors[0].copy = RoundedRows(result.keys, output_dtype);
    tensors[1].copy = RoundedRows(result.values, output_dtype);
  }
  tensors[2] = {v1::TENSOR_OUT_COUNTS, bytes.counts, result.counts.data(), {}};
  tensors[3] = {v1::TENSOR_OUT_LOG_WEIGHTS, bytes.log_weights, result.log_weights.data(), {}};
  tensors[4] = {v1::TENSOR_ASSIGNMENT, bytes.assignment, result.assignment.data(), {}};
  return tensors;
}

ResultEncoder::ResultEncoder(uint64_t job_id, uint32_t layer_index, DType output_dtype,
                             ResultProvenance provenance, PooledResult result, int32_t slab_bytes,
                             bool in_region)
    : job_id_(job_id),
      layer_index_(layer_index),
      output_dtype_(output_dtype),
      provenance_(std::move(provenance)),
      result_(std::move(result)),
      in_region_(in_region) {
  slabs_.emplace(job_id_, in_region ? std::vector<SlabWriter::Tensor>{}
                                    : ResultTensors(*result_, output_dtype_),
                 slab_bytes);
}

bool ResultEncoder::Next(v1::CompressResponse* message) {
  message->Clear();
  if (result_ == nullptr) return false;
  if (!header_sent_) {
    header_sent_ = true;
    *message->mutable_result() =
        JobResultHeaderToProto(job_id_, layer_index_, *result_, output_dtype_, provenance_);
    message->mutable_result()->set_in_region(in_region_);
  } else {
    slabs_->Next(message->mutable_slab());
  }
  // The result's arrays are not needed once the last slab holds its copy.
  if (slabs_->done()) result_.reset();
  return true;
}

}  // namespace centroidkv::service
