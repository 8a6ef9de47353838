// ResultEncoder: header first, then each output tensor in fixed order, sliced into slabs.
#include "service/result_encoder.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "centroidkv/common/dtype.h"
#include "centroidkv/wire/wire_convert.h"

namespace centroidkv::service {
namespace {
constexpr v1::Tensor kOutputOrder[] = {v1::TENSOR_OUT_KEYS, v1::TENSOR_OUT_VALUES,
                                       v1::TENSOR_OUT_COUNTS, v1::TENSOR_ASSIGNMENT};
}  // namespace

ResultEncoder::ResultEncoder(uint64_t job_id, uint32_t layer_index, DType output_dtype,
                             std::string backend, JobTimings timings, PooledResult result,
                             int32_t slab_bytes)
    : job_id_(job_id),
      layer_index_(layer_index),
      output_dtype_(output_dtype),
      backend_(std::move(backend)),
      timings_(timings),
      result_(std::move(result)),
      // Whole elements per slab, whatever the element size.
      slab_bytes_(std::max(8, slab_bytes - slab_bytes % 8)) {}

uint64_t ResultEncoder::TensorBytes(v1::Tensor tensor) const {
  switch (tensor) {
    case v1::TENSOR_OUT_KEYS:
      return result_->key_elements() * DTypeSize(output_dtype_);
    case v1::TENSOR_OUT_VALUES:
      return result_->value_elements() * DTypeSize(output_dtype_);
    case v1::TENSOR_OUT_COUNTS:
      return result_->counts.size() * sizeof(uint32_t);
    case v1::TENSOR_ASSIGNMENT:
      return result_->assignment.size() * sizeof(int32_t);
    default:
      return 0;
  }
}

bool ResultEncoder::SeekData() {
  while (tensor_index_ < 4 && cursor_ >= TensorBytes(kOutputOrder[tensor_index_])) {
    ++tensor_index_;
    cursor_ = 0;
  }
  return tensor_index_ < 4;
}

bool ResultEncoder::Next(v1::CompressResponse* message) {
  message->Clear();
  if (result_ == nullptr) return false;
  if (!header_sent_) {
    header_sent_ = true;
    v1::JobResult* header = message->mutable_result();
    header->set_job_id(job_id_);
    header->set_layer_index(layer_index_);
    header->set_num_heads(static_cast<uint32_t>(result_->num_heads));
    header->set_num_tokens(static_cast<uint32_t>(result_->num_tokens));
    header->set_key_dim(static_cast<uint32_t>(result_->key_dim));
    header->set_value_dim(static_cast<uint32_t>(result_->value_dim));
    header->set_dtype(DTypeToProto(output_dtype_));
    for (int64_t offset : result_->offsets) header->add_offsets(offset);
    header->set_has_assignment(!result_->assignment.empty());
    header->set_out_keys_bytes(TensorBytes(v1::TENSOR_OUT_KEYS));
    header->set_out_values_bytes(TensorBytes(v1::TENSOR_OUT_VALUES));
    header->set_out_counts_bytes(TensorBytes(v1::TENSOR_OUT_COUNTS));
    header->set_assignment_bytes(TensorBytes(v1::TENSOR_ASSIGNMENT));
    header->set_backend(backend_);
    header->set_passes_run(static_cast<uint32_t>(result_->passes_run));
    header->set_compute_seconds(timings_.compute_seconds);
    header->set_queue_seconds(timings_.queue_seconds);
    header->set_target_tokens(static_cast<uint64_t>(result_->target_length));
    header->set_target_reached(result_->target_reached);
    for (int32_t entries : result_->head_entries) {
      header->add_head_entries(static_cast<uint32_t>(entries));
    }
    for (uint64_t tokens : result_->head_input_tokens) header->add_head_input_tokens(tokens);
    for (StopReason reason : result_->stop_reasons) {
      header->add_stop_reasons(StopReasonToProto(reason));
    }
    for (int32_t tokens : result_->head_tokens) {
      header->add_head_tokens(static_cast<uint32_t>(tokens));
    }
    header->set_padded_length(static_cast<uint32_t>(result_->padded_length));
    header->set_layout(LayoutToProto(result_->layout));
  } else {
    FillSlab(kOutputOrder[tensor_index_], message->mutable_slab());
  }
  // The float32 arrays are not needed once the last slab holds its copy.
  if (!SeekData()) result_.reset();
  return true;
}

void ResultEncoder::FillSlab(v1::Tensor tensor, v1::TensorSlab* slab) {
  const uint64_t total = TensorBytes(tensor);
  const uint64_t length = std::min<uint64_t>(slab_bytes_, total - cursor_);
  slab->set_job_id(job_id_);
  slab->set_tensor(tensor);
  slab->set_byte_offset(cursor_);
  std::string* data = slab->mutable_data();
  data->resize(length);
  const bool keys = tensor == v1::TENSOR_OUT_KEYS;
  if ((keys || tensor == v1::TENSOR_OUT_VALUES) && result_->dtype != DType::kFloat32) {
    // The engine wrote the rows in the output dtype (CompressOptions::result_dtype).
    const std::vector<uint16_t>& source = keys ? result_->half_keys : result_->half_values;
    std::memcpy(data->data(), reinterpret_cast<const uint8_t*>(source.data()) + cursor_, length);
  } else if (keys || tensor == v1::TENSOR_OUT_VALUES) {
    const std::vector<float>& source = keys ? result_->keys : result_->values;
    const int64_t element_size = DTypeSize(output_dtype_);
    const int64_t first = static_cast<int64_t>(cursor_) / element_size;
    const int64_t count = static_cast<int64_t>(length) / element_size;
    StoreFromFloats(data->data(), output_dtype_, 0, count, source.data() + first);
  } else {
    const uint8_t* source =
        tensor == v1::TENSOR_OUT_COUNTS
            ? reinterpret_cast<const uint8_t*>(result_->counts.data())
            : reinterpret_cast<const uint8_t*>(result_->assignment.data());
    std::memcpy(data->data(), source + cursor_, length);
  }
  cursor_ += length;
}

}  // namespace centroidkv::service
