// Turns one finished job into the messages that carry it back: a JobResult header, then
// slabs of out keys, out values (rounded once to the output dtype), out counts and the
// assignment. Slabs are produced one at a time, as the stream's single write allows, so
// a result is never held twice in memory.
// Thread-compatible: owned by one stream.
#pragma once

#include <cstdint>
#include <string>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv::service {

struct JobTimings {
  double queue_seconds = 0.0;
  double compute_seconds = 0.0;
};

class ResultEncoder {
 public:
  ResultEncoder(uint64_t job_id, uint32_t layer_index, DType output_dtype, std::string backend,
                JobTimings timings, CompressResult result, int32_t slab_bytes);

  // Fills `message` with the next message of this job; returns false when none is left.
  bool Next(v1::CompressResponse* message);
  uint64_t job_id() const { return job_id_; }

 private:
  // Writes up to slab_bytes_ of `tensor`, continuing from `cursor_`.
  void FillSlab(v1::Tensor tensor, v1::TensorSlab* slab);
  uint64_t TensorBytes(v1::Tensor tensor) const;

  uint64_t job_id_;
  uint32_t layer_index_;
  DType output_dtype_;
  std::string backend_;
  JobTimings timings_;
  CompressResult result_;
  int32_t slab_bytes_;

  bool header_sent_ = false;
  int tensor_index_ = 0;  // into the fixed order of output tensors
  uint64_t cursor_ = 0;   // bytes of the current tensor already sent
};

}  // namespace centroidkv::service
