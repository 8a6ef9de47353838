// Turns one finished job into the messages that carry it back: a JobResult header, then
// slabs of out keys, out values (rounded once to the output dtype), out counts and the
// assignment. Slabs are produced one at a time, as the stream's single write allows, so
// a result is never held twice in memory. The result goes back to its pool as soon as
// the last slab has been copied out of it (before that slab is written).
// Thread-compatible: owned by one stream.
#pragma once

#include <cstdint>
#include <string>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "service/result_pool.h"

namespace centroidkv::service {

struct JobTimings {
  double queue_seconds = 0.0;
  double compute_seconds = 0.0;
};

class ResultEncoder {
 public:
  ResultEncoder(uint64_t job_id, uint32_t layer_index, DType output_dtype, std::string backend,
                JobTimings timings, PooledResult result, int32_t slab_bytes);

  // Fills `message` with the next message of this job; returns false when none is left.
  bool Next(v1::CompressResponse* message);
  uint64_t job_id() const { return job_id_; }
  // Whether the result is still held (false once its last slab has been produced).
  bool holds_result() const { return result_ != nullptr; }

 private:
  // Writes up to slab_bytes_ of `tensor`, continuing from `cursor_`.
  void FillSlab(v1::Tensor tensor, v1::TensorSlab* slab);
  uint64_t TensorBytes(v1::Tensor tensor) const;
  // Moves to the next tensor with bytes left to send; false when none is left.
  bool SeekData();

  uint64_t job_id_;
  uint32_t layer_index_;
  DType output_dtype_;
  std::string backend_;
  JobTimings timings_;
  PooledResult result_;  // released once fully copied out
  int32_t slab_bytes_;

  bool header_sent_ = false;
  int tensor_index_ = 0;  // into the fixed order of output tensors
  uint64_t cursor_ = 0;   // bytes of the current tensor already sent
};

}  // namespace centroidkv::service
